"""Hardware-relative figures per engine step, from counts the engine reports and datasheet peaks.

decode memory-bandwidth utilisation (pure decode steps only):
    (weight_bytes + sum of context lengths x kv_bytes_per_token) / step time / (peak bandwidth x tp)
    -- every weight and every cached K/V of the batch is read once per decode step.
prefill FLOP utilisation (pure prefill steps only):
    2 x num_params x prefill tokens / step time / (peak bf16 FLOP/s x tp)
    -- the matmul FLOPs; attention's share is left out, so this is a slight underestimate.
Without a known peak (CPU, unknown GPU) both are NaN and the summary says "unavailable".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from llmbench.bench.hardware import Peak
from llmbench.bench.records import StepRecord


class StepUtilisation(NamedTuple):
    decode_bw: np.ndarray  # one value per step, NaN where it does not apply
    prefill_flops: np.ndarray


def step_utilisation(
    steps: list[StepRecord], model_info: Any, peak: Peak | None, tp: int = 1
) -> StepUtilisation:
    n = len(steps)
    bw = np.full(n, math.nan)
    flops = np.full(n, math.nan)
    sizes = [_field(model_info, k) for k in ("weight_bytes", "kv_bytes_per_token", "num_params")]
    if peak is None or not steps or None in sizes:  # a peer backend has no engine steps nor KV sizes
        return StepUtilisation(bw, flops)
    weight_bytes, kv_per_token, num_params = (float(x) for x in sizes)
    for i, s in enumerate(steps):
        if s.duration <= 0:
            continue
        if s.kind == "decode":
            bw[i] = (
                (weight_bytes + s.decode_context_tokens * kv_per_token)
                / s.duration
                / (peak.mem_bandwidth * tp)
            )
        elif s.kind == "prefill":
            flops[i] = 2.0 * num_params * s.num_prefill_tokens / s.duration / (peak.bf16_flops * tp)
    return StepUtilisation(bw, flops)


def _field(model_info: Any, name: str) -> Any:
    """A model-info field, whether the backend reports a dataclass or a plain mapping."""
    if isinstance(model_info, Mapping):
        return model_info.get(name)
    return getattr(model_info, name, None)


def step_summary(steps: list[StepRecord], util: StepUtilisation) -> dict[str, float]:
    """Per-repeat figures over the engine steps of that repeat."""
    nan = math.nan
    decode = [s.duration for s in steps if s.kind == "decode"]
    used = [
        s.kv_blocks_used / (s.kv_blocks_used + s.kv_blocks_free)
        for s in steps
        if s.kv_blocks_used + s.kv_blocks_free
    ]
    return {
        "num_steps": float(len(steps)),
        "decode_step_mean": float(np.mean(decode)) if decode else nan,
        "decode_bw_util_mean": _nanmean(util.decode_bw),
        "prefill_flop_util_mean": _nanmean(util.prefill_flops),
        "kv_usage_max": float(max(used)) if used else nan,
    }


def _nanmean(x: np.ndarray) -> float:
    finite = x[np.isfinite(x)]
    return float(finite.mean()) if finite.size else math.nan
