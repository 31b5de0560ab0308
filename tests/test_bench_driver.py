"""The driver against the real engine (qwen3-tiny on the CPU): arrivals, concurrency, interruption."""

from __future__ import annotations

import numpy as np
import pytest
from still_clock import StillClock

from llmbench.bench import driver as driver_mod
from llmbench.bench.driver import drive
from llmbench.bench.workload.spec import RequestSpec
from llmbench.engine.config import EngineConfig
from llmbench.engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine():
    from llmbench.engine.llm_engine import LLMEngine

    e = LLMEngine(EngineConfig.from_options("qwen3-tiny", device="cpu"))
    yield e
    e.shutdown()


def specs(n: int, inp: int = 12, out: int = 5, seed: int = 0) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    return [RequestSpec(str(i), rng.integers(0, 4096, inp).tolist(), out) for i in range(n)]


def greedy(spec: RequestSpec) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True)


def test_offline_run_completes_every_request_with_exact_lengths(engine):
    reqs = specs(6, out=4)
    res = drive(engine, reqs, [0.0] * 6, greedy, tag="off-")
    assert res.status == "complete" and res.error is None and res.not_submitted == 0
    assert sorted(r.request_id for r in res.requests) == [str(i) for i in range(6)]
    for r in res.requests:
        assert r.finish_reason == "length" and len(r.token_ids) == 4 and r.input_len == 12
        assert r.arrival == res.start  # scheduled at t=0
        assert r.arrival <= r.first_scheduled <= r.token_times[0]
        assert r.token_times == sorted(r.token_times)
    assert res.steps and all(s.kind in ("prefill", "decode", "mixed") for s in res.steps)
    decode = [s for s in res.steps if s.kind == "decode"]
    assert decode and decode[0].decode_context_tokens > 0


def test_open_loop_gives_the_engine_the_scheduled_arrival(engine):
    offsets = [0.0, 0.05, 0.1, 0.3]
    res = drive(engine, specs(4), offsets, greedy, tag="poi-")
    assert res.status == "complete"
    by_id = {r.request_id: r for r in res.requests}
    for i, off in enumerate(offsets):
        r = by_id[str(i)]
        assert r.arrival - res.start == pytest.approx(off, abs=1e-9)
        assert r.submitted >= r.arrival  # handed over at or after its due time


def test_fixed_concurrency_keeps_n_in_flight(engine):
    res = drive(engine, specs(9, out=6), None, greedy, concurrency=3, tag="conc-")
    assert res.status == "complete" and len(res.requests) == 9
    events = sorted(
        [(r.submitted, 1) for r in res.requests] + [(r.token_times[-1], -1) for r in res.requests]
    )
    in_flight = np.cumsum([d for _, d in sorted(events, key=lambda e: (e[0], e[1]))])
    assert in_flight.max() == 3
    for r in res.requests:
        assert r.arrival == r.submitted  # closed loop: arrival is the hand-over


def test_interrupt_keeps_what_was_measured_and_aborts_the_rest(engine, monkeypatch):
    monkeypatch.setattr(driver_mod, "PROGRESS_PERIOD_S", 0.0)
    calls = []

    def progress(p):
        calls.append(p)
        if len(calls) == 3:
            raise KeyboardInterrupt

    res = drive(
        engine, specs(5, out=50), [0.0, 0.0, 0.0, 10.0, 10.0], greedy, tag="int-", on_progress=progress
    )
    assert res.status == "interrupted"
    assert res.not_submitted == 2
    assert {r.finish_reason for r in res.requests} == {"abort"}
    assert all(0 < len(r.token_ids) < 50 for r in res.requests)
    assert not engine.has_unfinished()


def test_engine_error_is_a_failed_result_not_a_crash(engine):
    bad = [RequestSpec("0", [1, 2, 3], 2), RequestSpec("1", [10**9], 2)]
    res = drive(engine, bad, [0.0, 0.0], greedy, tag="bad-")
    assert res.status == "failed" and "outside" in res.error
    assert not engine.has_unfinished()


def test_max_duration_stops_with_timeout(engine):
    clock = StillClock()
    res = drive(
        engine, specs(3, out=3), [0.0, 5.0, 5.0], greedy, tag="tmo-", max_duration=0.2,
        clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    assert res.status == "timeout" and res.not_submitted == 2
    assert [r.finish_reason for r in res.requests] == ["length"]


def test_a_run_needs_a_schedule_or_a_concurrency(engine):
    with pytest.raises(ValueError, match="open loop"):
        drive(engine, specs(1), None, greedy)


def test_an_open_loop_under_a_cap_holds_due_requests_in_the_client(engine):
    # All due at once, at most 2 in flight (vLLM's --request-rate with --max-concurrency): the held ones
    # count their latencies from the hand-over, and the wait before it is their client queue.
    res = drive(engine, specs(6, out=6), [0.0] * 6, greedy, concurrency=2, tag="cap-")
    assert res.status == "complete" and len(res.requests) == 6
    events = sorted(
        [(r.submitted, 1) for r in res.requests] + [(r.token_times[-1], -1) for r in res.requests]
    )
    assert np.cumsum([d for _, d in sorted(events, key=lambda e: (e[0], e[1]))]).max() == 2
    for r in res.requests:
        assert r.arrival == r.submitted
        assert r.client_queue == pytest.approx(r.submitted - res.start, abs=1e-9)  # scheduled at t=0
    waits = sorted(r.client_queue for r in res.requests)
    assert waits[1] < 0.01 < waits[2] and waits[4] > waits[2]  # two at once, the rest behind them
