"""Single-stream serving through ``model.generate``: one request at a time, a streamer stamps each token.

This is the peer for latency-floor scenarios (``arrival: {kind: concurrency, concurrency: 1}``), where
transformers' best path is ``generate`` with a static KV cache (and optionally ``torch.compile``), not
its batch scheduler. Open-loop arrivals are served in order, one at a time: a request that arrives while
another runs waits, and that wait is its queue time (arrival -> its ``generate`` call).

Token times: ``generate`` hands every new token to the streamer right after sampling it; the streamer
copies it to the host (``tolist``, which waits for the device) and stamps ``time.perf_counter()`` -- the
host time the token became known to the host, as the engine's times are.
"""

from __future__ import annotations

import time
import traceback
from collections import deque
from typing import Any

from transformers.generation.streamers import BaseStreamer

from llmbench.bench.backends.base import OnProgress
from llmbench.bench.driver import PROGRESS_PERIOD_S, DriveResult, Progress, hand_over
from llmbench.bench.records import RequestRecord
from llmbench.bench.workload.spec import RequestSpec


class TimingStreamer(BaseStreamer):
    """A transformers streamer (``put``/``end``) that keeps each new token id with its host time."""

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self.clock = clock
        self.prompt_seen = False
        self.token_ids: list[int] = []
        self.token_times: list[float] = []

    def put(self, value: Any) -> None:
        ids = value.reshape(-1).tolist()  # waits for the device: the token is on the host from here
        now = self.clock()
        if not self.prompt_seen:  # generate() first puts the prompt itself
            self.prompt_seen = True
            return
        self.token_ids += ids
        self.token_times += [now] * len(ids)

    def end(self) -> None:
        pass


def _check(spec: RequestSpec, tokens: list[int], ignore_eos: bool) -> str | None:
    if len(tokens) > spec.max_tokens or (ignore_eos and len(tokens) != spec.max_tokens):
        return f"asked for {spec.max_tokens} tokens, got {len(tokens)}"
    return None


def run_generate(
    model: Any,
    generation_config: Any,
    specs: list[RequestSpec],
    offsets: list[float] | None,
    *,
    concurrency: int | None,
    eos: set[int],
    ignore_eos: bool,
    max_duration: float | None,
    on_progress: OnProgress | None,
    clock: Any = time.perf_counter,
) -> DriveResult:
    import torch

    if offsets is None and concurrency != 1:
        raise ValueError(f"generate serves one request at a time; concurrency {concurrency} needs batching")
    order = range(len(specs)) if offsets is None else sorted(range(len(specs)), key=lambda i: offsets[i])
    pending = deque(order)
    records: list[RequestRecord] = []
    status, error = "complete", None
    out_tokens, last_report = 0, -1.0
    start = clock()
    current: tuple[RequestSpec, float, float] | None = None
    streamer: TimingStreamer | None = None
    try:
        while pending:
            if max_duration is not None and clock() - start > max_duration:
                status = "timeout"
                break
            i = pending.popleft()
            spec = specs[i]
            scheduled = None if offsets is None else start + offsets[i]
            if scheduled is not None and scheduled > clock():
                time.sleep(scheduled - clock())
            begun = clock()
            # one request at a time: under a cap, the wait behind the one before is the client's
            arrival, queued = hand_over(begun, scheduled, offsets is not None and concurrency is not None)
            current, streamer = (spec, arrival, begun), TimingStreamer(clock)
            ids = torch.tensor([spec.prompt], device=model.device)
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                generation_config=generation_config,
                max_new_tokens=spec.max_tokens,
                streamer=streamer,
            )
            tokens = streamer.token_ids[: spec.max_tokens]
            stopped = bool(tokens) and tokens[-1] in eos and not ignore_eos and len(tokens) < spec.max_tokens
            records.append(
                RequestRecord(
                    request_id=spec.request_id, input_len=spec.input_len, max_tokens=spec.max_tokens,
                    arrival=arrival, submitted=arrival, first_scheduled=begun,
                    token_times=streamer.token_times[: len(tokens)], token_ids=tokens,
                    finish_reason="stop" if stopped else "length", num_cached_tokens=None, num_preemptions=None, client_queue=queued,
                    output_check=_check(spec, tokens, ignore_eos),
                )
            )  # fmt: skip
            current = None
            out_tokens += len(tokens)
            if on_progress is not None and clock() - last_report >= PROGRESS_PERIOD_S:
                last_report = clock()
                on_progress(
                    Progress(len(records), len(specs), out_tokens, last_report - start, float("nan"), 0)
                )
    except KeyboardInterrupt:
        status = "interrupted"
    except Exception:
        status, error = "failed", traceback.format_exc()
    if current is not None and streamer is not None:  # stopped mid-request: keep what it produced
        spec, arrival, begun = current
        records.append(
            RequestRecord(
                request_id=spec.request_id, input_len=spec.input_len, max_tokens=spec.max_tokens,
                arrival=arrival, submitted=arrival, first_scheduled=begun,
                token_times=list(streamer.token_times), token_ids=list(streamer.token_ids),
                finish_reason="abort", num_cached_tokens=None, num_preemptions=None,
            )
        )  # fmt: skip
    end = clock()
    if on_progress is not None and status == "complete":
        on_progress(Progress(len(records), len(specs), out_tokens, end - start, float("nan"), 0))
    return DriveResult(records, [], start, end, status, error, len(pending))
