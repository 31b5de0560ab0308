"""Latency and throughput metrics: the one definition of each (the README's "Metrics" section).

Per request (times are host seconds): queue = first scheduled - arrival; TTFT = first token - arrival;
E2E = last token - arrival; TPOT = (E2E - TTFT) / (n - 1) for n >= 2 tokens; ITL = gaps between its
consecutive tokens. A peer client that holds requests back (a concurrency limit) sends them later than
scheduled: its ``arrival`` is the send, and the wait before it is ``client_queue``, its own figure.
Requests that failed (HTTP errors, dropped streams) are counted apart and left out of the latencies.
Per repeat: latency distributions over the requests that finished (ITL pooled over them), throughputs
over the measured window (first arrival -> last token), goodput = requests meeting every SLO per second
of that window.

``METRICS`` is the one table of names, units and which direction is better; reports and the regression
gate read it, so a metric means the same thing everywhere.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from llmbench.bench.records import RequestRecord
from llmbench.bench.scenario.schema import SLO
from llmbench.bench.stats import distribution

# The figures bench/derived.py's ``step_summary`` gives: engine-only (a peer backend shows them unavailable:
# backends/base.py ENGINE_ONLY), each a metric of METRICS below (summary.json keeps only those).
STEP_FIGURES = (
    "num_steps",
    "decode_step_mean",
    "decode_host_time",
    "device_wait_share",
    "decode_bw_util_mean",
    "prefill_flop_util_mean",
    "kv_usage_max",
    "decode_fixed",
    "decode_kv_rate",
)


class RequestMetrics(NamedTuple):
    queue: float
    ttft: float
    tpot: float
    e2e: float
    itl: np.ndarray
    output_len: int


def request_metrics(rec: RequestRecord) -> RequestMetrics:
    """TPOT divides by the output token count (the server's own count when it sent one), so a stream that
    carried several tokens in one chunk still gives the right per-token time; one chunk alone gives none."""
    nan = math.nan
    times = np.asarray(rec.token_times, dtype=float)
    queue = rec.first_scheduled - rec.arrival if rec.first_scheduled is not None else nan
    n = rec.num_output_tokens
    if times.size == 0:
        return RequestMetrics(queue, nan, nan, nan, np.empty(0), n)
    ttft = float(times[0] - rec.arrival)
    e2e = float(times[-1] - rec.arrival)
    tpot = (e2e - ttft) / (n - 1) if times.size >= 2 and n >= 2 else nan
    return RequestMetrics(queue, ttft, tpot, e2e, np.diff(times), n)


def meets_slo(m: RequestMetrics, slo: SLO) -> bool:
    """Every SLO given is met. A one-token request has no TPOT, so it cannot miss a TPOT target."""
    if slo.ttft_ms is not None and not m.ttft * 1e3 <= slo.ttft_ms:
        return False
    if slo.tpot_ms is not None and not math.isnan(m.tpot) and m.tpot * 1e3 > slo.tpot_ms:
        return False
    return slo.e2e_ms is None or m.e2e * 1e3 <= slo.e2e_ms


class MetricInfo(NamedTuple):
    label: str
    unit: str  # "s" values are shown in ms
    better: str  # "lower" | "higher" | "" (informational)


LATENCIES = {
    "ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E latency", "queue": "queue time",
    "client_queue": "client queue",  # peer clients: scheduled -> sent (a concurrency limit); not in TTFT
}  # fmt: skip
STATS = ("p50", "p90", "p95", "p99", "mean")

METRICS: dict[str, MetricInfo] = {
    **{f"{k}_{s}": MetricInfo(f"{label} {s}", "s", "lower") for k, label in LATENCIES.items() for s in STATS},
    "output_throughput": MetricInfo("output tok/s", "tok/s", "higher"),
    "total_throughput": MetricInfo("total tok/s", "tok/s", "higher"),
    "request_throughput": MetricInfo("requests/s", "req/s", "higher"),
    "goodput": MetricInfo("goodput", "req/s", "higher"),
    "slo_attainment": MetricInfo("SLO attainment", "fraction", "higher"),
    "duration": MetricInfo("measured window", "s", ""),
    "num_requests": MetricInfo("requests", "count", ""),
    "num_completed": MetricInfo("completed", "count", ""),
    "num_aborted": MetricInfo("aborted", "count", ""),
    "num_failed": MetricInfo("failed", "count", "lower"),
    "num_output_mismatch": MetricInfo("output length mismatches", "count", "lower"),
    "input_tokens": MetricInfo("input tokens", "count", ""),
    "output_tokens": MetricInfo("output tokens", "count", ""),
    "arrival_lag_p99": MetricInfo("arrival lag p99", "s", "lower"),
    "arrival_lag_max": MetricInfo("arrival lag max", "s", "lower"),
    "num_steps": MetricInfo("engine steps", "count", ""),
    "decode_step_mean": MetricInfo("decode step mean", "s", "lower"),
    "decode_bw_util_mean": MetricInfo("decode bandwidth util per GPU", "fraction", "higher"),
    "decode_fixed": MetricInfo("decode step, fixed part", "s", "lower"),
    "decode_kv_rate": MetricInfo("decode KV read rate per GPU", "bytes/s", "higher"),
    "decode_host_time": MetricInfo("decode step, host time", "s", "lower"),
    "device_wait_share": MetricInfo("host waiting on the device", "fraction", ""),
    "prefill_flop_util_mean": MetricInfo("prefill FLOP util per GPU", "fraction", "higher"),
    "kv_usage_max": MetricInfo("KV blocks used max", "fraction", ""),
    "prefix_cache_hit_rate": MetricInfo("prefix cache hit rate", "fraction", "higher"),
    "preemptions": MetricInfo("preemptions", "count", "lower"),
    "gpu_util_mean": MetricInfo("GPU util mean over GPUs", "%", ""),
    "power_mean": MetricInfo("power mean, all GPUs", "W", "lower"),
    "energy": MetricInfo("energy", "J", "lower"),
    "energy_per_token": MetricInfo("energy per output token", "J/tok", "lower"),
    "sm_clock_mean": MetricInfo("SM clock mean", "MHz", ""),
    "gpu_memory_max": MetricInfo("GPU memory used max, all GPUs", "bytes", "lower"),
    "gpu_memory_device_max": MetricInfo("GPU memory used max, one GPU", "bytes", "lower"),
    "torch_reserved_max": MetricInfo("torch reserved max", "bytes", "lower"),
    "cpu_util_mean": MetricInfo("process CPU mean", "%", ""),
    "rss_max": MetricInfo("process RSS max", "bytes", "lower"),
    "peak_memory": MetricInfo("peak memory, one device", "bytes", "lower"),
    # the memory view (bench/memory.py)
    "kv_capacity_tokens": MetricInfo("KV capacity, tokens", "count", "higher"),
    "kv_capacity_seqs": MetricInfo("KV capacity, sequences of mean length", "count", "higher"),
    "limit_kv_share": MetricInfo("steps limited by KV blocks", "fraction", ""),
    "limit_seqs_share": MetricInfo("steps limited by max_num_seqs", "fraction", ""),
    "limit_tokens_share": MetricInfo("steps limited by max_num_batched_tokens", "fraction", ""),
}

# Statistics over requests (the HTML report plots their per-request values).
REQUEST_LEVEL = {f"{k}_{s}": (k, s) for k in LATENCIES for s in STATS}


def latency_samples(records: list[RequestRecord]) -> dict[str, np.ndarray]:
    """Per-request values of each latency over finished requests (ITL pooled)."""
    done = [request_metrics(r) for r in records if r.finished]
    return {
        "ttft": np.array([m.ttft for m in done], dtype=float),
        "tpot": np.array([m.tpot for m in done], dtype=float),
        "e2e": np.array([m.e2e for m in done], dtype=float),
        "queue": np.array([m.queue for m in done], dtype=float),
        "client_queue": np.array(
            [math.nan if r.client_queue is None else r.client_queue for r in records if r.finished],
            dtype=float,
        ),
        "itl": np.concatenate([m.itl for m in done]) if done else np.empty(0),
    }


def window(records: list[RequestRecord]) -> tuple[float, float]:
    """First arrival -> last token of the repeat (NaN when nothing was produced)."""
    starts = [r.arrival for r in records]
    ends = [r.token_times[-1] for r in records if r.token_times]
    if not starts or not ends:
        return math.nan, math.nan
    return min(starts), max(ends)


def request_summary(records: list[RequestRecord], slo: SLO) -> dict[str, float]:
    """Latency distributions, counts and throughputs of one repeat."""
    out: dict[str, float] = {}
    for name, values in latency_samples(records).items():
        for stat, v in distribution(values).items():
            out[f"{name}_{stat}"] = v
    start, end = window(records)
    duration = end - start
    finished = [r for r in records if r.finished]
    out_tokens = sum(r.num_output_tokens for r in records)
    # Prompt tokens of requests the backend started on (a remote server never says when: a token shows it).
    in_tokens = sum(r.input_len for r in records if r.first_scheduled is not None or r.token_times)
    good = sum(meets_slo(request_metrics(r), slo) for r in finished)
    # A failed request met no SLO: attainment is a share of the requests that finished or failed (those
    # a time limit or an interrupt cut are neither: the run says how many there were).
    judged = len(finished) + sum(r.finish_reason == "failed" for r in records)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    lags = np.array([r.arrival_lag for r in records], dtype=float)
    out.update(
        duration=duration,
        num_requests=float(len(records)),
        num_completed=float(len(finished)),
        num_aborted=float(sum(r.finish_reason == "abort" for r in records)),
        num_failed=float(sum(r.finish_reason == "failed" for r in records)),
        num_output_mismatch=float(sum(r.output_check is not None for r in records)),
        input_tokens=float(in_tokens),
        output_tokens=float(out_tokens),
        output_throughput=per_s(out_tokens),
        total_throughput=per_s(out_tokens + in_tokens),
        request_throughput=per_s(len(finished)),
        goodput=per_s(good) if slo.defined else math.nan,
        slo_attainment=good / judged if slo.defined and judged else math.nan,
        arrival_lag_p99=float(np.percentile(lags, 99)) if lags.size else math.nan,
        arrival_lag_max=float(lags.max()) if lags.size else math.nan,
        preemptions=float(sum(r.num_preemptions or 0 for r in records)),
    )
    cached = sum(r.num_cached_tokens or 0 for r in records if r.first_scheduled is not None)
    out["prefix_cache_hit_rate"] = cached / in_tokens if in_tokens else math.nan
    return out
