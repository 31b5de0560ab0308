"""The serving loop's shared behaviour (timeout, interruption, a server that stops) on transformers'
continuous batching, which the engine's tests (test_bench_driver.py) do not reach: a stand-in batch
manager that finishes each request on the first result it is asked for, and a clock that moves only
when the loop sleeps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from still_clock import StillClock

from llmbench.bench import driver as driver_mod
from llmbench.bench.backends.transformers_cb import run_continuous_batching
from llmbench.bench.workload.spec import RequestSpec


class Manager:
    """Transformers' manager as the loop sees it; ``stalls`` keeps it from ever returning a result."""

    def __init__(self, clock: StillClock, stalls: bool = False, running: bool = True) -> None:
        self.clock, self.stalls, self.running = clock, stalls, running
        self.queue: list[SimpleNamespace] = []
        self.cancelled: list[str] = []

    def add_request(self, prompt, request_id, max_new_tokens, eos_token_id, record_timestamps=False):
        tokens = list(range(max_new_tokens))
        self.queue.append(
            SimpleNamespace(
                request_id=request_id, generated_tokens=tokens, timestamps=[self.clock()] * len(tokens),
                lifespan=(self.clock(), self.clock()), error=None, is_finished=lambda: True,
            )
        )  # fmt: skip

    def get_result(self, timeout: float):
        return None if self.stalls or not self.queue else self.queue.pop(0)

    def is_running(self) -> bool:
        return self.running

    def cancel_request(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def specs(n: int) -> list[RequestSpec]:
    return [RequestSpec(str(i), [1, 2, 3], 4) for i in range(n)]


def run(manager: Manager, clock: StillClock, offsets, **kw):
    kw = {"concurrency": None, "max_duration": None, "on_progress": None, **kw}
    return run_continuous_batching(
        manager, specs(len(offsets)), offsets, eos={0}, ignore_eos=True, tag="cb-", clock=clock,
        sleep=clock.sleep, **kw,
    )  # fmt: skip


def test_an_open_loop_completes_with_scheduled_arrivals():
    clock = StillClock()
    res = run(Manager(clock), clock, [0.0, 0.5, 1.0])
    assert res.status == "complete" and res.not_submitted == 0 and res.steps == []
    assert [r.arrival - res.start for r in res.requests] == [0.0, 0.5, 1.0]
    assert all(r.finish_reason == "length" and len(r.token_ids) == 4 for r in res.requests)


def test_max_duration_stops_continuous_batching_with_timeout():
    clock = StillClock()
    res = run(Manager(clock), clock, [0.0, 5.0, 5.0], max_duration=0.2)
    assert res.status == "timeout" and res.not_submitted == 2
    assert [r.finish_reason for r in res.requests] == ["length"]


def test_an_interrupt_cancels_what_is_in_flight_and_keeps_it(monkeypatch):
    monkeypatch.setattr(driver_mod, "PROGRESS_PERIOD_S", 0.0)
    clock = StillClock()
    manager = Manager(clock, stalls=True)

    def progress(p):
        raise KeyboardInterrupt

    res = run(manager, clock, [0.0, 0.0, 10.0], on_progress=progress)
    assert res.status == "interrupted" and res.not_submitted == 1
    assert sorted(manager.cancelled) == ["cb-0", "cb-1"]
    assert [r.finish_reason for r in res.requests] == ["abort", "abort"]


def test_a_generation_thread_that_stops_fails_the_run_with_its_reason():
    clock = StillClock()
    res = run(Manager(clock, stalls=True, running=False), clock, [0.0, 0.0])
    assert res.status == "failed"
    assert res.error == "the transformers generation thread stopped before every request finished"
    assert [r.finish_reason for r in res.requests] == ["abort", "abort"]


def test_a_run_needs_a_schedule_or_a_concurrency():
    clock = StillClock()
    with pytest.raises(ValueError, match="open loop"):
        run_continuous_batching(
            Manager(clock), specs(1), None, concurrency=None, eos=set(), ignore_eos=True, tag="",
            max_duration=None, on_progress=None,
        )  # fmt: skip
