"""Serving one run point through an OpenAI-compatible server: streamed requests on one asyncio loop.

Open loop: each request is due at its scheduled time; closed loop: N requests are kept in flight. A
``max_concurrency`` limit holds requests in the client until a slot frees. A request's clock starts when
it is *sent* (its ``arrival`` in the record, so TTFT and E2E are the server's), and the time it waited in
the client before that -- behind the limit, or behind a busy event loop -- is its ``client_queue``,
reported as its own figure. Every token is stamped with ``time.perf_counter()`` when the SSE event that
carries it has been read; tokens that share a chunk share its time.

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
from typing import Any

from llmbench.bench.backends.openai_http import (
    Endpoint,
    HTTPStatusError,
    body_lines,
    close,
    read_error_body,
    request,
    sse_events,
)
from llmbench.bench.backends.openai_stream import output_check, parse_chunk
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
        self.token_times: list[float] = []
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
            self.token_times += [now] * chunk.num_tokens
            if chunk.token_ids:
                self.token_ids += chunk.token_ids
            else:
                self.ids_complete = False
            self.multi_token_chunks += chunk.num_tokens > 1
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage

    def record(self, ignore_eos: bool, aborted: bool = False) -> RequestRecord:
        spec = self.spec
        sent = self.sent if self.sent is not None else self.scheduled
        ids = self.token_ids if self.ids_complete else []
        usage = self.usage or {}
        reported = usage.get("completion_tokens")
        reported = int(reported) if isinstance(reported, (int, float)) else None
        if aborted:
            reason = "abort"
        elif self.error is not None:
            reason = "failed"
        else:
            reason = "length" if self.finish_reason in (None, "length") else "stop"
        check = None
        if reason in ("length", "stop"):
            prompt = usage.get("prompt_tokens")
            check = output_check(
                spec.max_tokens, len(self.token_times), reported, ignore_eos, spec.input_len,
                int(prompt) if isinstance(prompt, (int, float)) else None,
            )  # fmt: skip
        return RequestRecord(
            spec.request_id, spec.input_len, spec.max_tokens, sent, sent, None, list(self.token_times),
            list(ids), reason, num_cached_tokens=None, num_preemptions=None, error=self.error,
            client_queue=max(sent - self.scheduled, 0.0) if self.sent is not None else None,
            reported_output_len=reported if reason in ("length", "stop") else None, output_check=check,
        )  # fmt: skip


class PointRun:
    """The state of one run point, kept outside the event loop so an interruption can still read it."""

    def __init__(self, specs: list[RequestSpec], clock: Callable[[], float]) -> None:
        self.specs = specs
        self.clock = clock
        self.start = clock()
        self.records: list[RequestRecord] = []
        self.flights: dict[int, Flight] = {}
        self.not_submitted = len(specs)
        self.out_tokens = 0


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
        ignore_eos: bool,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.endpoint = endpoint
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **headers}
        self.body_for = body_for
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_concurrency = max_concurrency
        self.ignore_eos = ignore_eos
        self.clock = clock
        self.multi_token_chunks = 0  # chunks that carried more than one token, over every request sent

    async def _stream(self, flight: Flight) -> None:
        body = json.dumps(self.body_for(flight.spec)).encode()
        resp = await request(self.endpoint, "POST", body, self.headers, self.connect_timeout_s)
        try:
            if not 200 <= resp.status < 300:
                raise HTTPStatusError(resp.status, resp.reason, await read_error_body(resp))
            async for event in sse_events(body_lines(resp)):
                now = self.clock()
                if event.data.strip() == "[DONE]":
                    flight.done = True
                    break
                if event.event == "error":
                    raise StreamError(f"error in the stream: {event.data[:200]}")
                flight.take(event.data, now)
        finally:
            await close(resp)
        if not flight.done and flight.finish_reason is None:
            raise StreamError(
                f"the stream ended after {len(flight.token_times)} tokens without a finish_reason or [DONE]"
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
            flight.error = f"connection dropped after {len(flight.token_times)} tokens (incomplete chunk)"
        except (OSError, ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            what = "dropped" if flight.token_times else "failed"
            flight.error = (
                f"connection {what} after {len(flight.token_times)} tokens: {exc or type(exc).__name__}"
            )

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
            rec = flight.record(self.ignore_eos)
            state.records.append(rec)
            state.out_tokens += rec.num_output_tokens if rec.finished else len(rec.token_times)
            if on_progress is not None and self.clock() - last_report[0] >= PROGRESS_PERIOD_S:
                last_report[0] = self.clock()
                done = len(state.records)
                progress = Progress(
                    done, len(state.specs), state.out_tokens, last_report[0] - state.start, float("nan"),
                    len(state.flights),
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

        async def main() -> None:
            await asyncio.wait_for(self.serve(state, offsets, concurrency, on_progress), max_duration)

        try:
            asyncio.run(main())
        except TimeoutError:
            status = "timeout"
        except (KeyboardInterrupt, asyncio.CancelledError):
            status = "interrupted"
        except Exception:
            status, error = "failed", traceback.format_exc()
        # What was still in flight when the run stopped.
        state.records += [f.record(self.ignore_eos, aborted=True) for f in state.flights.values()]
        end = self.clock()
        if on_progress is not None and status == "complete":
            on_progress(
                Progress(len(state.records), len(specs), state.out_tokens, end - state.start, float("nan"), 0)
            )
        return DriveResult(state.records, [], state.start, end, status, error, state.not_submitted)
