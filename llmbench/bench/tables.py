"""The run's tidy tables: one row per request, per engine step, per telemetry sample.

Times are seconds since the run's origin (just before the backend was built), so requests, steps and
telemetry share one time axis. Generated token ids are kept per request, so greedy outputs of two runs
can be compared request by request (a server that does not return ids leaves them empty). Only the engine
has steps; a peer backend's steps table is empty.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from llmbench.bench.derived import StepUtilisation
from llmbench.bench.metrics import meets_slo, request_metrics
from llmbench.bench.records import RequestRecord, StepRecord
from llmbench.bench.scenario.schema import SLO
from llmbench.bench.slow_steps import SlowStep
from llmbench.bench.telemetry import COLUMNS as TELEMETRY_COLUMNS

REQUEST_COLUMNS = (
    "point", "repeat", "request_id", "input_len", "max_tokens", "output_len", "arrival", "submitted",
    "arrival_lag", "first_scheduled", "first_token", "last_token", "queue_time", "ttft", "tpot", "e2e",
    "finish_reason", "num_cached_tokens", "num_preemptions", "slo_met", "token_ids", "token_times",
    "client_queue", "error", "output_check", "output_len_source", "count_check", "prompt_check", "client_stall",
)  # fmt: skip
STEP_COLUMNS = (
    "point", "repeat", "step", "kind", "num_seqs", "num_prefill_tokens", "num_decode_tokens", "graph_bucket",
    "graph_padding", "kv_blocks_used", "kv_blocks_free", "prefix_cache_hit_tokens", "num_preemptions",
    "start", "end", "duration", "decode_context_tokens", "decode_bw_util", "prefill_flop_util",
    "num_logits_rows", "attention_pairs", "context_tokens", "decode_bytes_per_gpu", "prefill_flops_per_gpu",
    "triton_compiles", "graph_captures", "recompiles", "memory_growth", "gc_time", "slow", "slow_causes",
    "batch_limit", "device_wait",
)  # fmt: skip


def request_rows(
    point: str, repeat: int, records: list[RequestRecord], slo: SLO, origin: float
) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        m = request_metrics(r)
        rows.append(
            {
                "point": point,
                "repeat": repeat,
                "request_id": r.request_id,
                "input_len": r.input_len,
                "max_tokens": r.max_tokens,
                "output_len": r.num_output_tokens,
                "arrival": r.arrival - origin,
                "submitted": r.submitted - origin,
                "arrival_lag": r.arrival_lag,
                "first_scheduled": r.first_scheduled - origin if r.first_scheduled is not None else math.nan,
                "first_token": r.token_times[0] - origin if r.token_times else math.nan,
                "last_token": r.token_times[-1] - origin if r.token_times else math.nan,
                "queue_time": m.queue,
                "ttft": m.ttft,
                "tpot": m.tpot,
                "e2e": m.e2e,
                "finish_reason": r.finish_reason or "unfinished",
                "num_cached_tokens": r.num_cached_tokens,
                "num_preemptions": r.num_preemptions,
                "slo_met": bool(r.finished and meets_slo(m, slo)) if slo.defined else None,
                "token_ids": [int(t) for t in r.token_ids],
                "token_times": [t - origin for t in r.token_times],
                "client_queue": math.nan if r.client_queue is None else r.client_queue,
                "error": r.error,
                "output_check": r.output_check,
                "output_len_source": r.output_len_source,
                "count_check": r.count_check,
                "prompt_check": r.prompt_check,
                "client_stall": math.nan if r.client_stall is None else r.client_stall,
            }
        )
    return rows


def step_rows(
    point: str,
    repeat: int,
    steps: list[StepRecord],
    util: StepUtilisation,
    origin: float,
    slow: Sequence[SlowStep] = (),
) -> list[dict[str, Any]]:
    """One row per step; ``slow`` marks the slow ones (``slow`` True, their causes joined by ", ")."""
    causes = {s.index: ", ".join(s.causes) for s in slow}
    rows = []
    for i, s in enumerate(steps):
        row = {"point": point, "repeat": repeat, **s._asdict()}
        row.update(
            start=s.start - origin,
            end=s.end - origin,
            duration=s.duration,
            decode_bw_util=float(util.decode_bw[i]),
            prefill_flop_util=float(util.prefill_flops[i]),
            decode_bytes_per_gpu=float(util.decode_bytes[i]),
            prefill_flops_per_gpu=float(util.prefill_flop_count[i]),
            slow=i in causes,
            slow_causes=causes.get(i, ""),
        )
        rows.append(row)
    return rows


def frame(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(columns))


def telemetry_frame(rows: list[dict[str, Any]], origin: float) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(TELEMETRY_COLUMNS), dtype=float)
    df["time"] = df["time"] - origin
    df["gpu"] = df["gpu"].astype("int64")
    return df
