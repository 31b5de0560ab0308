"""What the driver records while a run is measured: one row per request, one per engine step.

All times are host ``time.perf_counter()`` seconds, the engine's clock; the store shifts them to the run's
start when it writes them out. Every backend (the engine, transformers, an OpenAI-compatible server)
fills the same :class:`RequestRecord`; what a backend cannot know stays ``None`` (``first_scheduled`` of
a remote server, ``num_cached_tokens`` of a peer) and its summary says why, instead of a made-up 0.
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
    finish_reason: str | None  # "length" | "stop" | "abort" | "failed" | None (running when the run stopped)
    num_cached_tokens: int | None = 0  # None: the backend does not say
    num_preemptions: int | None = 0
    error: str | None = None  # why a "failed" request failed (HTTP status, dropped connection, ...)
    client_queue: float | None = None  # seconds it waited in the client before being sent (peer clients)
    reported_output_len: int | None = None  # the server's own count of output tokens, when it sends one
    output_check: str | None = None  # what is wrong with the output's length, None when it is as asked
    # Peer servers (bench/backends/openai_counts.py): where the output token count came from ("ids",
    # "usage", "finish_reason", "text", "chunks"); where the stream and the server disagree on that count;
    # where the server counted the prompt differently. None: not a peer's, or nothing to say.
    output_len_source: str | None = None
    count_check: str | None = None
    prompt_check: str | None = None
    # Peer clients: the longest the client's own loop was held up between the request's send and its last
    # token, so how late any of its tokens may have been stamped (bench/backends/openai_probe.py).
    client_stall: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason in ("length", "stop")

    @property
    def num_output_tokens(self) -> int:
        """Output tokens: one per token time (a peer backend gives each counted token a time, tokens of one
        chunk sharing it), or per id where a backend keeps ids without times."""
        return max(len(self.token_ids), len(self.token_times))

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
    # the engine's own counts of the step's work (engine/outputs.py StepStats), for the derived figures
    num_logits_rows: int = 0
    attention_pairs: int = 0
    context_tokens: int = 0
    # What happened during the step (the engine's counters; what explains a slow step)
    triton_compiles: int = 0
    graph_captures: int = 0
    recompiles: int = 0
    memory_growth: int = 0  # bytes: device memory in use on CUDA, resident set on a CPU
    gc_time: float = 0.0  # seconds in Python's garbage collector
    batch_limit: str = ""  # what kept more work out of the step (engine/scheduler.py); "" when not said
    device_wait: float = 0.0  # seconds the host waited for the step's ids with nothing else to do

    @property
    def duration(self) -> float:
        return self.end - self.start
