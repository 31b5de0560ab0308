"""Hardware-relative figures per engine step: what one GPU read or computed, over the step's time and
one GPU's peak.

Every count is per GPU (per tensor-parallel rank), taken from the parameters rank 0 actually holds
(engine/work.py; every rank holds the same shapes), so one definition serves every tp:

decode bytes per GPU per step (decode steps only):
    this rank's layer weights (its shards of the sharded matmuls, whole copies of the replicated parts:
        the norms, and the K/V projections when there are fewer KV heads than ranks)
  + this rank's LM-head shard (the embedding matrix when tied), read whole since every row samples
  + the embedding rows looked up: tokens x hidden x dtype size / tp (the embedding is vocabulary-parallel:
        a rank reads the rows of the tokens in its slice of the vocabulary, about 1/tp of them)
  + the K/V read: context tokens (cached + new, summed over the sequences) x this rank's K/V bytes per
        token (kv_heads/tp heads per layer, or the one head it holds when they are replicated)
prefill FLOPs per GPU per step (prefill steps only):
    2 x this rank's layer matmul parameters x prefill tokens
  + 2 x this rank's LM-head parameters x rows that sample (logits are computed for those rows only)
  + attention: 4 x layers x this rank's query heads x head_dim x causal query-key pairs (QK^T and PV at
        2 FLOPs per multiply-add); a sequence with c tokens already cached and q new ones has
        q*c + q(q+1)/2 pairs, so a prompt resumed after a prefix-cache hit, or a chunk in the middle of a
        prompt, counts its attention over what is cached
decode bandwidth utilisation = decode bytes / step time / one GPU's memory bandwidth peak
prefill FLOP utilisation     = prefill FLOPs / step time / one GPU's matmul FLOP/s peak

The decode step model: over one repeat's decode steps, the least-squares fit

    step time = fixed + per sequence x sequences + K/V bytes read / KV read rate

splits a decode step into what it costs whatever its batch and contexts (``decode_fixed``: the weights'
read, the launches, the kernels' ramps and tails) and the rate at which it reads the K/V its contexts
hold (``decode_kv_rate``, bytes/s per GPU). Which of the two a variant moves says where it acts. The fit
needs at least 20 decode steps; the sequences' term is left out where every step has the same number;
both figures are given only where the K/V coefficient is positive and at least 5 standard errors from
zero: the contexts must vary enough for their cost to show, or the fixed part is as unsure as the rate.

Host or device: each step records how long the host waited for its sampled ids with nothing else to do
(``device_wait``; with asynchronous scheduling, after launching the next step). ``device_wait_share``,
their sum over the repeat's step time, is high when the device bounds the run (faster kernels pay) and
near 0 when the host does (the device waits for launches and bookkeeping); ``decode_host_time`` is a
decode step's time less that wait: the host's own work per decode step.

Mixed steps (prefill chunks with decodes, under chunked_prefill) get neither figure: their time is shared
between a bandwidth-bound and a compute-bound part and neither ceiling describes it; their counts are in
the steps table. Left out everywhere: elementwise work (norms, RoPE, activations), the K/V the step
writes, the padding rows of CUDA Graph buckets, and at tp > 1 the all-reduces' traffic. The peak is the
one measured on this machine (``llmbench calibrate``) when there is one, else the datasheet's
(bench/peaks.py); without either both figures are NaN and the summary says "unavailable".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from llmbench.bench.peaks import PeakUsed
from llmbench.bench.records import StepRecord
from llmbench.engine.work import RankWeights


class StepUtilisation(NamedTuple):
    decode_bw: np.ndarray  # one value per step, NaN where it does not apply (or without a peak)
    prefill_flops: np.ndarray
    decode_bytes: np.ndarray  # per GPU, NaN where it does not apply; known without a peak
    prefill_flop_count: np.ndarray
    kv_bytes: np.ndarray  # per GPU: the K/V a decode step reads (part of decode_bytes), NaN elsewhere


MIN_FIT_STEPS = 20  # decode steps the step model needs
MIN_RATE_T = 5.0  # the KV coefficient's size in standard errors below which no rate is given


def decode_bytes(step: StepRecord, w: RankWeights) -> float:
    """Bytes one GPU reads in a decode step (see the module docstring)."""
    head = w.lm_head_bytes if step.num_logits_rows else 0
    embedding = step.num_decode_tokens * w.embedding_row_bytes / w.tp
    return w.layer_bytes + head + embedding + step.context_tokens * w.kv_bytes_per_token


def prefill_flops(step: StepRecord, w: RankWeights) -> float:
    """FLOPs one GPU computes in a prefill step (see the module docstring)."""
    linear = 2.0 * w.layer_matmul_params * step.num_prefill_tokens
    head = 2.0 * w.lm_head_params * step.num_logits_rows
    attention = 4.0 * w.num_layers * w.attention_heads * w.head_dim * step.attention_pairs
    return linear + head + attention


def rank_weights_of(model_info: Any) -> RankWeights | None:
    """The engine's per-rank breakdown, from its ModelInfo or a mapping of it; None for a peer backend."""
    w = _field(model_info, "rank_weights")
    if isinstance(w, Mapping):
        try:
            w = RankWeights(**w)
        except TypeError:  # written by a version whose breakdown had other fields
            return None
    return w if isinstance(w, RankWeights) else None


def step_utilisation(steps: list[StepRecord], model_info: Any, peak: PeakUsed | None) -> StepUtilisation:
    n = len(steps)
    out = StepUtilisation(*(np.full(n, math.nan) for _ in range(5)))
    w = rank_weights_of(model_info)
    if w is None:  # a peer backend has no engine steps nor a breakdown of its weights
        return out
    for i, s in enumerate(steps):
        if s.kind == "decode":
            out.decode_bytes[i] = decode_bytes(s, w)
            out.kv_bytes[i] = s.context_tokens * w.kv_bytes_per_token
            if peak is not None and s.duration > 0:
                out.decode_bw[i] = out.decode_bytes[i] / s.duration / peak.mem_bandwidth
        elif s.kind == "prefill":
            out.prefill_flop_count[i] = prefill_flops(s, w)
            if peak is not None and s.duration > 0:
                out.prefill_flops[i] = out.prefill_flop_count[i] / s.duration / peak.matmul_flops
    return out


def _field(model_info: Any, name: str) -> Any:
    """A model-info field, whether the backend reports a dataclass or a plain mapping."""
    if isinstance(model_info, Mapping):
        return model_info.get(name)
    return getattr(model_info, name, None)


def step_summary(steps: list[StepRecord], util: StepUtilisation) -> dict[str, float]:
    """Per-repeat figures over the engine steps of that repeat (``STEP_FIGURES``)."""
    nan = math.nan
    decode_steps = [s for s in steps if s.kind == "decode"]
    decode = [s.duration for s in decode_steps]
    used = [
        s.kv_blocks_used / (s.kv_blocks_used + s.kv_blocks_free)
        for s in steps
        if s.kv_blocks_used + s.kv_blocks_free
    ]
    total = sum(s.duration for s in steps)
    return {
        "num_steps": float(len(steps)),
        "decode_step_mean": float(np.mean(decode)) if decode else nan,
        "decode_host_time": (
            float(np.mean([s.duration - s.device_wait for s in decode_steps])) if decode_steps else nan
        ),
        "device_wait_share": sum(s.device_wait for s in steps) / total if total > 0 else nan,
        "decode_bw_util_mean": _nanmean(util.decode_bw),
        "prefill_flop_util_mean": _nanmean(util.prefill_flops),
        "kv_usage_max": float(max(used)) if used else nan,
        **decode_model(steps, util.kv_bytes),
    }


BATCH_EDGES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)  # decode_batches' bins: [edge, next)


def decode_batches(steps: list[StepRecord]) -> list[dict[str, Any]]:
    """A repeat's decode steps by batch size, in bins of powers of two (1, 2-3, 4-7, ...; the last bin open
    above): per bin its steps, their summed time, the host's summed wait on the device in them and their
    summed sequences. Kept per repeat in summary.json (the steps table is not kept with a result's
    summary), so a report can show at which batch sizes a variant gains or loses time, and where the host
    rather than the device sets the pace."""
    bins: dict[int, dict[str, Any]] = {}
    for s in steps:
        if s.kind != "decode" or s.num_seqs < 1:
            continue
        i = int(np.searchsorted(BATCH_EDGES, s.num_seqs, side="right")) - 1
        lo = BATCH_EDGES[i]
        hi = BATCH_EDGES[i + 1] - 1 if i + 1 < len(BATCH_EDGES) else None
        b = bins.setdefault(
            lo, {"min": lo, "max": hi, "steps": 0, "time": 0.0, "device_wait": 0.0, "seqs": 0}
        )
        b["steps"] += 1
        b["time"] += s.duration
        b["device_wait"] += s.device_wait
        b["seqs"] += s.num_seqs
    return [bins[k] for k in sorted(bins)]


def decode_model(steps: list[StepRecord], kv_bytes: np.ndarray) -> dict[str, float]:
    """The decode step model's figures (module docstring); NaN where the steps cannot give them."""
    out = {"decode_fixed": math.nan, "decode_kv_rate": math.nan}
    rows = [i for i, s in enumerate(steps) if s.kind == "decode" and np.isfinite(kv_bytes[i])]
    if len(rows) < MIN_FIT_STEPS:
        return out
    t = np.array([steps[i].duration for i in rows])
    seqs = np.array([steps[i].num_seqs for i in rows], dtype=float)
    kv = kv_bytes[rows] / 1e9  # GB: columns of similar size
    columns = [np.ones_like(t), kv] + ([seqs] if np.ptp(seqs) > 0 else [])
    x = np.stack(columns, axis=1)
    coef, _, rank, _ = np.linalg.lstsq(x, t, rcond=None)
    if rank < x.shape[1]:  # a column that never varies apart from the others: nothing to split
        return out
    resid = t - x @ coef
    cov = resid @ resid / (len(t) - x.shape[1]) * np.linalg.inv(x.T @ x)
    slope, se = coef[1], math.sqrt(cov[1, 1])
    if slope > 0 and slope >= MIN_RATE_T * se:  # else the intercept is as unsure as the slope
        out["decode_fixed"] = float(coef[0])
        out["decode_kv_rate"] = float(1e9 / slope)
    return out


def _nanmean(x: np.ndarray) -> float:
    finite = x[np.isfinite(x)]
    return float(finite.mean()) if finite.size else math.nan
