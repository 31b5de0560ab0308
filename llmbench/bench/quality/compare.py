"""How far a variant's next-token distributions are from the baseline's, in numbers.

Both configurations are teacher-forced along the baseline's greedy continuation of the same prompts, so
position i of prompt p is the same context in both. Per position:

- ``KL(base || variant) = sum_v p_base(v) (log p_base(v) - log p_variant(v))`` over the whole vocabulary,
  in float64 (a vocabulary truncated to its top-k plus a tail mass would not give this number);
- top-1 agreement: whether both put their largest probability on the same token.

Per prompt, from free-running greedy generation (no forcing): the first position where the variant's
tokens leave the baseline's, or none. A summary pools positions (mean, p99 and max KL, agreement), with
95% intervals of the means: Student-t over the prompts' own means (positions of one prompt are not independent).

What these numbers mean depends on the weights. A preset's random weights give near-uniform
distributions: KL is tiny and top-1 agreement is dominated by near-ties, so they show the size of a
variant's numerical error, not what it does to a trained model's outputs; only a real checkpoint (and
its perplexity on real text) speaks to quality.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from llmbench.bench.stats import mean_interval

RANDOM_WEIGHTS_NOTE = (
    "random weights (a preset): next-token distributions are near-uniform, so KL is tiny and top-1 "
    "agreement is decided by near-ties; these rows measure each variant's numerical error, not model quality"
)


def position_kl(base: torch.Tensor, variant: torch.Tensor) -> np.ndarray:
    """KL(base || variant) per position from log-probabilities (T, V) -> (T,), in float64."""
    lb, lv = base.double(), variant.double()
    p = lb.exp()
    terms = torch.where(p > 0, p * (lb - lv), torch.zeros_like(p))  # 0 log 0 = 0
    return terms.sum(dim=-1).clamp_min(0.0).numpy()  # rounding can leave -1e-17 where they are equal


def first_divergence(base: list[int], variant: list[int]) -> int | None:
    """The first position where two greedy outputs differ, None when they agree throughout."""
    for i, (a, b) in enumerate(zip(base, variant, strict=False)):
        if a != b:
            return i
    return None if len(base) == len(variant) else min(len(base), len(variant))


def summarise(
    base: list[torch.Tensor],
    variant: list[torch.Tensor],
    base_greedy: list[list[int]],
    variant_greedy: list[list[int]],
) -> dict[str, Any]:
    """Quality figures of one variant: per-prompt (T, V) log-probabilities of both, and greedy outputs."""
    kls = [position_kl(b, v) for b, v in zip(base, variant, strict=True)]
    agree = [(b.argmax(-1) == v.argmax(-1)).numpy() for b, v in zip(base, variant, strict=True)]
    pooled = np.concatenate(kls)
    kl_ci = mean_interval([k.mean() for k in kls], floor=0.0)
    top1_ci = mean_interval([a.mean() for a in agree])
    firsts = [first_divergence(b, v) for b, v in zip(base_greedy, variant_greedy, strict=True)]
    diverged = [f for f in firsts if f is not None]
    return {
        "positions": int(pooled.size),
        "kl_mean": float(pooled.mean()),
        "kl_mean_ci": [kl_ci.low, kl_ci.high],
        "kl_p99": float(np.percentile(pooled, 99)),
        "kl_max": float(pooled.max()),
        "top1_agreement": float(np.concatenate(agree).mean()),
        "top1_agreement_ci": [top1_ci.low, top1_ci.high],
        "greedy_identical": len(firsts) - len(diverged),
        "greedy_prompts": len(firsts),
        "first_divergence": firsts,
        "first_divergence_min": min(diverged) if diverged else None,
        "first_divergence_median": float(np.median(diverged)) if diverged else None,
    }


def perplexity(logprobs: list[list[float]]) -> float:
    """exp of the mean negative log-probability over every scored token."""
    flat = [lp for window in logprobs for lp in window]
    return math.exp(-sum(flat) / len(flat)) if flat else math.nan
