"""Serving one run point through an OpenAI-compatible server: streamed requests on one asyncio loop.

Open loop: each request is due at its scheduled time; closed loop: N requests are kept in flight. A
``max_concurrency`` limit holds requests in the client until a slot frees. A request's clock starts when
it is *sent* (its ``arrival`` in the record, so TTFT and E2E are the server's), and the time it waited in
the client before that -- behind the limit, or behind a busy event loop -- is its ``client_queue``,
reported as its own figure. Every token is stamped with ``time.perf_counter()`` when the SSE event that
carries it has been read; tokens that share a chunk share its time. A ticker on the same loop
(openai_probe.py) measures how late the client itself runs, and each request records how long the loop
was held up while it was in flight (``client_stall``): how late its tokens may have been stamped. Output
tokens are counted once the point is over (openai_counts.py), off the loop.

Nothing here raises for a bad request: a refused connection, an HTTP error, a dropped stream, an error
event or a timeout make that request "failed" with the reason, and the run goes on.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from llmbench.bench.backends.openai_counts import Counted, Streamed, settle, spread
from llmbench.bench.backends.openai_http import (
    Endpoint,
    HTTPStatusError,
    body_lines,
    close,
    read_error_body,
    request,
    sse_events,
)
from llmbench.bench.backends.openai_probe import LoopLag, LoopProbe, held
from llmbench.bench.backends.openai_stream import parse_chunk
from llmbench.bench.driver import PROGRESS_PERIOD_S, DriveResult, Progress
from llmbench.bench.records import RequestRecord
from llmbench.bench.workload.spec import RequestSpec


class StreamError(Exception):
    """The stream said something that ends the request (an error event, malformed data, an early end)."""


class Flight:
    """One request from its scheduled time to its last token (or its failure)."""

    def __init__(self, spec: RequestSpec, scheduled: float) -> None:
        self.spec = spec
        self.scheduled = scheduled
        self.sent: float | None = None
        self.chunks: list[tuple[float, int]] = []  # (stamp, tokens) of each chunk that carried tokens
        self.shown = 0  # tokens the chunks showed
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.ids_complete = True  # every token-carrying chunk had its ids
        self.multi_token_chunks = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: str | None = None

    def take(self, data: str, now: float) -> None:
        try:
            obj = json.loads(data)
        except ValueError:
            raise StreamError(f"malformed stream data: {data[:80]!r}") from None
        chunk = parse_chunk(obj)
        if chunk.error is not None:
            raise StreamError(f"error in the stream: {chunk.error}")
        if chunk.num_tokens:
            self.chunks.append((now, chunk.num_tokens))
            self.shown += chunk.num_tokens
            self.text.append(chunk.text)
            if chunk.token_ids:
                self.token_ids += chunk.token_ids
            else:
                self.ids_complete = False
            self.multi_token_chunks += chunk.num_tokens > 1
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage

    def record(self, counting: Counting, aborted: bool = False, held: float | None = None) -> RequestRecord:
        """The request's record; a finished one's output tokens are counted by openai_counts.py."""
        spec = self.spec
        sent = self.sent if self.sent is not None else self.scheduled
        ids = self.token_ids if self.ids_complete else []
        if aborted:
            reason = "abort"
        elif self.error is not None:
            reason = "failed"
        else:
            reason = "length" if self.finish_reason in (None, "length") else "stop"
        counted = self.count(counting) if reason in ("length", "stop") else None
        times = spread(self.chunks, counted.n if counted else self.shown)
        return RequestRecord(
            request_id=spec.request_id, input_len=spec.input_len, max_tokens=spec.max_tokens, arrival=sent,
            submitted=sent, first_scheduled=None, token_times=times, token_ids=list(ids), finish_reason=reason,
            num_cached_tokens=None, num_preemptions=None, error=self.error,
            client_queue=max(sent - self.scheduled, 0.0) if self.sent is not None else None,
            client_stall=held, **(_counted_fields(counted, self.usage) if counted else {}),
        )  # fmt: skip

    def count(self, counting: Counting) -> Counted:
        ids = len(self.token_ids) if self.ids_complete and self.token_ids else None
        usage = _int(self.usage, "completion_tokens")
        text = None
        if ids is None and usage is None and counting.count_text is not None:
            text = counting.count_text("".join(self.text))
        streamed = Streamed(
            self.spec.max_tokens, self.finish_reason, self.shown, ids, usage, text, self.spec.input_len,
            _int(self.usage, "prompt_tokens"), counting.ids_asked,
        )  # fmt: skip
        return settle(streamed, counting.ignore_eos)


def _counted_fields(counted: Counted, usage: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "reported_output_len": _int(usage, "completion_tokens"),
        "output_check": counted.output_check,
        "output_len_source": counted.source,
        "count_check": counted.count_check,
        "prompt_check": counted.prompt_check,
    }


def _int(usage: dict[str, Any] | None, key: str) -> int | None:
    value = (usage or {}).get(key)
    return int(value) if isinstance(value, (int, float)) else None


class Counting(NamedTuple):
    """What counting a finished request's output tokens needs from the scenario (openai_counts.py)."""

    ignore_eos: bool
    ids_asked: bool  # backend_options.openai.token_ids
    count_text: Callable[[str], int] | None  # the served model's tokenizer, where the scenario has it


class PointRun:
    """The state of one run point, kept outside the event loop so an interruption can still read it."""

    def __init__(self, specs: list[RequestSpec], clock: Callable[[], float]) -> None:
        self.specs = specs
        self.clock = clock
        self.start = clock()
        self.done: list[Flight] = []  # finished or failed, in the order they ended
        self.flights: dict[int, Flight] = {}
        self.not_submitted = len(specs)
        self.out_tokens = 0  # tokens the streams showed, for the live display


class Client:
    """Sends one completions request per spec: ``body_for`` builds the JSON body."""

    def __init__(
        self,
        endpoint: Endpoint,
        headers: dict[str, str],
        body_for: Callable[[RequestSpec], dict[str, Any]],
        *,
        timeout_s: float,
        connect_timeout_s: float,
        max_concurrency: int | None,
        counting: Counting,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.endpoint = endpoint
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **headers}
        self.body_for = body_for
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_concurrency = max_concurrency
        self.counting = counting
        self.clock = clock
        self.multi_token_chunks = 0  # chunks that carried more than one token, over every request sent
        self.loop_lag = LoopLag(0.0, 0.0, [])  # how late the client's loop woke over the last point

    async def _stream(self, flight: Flight) -> None:
        body = json.dumps(self.body_for(flight.spec)).encode()
        resp = await request(self.endpoint, "POST", body, self.headers, self.connect_timeout_s)
        try:
            if not 200 <= resp.status < 300:
                raise HTTPStatusError(resp.status, resp.reason, await read_error_body(resp))
            kind = resp.headers.get("content-type", "")
            if "json" in kind:  # a whole completion: the server ignored "stream": true
                start = (await read_error_body(resp))[:120]
                raise StreamError(
                    f"the server answered {kind}, not an event stream (text/event-stream): does it support "
                    f"stream: true? It sent: {start}"
                )
            events = 0
            async for event in sse_events(body_lines(resp)):
                now = self.clock()
                events += 1
                if event.data.strip() == "[DONE]":
                    flight.done = True
                    break
                if event.event == "error":
                    raise StreamError(f"error in the stream: {event.data[:200]}")
                flight.take(event.data, now)
        finally:
            await close(resp)
        if not flight.done and flight.finish_reason is None:
            what = "" if events else f" (no event at all: Content-Type {kind or 'not given'})"
            raise StreamError(
                f"the stream ended after {flight.shown} tokens without a finish_reason or [DONE]{what}"
            )

    async def send(self, flight: Flight) -> None:
        """Stream one request; whatever goes wrong becomes ``flight.error``."""
        flight.sent = self.clock()
        try:
            await asyncio.wait_for(self._stream(flight), self.timeout_s)
        except TimeoutError:
            flight.error = f"timeout: no complete response within timeout_s={self.timeout_s:g}"
        except HTTPStatusError as exc:
            flight.error = str(exc)
        except StreamError as exc:
            flight.error = f"stream: {exc}"
        except asyncio.IncompleteReadError:
            flight.error = f"connection dropped after {flight.shown} tokens (incomplete chunk)"
        except (OSError, ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            what = "dropped" if flight.shown else "failed"
            flight.error = f"connection {what} after {flight.shown} tokens: {exc or type(exc).__name__}"

    async def serve(
        self,
        state: PointRun,
        offsets: list[float] | None,
        concurrency: int | None,
        on_progress: Callable[[Progress], None] | None,
    ) -> None:
        limit = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        last_report = [-1.0]
        main = asyncio.current_task()
        assert main is not None

        async def one(i: int, scheduled: float) -> None:
            flight = Flight(state.specs[i], scheduled)
            state.flights[i] = flight
            state.not_submitted -= 1
            if limit is None:
                await self.send(flight)
            else:
                async with limit:
                    await self.send(flight)
            del state.flights[i]
            self.multi_token_chunks += flight.multi_token_chunks
            state.done.append(flight)
            state.out_tokens += flight.shown
            if on_progress is not None and self.clock() - last_report[0] >= PROGRESS_PERIOD_S:
                last_report[0] = self.clock()
                progress = Progress(
                    len(state.done), len(state.specs), state.out_tokens, last_report[0] - state.start,
                    float("nan"), len(state.flights),
                )  # fmt: skip
                try:
                    on_progress(progress)
                except KeyboardInterrupt:  # Ctrl-C landed in the display: stop the whole point, not this task
                    main.cancel()

        n = len(state.specs)
        if offsets is not None:
            tasks = []
            for i in sorted(range(n), key=lambda k: offsets[k]):
                due = state.start + offsets[i]
                wait = due - self.clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(one(i, due)))
            await asyncio.gather(*tasks)
        else:
            queue = deque(range(n))

            async def worker() -> None:
                while queue:
                    await one(queue.popleft(), self.clock())

            await asyncio.gather(*(worker() for _ in range(min(concurrency or 1, n))))

    def run(
        self,
        specs: list[RequestSpec],
        offsets: list[float] | None,
        concurrency: int | None,
        max_duration: float | None,
        on_progress: Callable[[Progress], None] | None,
    ) -> DriveResult:
        state = PointRun(specs, self.clock)
        status, error = "complete", None
        probe = LoopProbe(self.clock)

        async def main() -> None:
            ticker = asyncio.create_task(probe.run())
            try:
                await asyncio.wait_for(self.serve(state, offsets, concurrency, on_progress), max_duration)
            finally:
                ticker.cancel()

        try:
            asyncio.run(main())
        except TimeoutError:
            status = "timeout"
        except (KeyboardInterrupt, asyncio.CancelledError):
            status = "interrupted"
        except Exception:
            status, error = "failed", traceback.format_exc()
        end = self.clock()
        self.loop_lag = probe.lag()
        # Counting (a tokenizer, maybe) happens here, after the point, never on the loop it would delay.
        records = [self._record(f, False) for f in state.done]
        records += [self._record(f, True) for f in state.flights.values()]  # in flight at the stop
        if on_progress is not None and status == "complete":
            on_progress(
                Progress(len(records), len(specs), state.out_tokens, end - state.start, float("nan"), 0)
            )
        return DriveResult(records, [], state.start, end, status, error, state.not_submitted)

    def _record(self, flight: Flight, aborted: bool) -> RequestRecord:
        """``flight``'s record, with the longest hold-up of the loop between its send and its last token."""
        held_up = None
        if flight.sent is not None:
            held_up = held(self.loop_lag.stalls, flight.sent, flight.chunks[-1][0]) if flight.chunks else 0.0
        return flight.record(self.counting, aborted, held_up)
