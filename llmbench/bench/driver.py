"""The driver: the serving loop that feeds one run point's requests to an in-process server and records
what happens, and the engine's side of it (``drive``). Transformers' continuous batching runs the same
loop (``backends/transformers_cb.py``); what differs between servers is a :class:`Server`.

Open loop (offline, poisson, gamma, trace): a request enters when its due time has passed, between server
steps; the server is given its *scheduled* arrival, so a late hand-over shows up in its latencies, and the
lag (handed over - scheduled) is recorded per request. When the server has nothing to do the loop sleeps
until the next arrival. Closed loop (concurrency N): N requests are kept in flight; each enters when a
slot frees, with arrival = hand-over time. Open loop with a cap (``max_concurrency``, as vLLM's
benchmark takes it): a due request waits in the client while N are in flight; its arrival is the
hand-over, and the wait before it is its ``client_queue``, a figure of its own.

A KeyboardInterrupt or a server exception stops the loop, aborts what is in flight and returns what was
measured with status "interrupted" / "failed"; ``max_duration`` stops it with status "timeout". Nothing
here knows about files, terminals or kernels.
"""

from __future__ import annotations

import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from llmbench.bench.records import RequestRecord, StepRecord
from llmbench.bench.workload.spec import RequestSpec

PROGRESS_PERIOD_S = 0.1  # how often the live display is fed; cheap enough not to disturb steps


class Progress(NamedTuple):
    done: int
    total: int
    output_tokens: int
    elapsed: float
    kv_usage: float  # fraction of KV blocks in use after the last step, NaN before any
    running: int


class DriveResult(NamedTuple):
    requests: list[RequestRecord]
    steps: list[StepRecord]
    start: float
    end: float
    status: str  # "complete" | "interrupted" | "failed" | "timeout"
    error: str | None
    not_submitted: int


class Flight:
    """A request handed over and not finished: its hand-over, and the tokens seen so far (ids and times,
    as far as its server reports them while it runs)."""

    __slots__ = ("spec", "arrival", "submitted", "client_queue", "token_ids", "token_times")

    def __init__(
        self, spec: RequestSpec, arrival: float, submitted: float, client_queue: float | None
    ) -> None:
        self.spec = spec
        self.arrival = arrival
        self.submitted = submitted
        self.client_queue = client_queue
        self.token_ids: list[int] = []
        self.token_times: list[float] = []


class Served:
    """What one run point has produced so far, kept by the loop and filled in by its server."""

    def __init__(self) -> None:
        self.inflight: dict[str, Flight] = {}  # by the id the server knows the request by
        self.records: list[RequestRecord] = []
        self.steps: list[StepRecord] = []
        self.output_tokens = 0
        self.kv_usage = float("nan")  # see Progress


class ServerStopped(Exception):
    """The server stopped serving before every request finished: the run fails, with this as its error."""


class Server(Protocol):
    """What the serving loop asks of the server it feeds."""

    def add(self, key: str, spec: RequestSpec, arrival: float) -> None:
        """Hand the request over as ``key``, its latencies counted from ``arrival``."""
        ...

    def busy(self, served: Served) -> bool:
        """Whether it holds requests still to finish."""
        ...

    def advance(self, served: Served, wait: float | None) -> None:
        """Run one step, or wait for results at most about ``wait`` seconds (the time until the next
        request is due; None: none is); move the requests that finished from ``served.inflight`` to
        ``served.records``. ServerStopped when it can serve no more."""
        ...

    def abort(self, key: str, flight: Flight) -> RequestRecord:
        """Stop a request the loop leaves unfinished; its record keeps what it produced."""
        ...


def hand_over(now: float, scheduled: float | None, capped: bool) -> tuple[float, float | None]:
    """A request handed over ``now``: the arrival its latencies count from, and its client queue. Closed
    loop: now. Open loop: its scheduled time (a late hand-over is the driver's lag, counted in). Open loop
    under a cap: now, the wait behind the cap apart."""
    if scheduled is None:
        return now, None
    if capped:
        return now, max(now - scheduled, 0.0)
    return scheduled, None


def admit_due(
    pending: deque[int],
    offsets: list[float] | None,
    start: float,
    now: float,
    inflight: dict[str, Any],
    concurrency: int | None,
    submit: Callable[[int, float | None], None],
) -> None:
    """Hand over every request that is due: by schedule (open loop; with a ``concurrency``, only while
    fewer are in flight), or while a slot is free (closed loop). ``submit(i, scheduled)`` gets the request's
    scheduled time, None in a closed loop (``hand_over`` says what its arrival is)."""
    if offsets is None:
        while pending and len(inflight) < (concurrency or 0):
            submit(pending.popleft(), None)
    else:
        cap = len(offsets) if concurrency is None else concurrency
        while pending and start + offsets[pending[0]] <= now and len(inflight) < cap:
            i = pending.popleft()
            submit(i, start + offsets[i])


def serve(
    server: Server,
    requests: list[RequestSpec],
    offsets: list[float] | None,
    *,
    concurrency: int | None = None,
    tag: str = "",
    max_duration: float | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> DriveResult:
    """Serve one run point through ``server`` (the module docstring says how); each request is known to
    the server as ``tag`` + its id."""
    if offsets is None and concurrency is None:
        raise ValueError(
            "a serving loop takes arrival offsets (open loop, capped by a concurrency) or a concurrency"
        )
    order = (
        range(len(requests)) if offsets is None else sorted(range(len(requests)), key=lambda i: offsets[i])
    )
    pending = deque(order)
    served = Served()
    status, error = "complete", None
    last_report = -1.0
    capped = offsets is not None and concurrency is not None
    start = clock()

    def submit(i: int, scheduled: float | None) -> None:
        """Hand request i over now (``hand_over`` says from when its latencies count)."""
        spec = requests[i]
        key = f"{tag}{spec.request_id}"
        now = clock()
        arrival, queued = hand_over(now, scheduled, capped)
        server.add(key, spec, arrival)
        served.inflight[key] = Flight(spec, arrival, now, queued)

    try:
        while True:
            now = clock()
            if max_duration is not None and now - start > max_duration:
                status = "timeout"
                break
            admit_due(pending, offsets, start, now, served.inflight, concurrency, submit)
            due = start + offsets[pending[0]] if offsets is not None and pending else None
            if server.busy(served):
                server.advance(served, None if due is None else max(due - clock(), 0.0))
            elif due is not None:  # nothing to serve until the next arrival: sleep until it
                if max_duration is not None:
                    due = min(due, start + max_duration + 1e-3)
                wait = due - clock()
                if wait > 0:
                    sleep(wait)
            elif not pending:
                break
            if on_progress is not None and clock() - last_report >= PROGRESS_PERIOD_S:
                last_report = clock()
                on_progress(
                    Progress(
                        len(served.records), len(requests), served.output_tokens, last_report - start,
                        served.kv_usage, len(served.inflight),
                    )
                )  # fmt: skip
    except ServerStopped as exc:
        status, error = "failed", str(exc)
    except KeyboardInterrupt:
        status = "interrupted"
    except Exception:
        status, error = "failed", traceback.format_exc()
    finally:
        for key, flight in list(served.inflight.items()):
            served.records.append(server.abort(key, flight))
        served.inflight.clear()
    end = clock()
    if on_progress is not None and status == "complete":
        done = Progress(
            len(served.records), len(requests), served.output_tokens, end - start, served.kv_usage, 0
        )
        on_progress(done)
    return DriveResult(served.records, served.steps, start, end, status, error, len(pending))


# -- the engine's side ------------------------------------------------------------------------------


def _record(flight: Flight, out: Any | None, reason: str | None) -> RequestRecord:
    """From the engine's RequestOutput when there is one, else from the token events seen."""
    if out is None:
        return RequestRecord(
            request_id=flight.spec.request_id, input_len=flight.spec.input_len,
            max_tokens=flight.spec.max_tokens, arrival=flight.arrival, submitted=flight.submitted,
            first_scheduled=None, token_times=list(flight.token_times), token_ids=list(flight.token_ids),
            finish_reason=reason, client_queue=flight.client_queue,
        )  # fmt: skip
    return RequestRecord(
        request_id=flight.spec.request_id,
        input_len=len(out.prompt_token_ids),
        max_tokens=flight.spec.max_tokens,
        arrival=out.arrival_time,
        submitted=flight.submitted,
        first_scheduled=out.first_scheduled_time,
        token_times=list(out.token_times),
        token_ids=list(out.token_ids),
        finish_reason=reason or out.finish_reason,
        num_cached_tokens=out.num_cached_tokens,
        num_preemptions=out.num_preemptions,
        client_queue=flight.client_queue,
    )


def _step_record(s: Any, decode_context: int) -> StepRecord:
    return StepRecord(
        s.step, s.kind, s.num_seqs, s.num_prefill_tokens, s.num_decode_tokens, s.graph_bucket, s.graph_padding,
        s.kv_blocks_used, s.kv_blocks_free, s.prefix_cache_hit_tokens, s.num_preemptions, s.start_time,
        s.end_time, decode_context, s.num_logits_rows, s.attention_pairs, s.context_tokens, s.triton_compiles,
        s.graph_captures, s.recompiles, s.memory_growth, s.gc_time, s.batch_limit, s.device_wait,
    )  # fmt: skip


class _EngineServer:
    """An in-process ``LLMEngine``: one engine step per turn, token by token."""

    def __init__(self, engine: Any, params_for: Callable[[RequestSpec], Any]) -> None:
        self.engine = engine
        self.params_for = params_for

    def add(self, key: str, spec: RequestSpec, arrival: float) -> None:
        self.engine.add_request(key, spec.prompt, self.params_for(spec), arrival_time=arrival)

    def busy(self, served: Served) -> bool:
        return self.engine.has_unfinished()

    def advance(self, served: Served, wait: float | None) -> None:
        out = self.engine.step()
        decode_context = 0
        for ev in out.tokens:
            flight = served.inflight.get(ev.request_id)
            if flight is None:
                continue
            if flight.token_ids:  # a decode token: it attended over prompt + earlier tokens
                decode_context += flight.spec.input_len + len(flight.token_ids)
            flight.token_ids.append(ev.token_id)
            flight.token_times.append(ev.time)
            served.output_tokens += 1
        s = out.stats
        if s.kind == "idle":  # nothing was schedulable: no engine work to record
            return
        served.steps.append(_step_record(s, decode_context))
        total_blocks = s.kv_blocks_used + s.kv_blocks_free
        served.kv_usage = s.kv_blocks_used / total_blocks if total_blocks else served.kv_usage
        for fin in out.finished:
            flight = served.inflight.pop(fin.request_id, None)
            if flight is not None:
                served.records.append(_record(flight, fin, None))

    def abort(self, key: str, flight: Flight) -> RequestRecord:
        try:
            out = self.engine.abort(key)
        except Exception:
            out = None
        return _record(flight, out, "abort")


def drive(
    engine: Any,
    requests: list[RequestSpec],
    offsets: list[float] | None,
    params_for: Callable[[RequestSpec], Any],
    *,
    concurrency: int | None = None,
    tag: str = "",
    max_duration: float | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> DriveResult:
    """Serve one run point on an in-process engine, each request with ``params_for(spec)``."""
    return serve(
        _EngineServer(engine, params_for), requests, offsets, concurrency=concurrency, tag=tag,
        max_duration=max_duration, on_progress=on_progress, clock=clock, sleep=sleep,
    )  # fmt: skip
