"""The memory view of a run: how much the KV pool holds, and what limited the engine's batches.

Per repeat:
- ``kv_capacity_tokens``: tokens the KV pool holds (blocks x block size; the engine reports it at start-up).
- ``kv_capacity_seqs``: sequences of the workload's mean length (prompt + requested output tokens) the
  pool holds at once: blocks // blocks per such sequence; with ``paged_kv`` off, every sequence
  reserves ``max_model_len`` tokens whatever its length.
- ``limit_kv_share``, ``limit_seqs_share``, ``limit_tokens_share``: the share of engine steps whose batch
  was limited by the KV pool, by ``max_num_seqs``, or by the token budget ``max_num_batched_tokens``
  (``batch_limit`` in steps.parquet; engine/scheduler.py says how each step's reason is chosen).
KV blocks in use over time are ``kv_blocks_used`` in steps.parquet. A backend without a KV pool of the
engine's (a peer) gets NaN for all of these, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from llmbench.bench.records import RequestRecord, StepRecord

LIMIT_METRICS = {
    "limit_kv_share": "kv_blocks",
    "limit_seqs_share": "max_num_seqs",
    "limit_tokens_share": "max_num_batched_tokens",
}


def memory_summary(
    steps: list[StepRecord],
    requests: list[RequestRecord],
    startup: Mapping[str, Any],
    engine_config: Mapping[str, Any] | None,
    max_model_len: int | None,
) -> dict[str, float]:
    nan = math.nan
    out = {"kv_capacity_tokens": nan, "kv_capacity_seqs": nan, **dict.fromkeys(LIMIT_METRICS, nan)}
    tokens, blocks = startup.get("kv_capacity_tokens"), startup.get("kv_num_blocks")
    if not tokens or not blocks or engine_config is None:  # not the engine, or a run from before these
        return out
    out["kv_capacity_tokens"] = float(tokens)
    lengths = [r.input_len + r.max_tokens for r in requests]
    if not engine_config.get("paged_kv", True) and max_model_len:
        out["kv_capacity_seqs"] = float(tokens // max_model_len)
    elif lengths:
        block_size = tokens // blocks
        per_seq = math.ceil(float(np.mean(lengths)) / block_size)
        out["kv_capacity_seqs"] = float(blocks // per_seq)
    limits = [s.batch_limit for s in steps]
    if limits and all(limits):  # every step says what limited it
        for name, reason in LIMIT_METRICS.items():
            out[name] = sum(limit == reason for limit in limits) / len(limits)
    return out
