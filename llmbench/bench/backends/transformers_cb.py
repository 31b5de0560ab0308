"""Serving through transformers' continuous batching (``init_continuous_batching``): a background thread
runs the batch, requests join and leave every step, the KV cache is paged.

The driver mirrors ``driver.drive``: open loop hands each request over at its due time (arrival = the
scheduled time, the lag recorded), closed loop keeps N in flight (arrival = hand-over). Token times come
from transformers itself (``record_timestamps``: ``time.perf_counter()`` taken in its generation thread
as each token is appended to its request, after the batch's token ids reached the host); where this
transformers has no ``record_timestamps``, requests stream and each token is stamped when its output
reaches this thread (later by the queue hand-off; ``token_times_source`` in meta.json says which).
Queue time is transformers' own: arrival -> the request leaving its pending state.
"""

from __future__ import annotations

import inspect
import time
import traceback
from collections import deque
from typing import Any

from llmbench.bench.backends.base import OnProgress
from llmbench.bench.driver import PROGRESS_PERIOD_S, DriveResult, Progress, admit_due, hand_over
from llmbench.bench.records import RequestRecord
from llmbench.bench.workload.spec import RequestSpec

POLL_S = 0.05  # longest wait for a result before the schedule is looked at again


class _Flight:
    __slots__ = ("spec", "arrival", "submitted", "client_queue", "stream_times")

    def __init__(
        self, spec: RequestSpec, arrival: float, submitted: float, client_queue: float | None
    ) -> None:
        self.spec = spec
        self.arrival = arrival
        self.submitted = submitted
        self.client_queue = client_queue
        self.stream_times: list[float] = []


def records_timestamps(manager: Any) -> bool:
    """Whether this transformers stamps tokens itself (``add_request(record_timestamps=...)``)."""
    return "record_timestamps" in inspect.signature(manager.add_request).parameters


def _record(
    flight: _Flight, out: Any | None, eos: set[int], ignore_eos: bool, stamped: bool
) -> RequestRecord:
    spec = flight.spec
    common = dict(num_cached_tokens=None, num_preemptions=None, client_queue=flight.client_queue)
    if out is None:  # aborted before transformers returned anything
        return RequestRecord(
            request_id=spec.request_id, input_len=spec.input_len, max_tokens=spec.max_tokens,
            arrival=flight.arrival, submitted=flight.submitted, first_scheduled=None,
            token_times=list(flight.stream_times), token_ids=[], finish_reason="abort", **common,
        )  # fmt: skip
    tokens = list(out.generated_tokens)
    times = list(out.timestamps or []) if stamped else list(flight.stream_times)
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
) -> DriveResult:
    stamped = records_timestamps(manager)
    eos_arg = -1 if ignore_eos else sorted(eos)
    order = range(len(specs)) if offsets is None else sorted(range(len(specs)), key=lambda i: offsets[i])
    pending = deque(order)
    inflight: dict[str, _Flight] = {}
    records: list[RequestRecord] = []
    status, error = "complete", None
    out_tokens, last_report = 0, -1.0
    start = clock()

    def submit(i: int, scheduled: float | None) -> None:
        spec = specs[i]
        rid = f"{tag}{spec.request_id}"
        now = clock()
        extra = {"record_timestamps": True} if stamped else {"streaming": True}
        manager.add_request(
            spec.prompt, request_id=rid, max_new_tokens=spec.max_tokens, eos_token_id=eos_arg, **extra
        )
        arrival, queued = hand_over(now, scheduled, offsets is not None and concurrency is not None)
        inflight[rid] = _Flight(spec, arrival, now, queued)

    try:
        while True:
            now = clock()
            if max_duration is not None and now - start > max_duration:
                status = "timeout"
                break
            admit_due(pending, offsets, start, now, inflight, concurrency, submit)
            if not inflight and not pending:
                break
            wait = POLL_S
            if offsets is not None and pending:
                wait = min(wait, max(start + offsets[pending[0]] - clock(), 0.0))
            if not inflight:
                time.sleep(wait)
                continue
            out = manager.get_result(timeout=max(wait, 1e-4))
            if out is None:
                if not manager.is_running():
                    status = "failed"
                    error = "the transformers generation thread stopped before every request finished"
                    break
            else:
                flight = inflight.get(out.request_id)
                if flight is not None:
                    if not stamped and not out.is_finished():  # a streamed token: stamp it on arrival here
                        got = len(out.generated_tokens) - len(flight.stream_times)
                        flight.stream_times += [clock()] * max(got, 0)
                    elif out.is_finished():
                        if not stamped:
                            got = len(out.generated_tokens) - len(flight.stream_times)
                            flight.stream_times += [clock()] * max(got, 0)
                        del inflight[out.request_id]
                        rec = _record(flight, out, eos, ignore_eos, stamped)
                        records.append(rec)
                        out_tokens += len(rec.token_ids)
            if on_progress is not None and clock() - last_report >= PROGRESS_PERIOD_S:
                last_report = clock()
                on_progress(
                    Progress(
                        len(records), len(specs), out_tokens, last_report - start, float("nan"), len(inflight)
                    )
                )
    except KeyboardInterrupt:
        status = "interrupted"
    except Exception:
        status, error = "failed", traceback.format_exc()
    finally:
        for rid, flight in list(inflight.items()):
            try:
                manager.cancel_request(rid)
            except Exception:
                pass
            records.append(_record(flight, None, eos, ignore_eos, stamped))
        inflight.clear()
    end = clock()
    if on_progress is not None and status == "complete":
        on_progress(Progress(len(records), len(specs), out_tokens, end - start, float("nan"), 0))
    return DriveResult(records, [], start, end, status, error, len(pending))
