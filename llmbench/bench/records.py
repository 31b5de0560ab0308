"""What the driver records while a run is measured: one row per request, one per engine step.

All times are host ``time.perf_counter()`` seconds, the engine's clock; the store shifts them to the run's
start when it writes them out.
"""

from __future__ import annotations

from typing import NamedTuple


class RequestRecord(NamedTuple):
    """One request as the driver saw it; all times are ``time.perf_counter()`` seconds."""

    request_id: str
    input_len: int
    max_tokens: int
    arrival: float  # the arrival the engine was given (scheduled time for rate-driven runs)
    submitted: float  # when the driver actually handed it over
    first_scheduled: float | None
    token_times: list[float]
    token_ids: list[int]
    finish_reason: str | None  # "length" | "stop" | "abort" | None (still running when the run stopped)
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason in ("length", "stop")

    @property
    def arrival_lag(self) -> float:
        return self.submitted - self.arrival


class StepRecord(NamedTuple):
    """An engine step's statistics plus what the driver knows about it."""

    step: int
    kind: str  # "prefill" | "decode" | "mixed"
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    graph_bucket: int | None
    graph_padding: int
    kv_blocks_used: int
    kv_blocks_free: int
    prefix_cache_hit_tokens: int
    num_preemptions: int
    start: float
    end: float
    decode_context_tokens: int  # sum of context lengths of sequences that decoded a token this step

    @property
    def duration(self) -> float:
        return self.end - self.start
