"""Metrics against hand-built request timelines whose answers are known by construction."""

from __future__ import annotations

import math

import pytest

from llmbench.bench.metrics import meets_slo, request_metrics, request_summary, window
from llmbench.bench.records import RequestRecord
from llmbench.bench.scenario.schema import SLO
from llmbench.bench.stats import distribution


def rec(
    rid: str,
    arrival: float,
    sched: float | None,
    times: list[float],
    reason: str | None = "length",
    inp: int = 10,
    cached: int = 0,
) -> RequestRecord:
    return RequestRecord(
        rid, inp, len(times), arrival, arrival, sched, times, list(range(len(times))), reason, cached
    )


def test_request_metrics_follow_the_definitions():
    r = rec("a", 1.0, 1.5, [2.0, 2.5, 3.0, 4.0])
    m = request_metrics(r)
    assert m.queue == pytest.approx(0.5)
    assert m.ttft == pytest.approx(1.0)
    assert m.e2e == pytest.approx(3.0)
    assert m.tpot == pytest.approx((3.0 - 1.0) / 3)
    assert m.itl.tolist() == pytest.approx([0.5, 0.5, 1.0])
    assert m.output_len == 4


def test_one_token_has_no_tpot_and_no_token_has_nothing():
    m = request_metrics(rec("a", 0.0, 0.1, [0.3]))
    assert (
        m.ttft == pytest.approx(0.3)
        and m.e2e == pytest.approx(0.3)
        and math.isnan(m.tpot)
        and m.itl.size == 0
    )
    m = request_metrics(rec("b", 0.0, None, [], reason="abort"))
    assert math.isnan(m.ttft) and math.isnan(m.queue) and m.output_len == 0


def timeline() -> list[RequestRecord]:
    # Request i arrives at i, gets its first token at 2i + 1 (TTFT i + 1) and two more 0.5 s apart
    # (TPOT 0.5); one more request is aborted after one token. First arrival 0, last token 8.
    out = [rec(str(i), float(i), float(i), [2.0 * i + 1, 2.0 * i + 1.5, 2.0 * i + 2.0]) for i in range(4)]
    return [*out, rec("x", 1.0, 1.2, [1.4], reason="abort")]


def test_summary_percentiles_throughput_and_window():
    recs = timeline()
    s = request_summary(recs, SLO())
    # TTFTs 1, 2, 3, 4 (latencies are over finished requests), interpolated linearly between order
    # statistics: p50 sits at rank 0.5 * 3 = 1.5, halfway from 2 to 3; p99 at rank 0.99 * 3 = 2.97,
    # 0.97 of the way from 3 to 4.
    assert s["ttft_p50"] == pytest.approx(2.5)
    assert s["ttft_p99"] == pytest.approx(3.97)
    assert s["ttft_mean"] == pytest.approx(2.5)
    assert s["tpot_p50"] == pytest.approx(0.5) and s["itl_p90"] == pytest.approx(0.5)
    start, end = window(recs)
    assert (start, end) == (0.0, 8.0)  # first arrival -> last token
    assert s["duration"] == pytest.approx(8.0)
    assert s["output_tokens"] == 13  # the aborted request's token counts: it was produced in the window
    assert s["output_throughput"] == pytest.approx(13 / 8.0)
    assert s["total_throughput"] == pytest.approx((13 + 5 * 10) / 8.0)
    assert s["request_throughput"] == pytest.approx(4 / 8.0)
    assert s["num_completed"] == 4 and s["num_aborted"] == 1
    assert math.isnan(s["goodput"]) and math.isnan(s["slo_attainment"])  # no SLO, no goodput


def test_goodput_counts_requests_meeting_every_slo():
    recs = timeline()
    s = request_summary(recs, SLO(ttft_ms=2500, tpot_ms=600))
    assert s["goodput"] == pytest.approx(2 / 8.0)  # TTFT 1 s and 2 s pass
    assert s["slo_attainment"] == pytest.approx(0.5)  # of the 4 finished; the aborted one is neither
    assert request_summary(recs, SLO(tpot_ms=400))["goodput"] == 0.0
    # A failed request met no SLO: 2 of 6 attained, the goodput unchanged
    failed = [rec("f1", 0.5, None, [], reason="failed"), rec("f2", 0.6, None, [], reason="failed")]
    s = request_summary(recs + failed, SLO(ttft_ms=2500, tpot_ms=600))
    assert s["slo_attainment"] == pytest.approx(2 / 6) and s["goodput"] == pytest.approx(2 / 8.0)


def test_slo_checks_each_target():
    m = request_metrics(rec("a", 0.0, 0.0, [0.1, 0.2]))  # TTFT 100 ms, TPOT 100 ms, E2E 200 ms
    assert meets_slo(m, SLO(ttft_ms=100, tpot_ms=100, e2e_ms=200))
    assert not meets_slo(m, SLO(ttft_ms=99))
    assert not meets_slo(m, SLO(tpot_ms=99))
    assert not meets_slo(m, SLO(e2e_ms=199))
    single = request_metrics(rec("b", 0.0, 0.0, [0.1]))
    assert meets_slo(single, SLO(tpot_ms=1))  # no TPOT to miss


def test_prefix_cache_hit_rate_and_arrival_lag():
    recs = [rec("a", 0.0, 0.0, [1.0], inp=100, cached=64), rec("b", 0.0, 0.0, [1.0], inp=100, cached=0)]
    recs[1] = recs[1]._replace(submitted=0.25)
    s = request_summary(recs, SLO())
    assert s["prefix_cache_hit_rate"] == pytest.approx(64 / 200)
    assert s["arrival_lag_max"] == pytest.approx(0.25)


def test_distribution_ignores_nan_and_is_nan_when_empty():
    d = distribution([1.0, 2.0, math.nan, 3.0])
    assert d["p50"] == 2.0 and d["mean"] == 2.0
    assert all(math.isnan(v) for v in distribution([]).values())
