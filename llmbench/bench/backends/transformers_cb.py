"""Serving through transformers' continuous batching (``init_continuous_batching``): a background thread
runs the batch, requests join and leave every step, the KV cache is paged.

It runs the driver's serving loop (``driver.serve``, as the engine does): open loop hands each request
over at its due time (arrival = the scheduled time, the lag recorded), closed loop keeps N in flight
(arrival = hand-over); between arrivals it waits for transformers' results. Token times come
from transformers itself (``record_timestamps``: ``time.perf_counter()`` taken in its generation thread
as each token is appended to its request, after the batch's token ids reached the host); where this
transformers has no ``record_timestamps``, requests stream and each token is stamped when its output
reaches this thread (later by the queue hand-off; ``token_times_source`` in meta.json says which).
Queue time is transformers' own: arrival -> the request leaving its pending state.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from llmbench.bench.backends.base import OnProgress
from llmbench.bench.driver import DriveResult, Flight, Served, ServerStopped, serve
from llmbench.bench.records import RequestRecord
from llmbench.bench.workload.spec import RequestSpec

POLL_S = 0.05  # longest wait for a result before the schedule is looked at again


def records_timestamps(manager: Any) -> bool:
    """Whether this transformers stamps tokens itself (``add_request(record_timestamps=...)``)."""
    return "record_timestamps" in inspect.signature(manager.add_request).parameters


def _record(flight: Flight, out: Any | None, eos: set[int], ignore_eos: bool, stamped: bool) -> RequestRecord:
    spec = flight.spec
    common = dict(num_cached_tokens=None, num_preemptions=None, client_queue=flight.client_queue)
    if out is None:  # aborted before transformers returned anything
        return RequestRecord(
            request_id=spec.request_id, input_len=spec.input_len, max_tokens=spec.max_tokens,
            arrival=flight.arrival, submitted=flight.submitted, first_scheduled=None,
            token_times=list(flight.token_times), token_ids=[], finish_reason="abort", **common,
        )  # fmt: skip
    tokens = list(out.generated_tokens)
    times = list(out.timestamps or []) if stamped else list(flight.token_times)
    times = times[: len(tokens)]  # transformers may stamp a surplus token it then drops
    started = out.lifespan[0] if out.lifespan and out.lifespan[0] > 0 else None
    if out.error is not None:
        reason, error = "failed", f"transformers: {out.error}"
    elif not out.is_finished():
        reason, error = "abort", None
    else:
        stopped = bool(tokens) and tokens[-1] in eos and len(tokens) < spec.max_tokens
        reason, error = ("stop" if stopped else "length"), None
    check = None
    if reason in ("length", "stop"):
        if len(tokens) > spec.max_tokens or (ignore_eos and len(tokens) != spec.max_tokens):
            check = f"asked for {spec.max_tokens} tokens, got {len(tokens)}"
        elif len(times) != len(tokens):
            check = f"{len(tokens)} tokens but {len(times)} token times"
    return RequestRecord(
        request_id=spec.request_id, input_len=spec.input_len, max_tokens=spec.max_tokens,
        arrival=flight.arrival, submitted=flight.submitted, first_scheduled=started, token_times=times,
        token_ids=tokens, finish_reason=reason, error=error, output_check=check, **common,
    )  # fmt: skip


class _ManagerServer:
    """Transformers' batch manager: it steps in its own thread; the loop waits for its results."""

    def __init__(self, manager: Any, eos: set[int], ignore_eos: bool, clock: Any) -> None:
        self.manager, self.eos, self.ignore_eos, self.clock = manager, eos, ignore_eos, clock
        self.stamped = records_timestamps(manager)
        self.eos_arg = -1 if ignore_eos else sorted(eos)

    def add(self, key: str, spec: RequestSpec, arrival: float) -> None:
        extra = {"record_timestamps": True} if self.stamped else {"streaming": True}
        self.manager.add_request(
            spec.prompt, request_id=key, max_new_tokens=spec.max_tokens, eos_token_id=self.eos_arg, **extra
        )

    def busy(self, served: Served) -> bool:
        return bool(served.inflight)

    def advance(self, served: Served, wait: float | None) -> None:
        wait = POLL_S if wait is None else min(POLL_S, wait)
        out = self.manager.get_result(timeout=max(wait, 1e-4))
        if out is None:
            if not self.manager.is_running():
                raise ServerStopped(
                    "the transformers generation thread stopped before every request finished"
                )
            return
        flight = served.inflight.get(out.request_id)
        if flight is None:
            return
        if not self.stamped:  # a streamed token (or the last ones): stamp it on arrival here
            got = len(out.generated_tokens) - len(flight.token_times)
            flight.token_times += [self.clock()] * max(got, 0)
        if out.is_finished():
            del served.inflight[out.request_id]
            rec = _record(flight, out, self.eos, self.ignore_eos, self.stamped)
            served.records.append(rec)
            served.output_tokens += len(rec.token_ids)

    def abort(self, key: str, flight: Flight) -> RequestRecord:
        try:
            self.manager.cancel_request(key)
        except Exception:
            pass
        return _record(flight, None, self.eos, self.ignore_eos, self.stamped)


def run_continuous_batching(
    manager: Any,
    specs: list[RequestSpec],
    offsets: list[float] | None,
    *,
    concurrency: int | None,
    eos: set[int],
    ignore_eos: bool,
    tag: str,
    max_duration: float | None,
    on_progress: OnProgress | None,
    clock: Any = time.perf_counter,
    sleep: Any = time.sleep,
) -> DriveResult:
    return serve(
        _ManagerServer(manager, eos, ignore_eos, clock), specs, offsets, concurrency=concurrency, tag=tag,
        max_duration=max_duration, on_progress=on_progress, clock=clock, sleep=sleep,
    )  # fmt: skip
