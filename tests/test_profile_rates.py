"""The top kernels of a profile (summary.py ``_kernels``, views.py ``kernels_view``), from small traces
written by hand: a rate is over the calls whose cost is known, in their own time (a call replayed from a
CUDA graph records no shapes), and the table covers the steps the breakdown's means cover."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_profile_trace import gpu_step, host, kernel, launch

from llmbench.bench.peaks import PeakUsed
from llmbench.bench.profile.summary import summarise, write_trace
from llmbench.bench.profile.views import kernels_view

GEMM = "nvjet_tst_128x64_64x3_1x2_h_bz_coopA_NNT"
PEAK = PeakUsed(4e12, 1e9, "bfloat16", "measured", None, None, None)
EAGER_FLOPS = 2 * 4 * 64 * 128  # gpu_step's aten::mm: (4, 64) @ (64, 128)


def graph_step(offset: float, corr: int, extra: str | None = None) -> list[dict]:
    """A 100 us step replayed from a CUDA graph: the GEMM of ``gpu_step`` (30 us), launched by no op."""
    t = offset
    events = [
        host("user_annotation", "llmbench.step", t, 100),
        host("user_annotation", "llmbench.graph_replay", t, 10),
        launch(t + 5, corr, "cudaGraphLaunch"),
        kernel(GEMM, t + 20, 30, corr),
    ]
    if extra:
        events.append(kernel(extra, t + 60, 10, corr))
    return events


def call(i: int, slow: bool = False) -> dict[str, Any]:
    return {
        "call": i, "step": 10 + i, "kind": "decode", "num_seqs": 4, "prefill_tokens": 0, "decode_tokens": 4,
        "graph_bucket": None, "engine_time": 1e-4, "call_time": 1e-4, "window": True, "slow": slow,
        "causes": ["unexplained"] if slow else [], **({"ratio": 9.0} if slow else {}),
    }  # fmt: skip


def profile_of(tmp_path: Path, steps: list[list[dict]], slow: set[int] = frozenset()) -> dict[str, Any]:
    write_trace(tmp_path / "trace-rank0.json.gz", {"traceEvents": [e for s in steps for e in s]})
    record = {
        "calls": [call(i, i in slow) for i in range(len(steps))],
        "chunks": [{"file": "trace-rank{rank}.json.gz", "calls": list(range(len(steps)))}],
        "steps_per_kind": len(steps), "slow_steps": False, "slow_factor": 5.0, "window_counts": {},
    }  # fmt: skip
    return summarise(tmp_path, record, "v", "cuda:0", PEAK, "measured", "complete")


def test_a_gemm_rate_is_over_the_eager_calls_in_their_own_time_not_over_graph_replays(tmp_path):
    p = profile_of(tmp_path, [gpu_step(0), graph_step(200, 500), graph_step(400, 501)])
    (gemm,) = [k for k in p["kernels"] if k["name"] == GEMM]
    assert gemm["count"] == 3 and gemm["total"] == pytest.approx(80e-6)
    assert gemm["rated_calls"] == 1
    # the eager call's FLOPs over its own 20 us, not over the 80 us of all three calls
    assert gemm["flops_per_s"] == pytest.approx(EAGER_FLOPS / 20e-6)
    assert gemm["flops_peak_frac"] == pytest.approx(EAGER_FLOPS / 20e-6 / PEAK.matmul_flops)
    view = kernels_view(p)
    row = next(r for r in view.rows if r[0] == GEMM)
    assert row[view.headers.index("rated calls")] == "1 of 3"
    assert any("CUDA graph" in n and "no shapes" in n for n in view.notes), view.notes


def test_a_kernel_only_replayed_from_graphs_has_no_rate_and_the_table_says_why(tmp_path):
    p = profile_of(tmp_path, [graph_step(0, 500), graph_step(200, 501)])
    (gemm,) = [k for k in p["kernels"] if k["name"] == GEMM]
    assert gemm["rated_calls"] == 0 and gemm["flops_per_s"] is None and gemm["flops_peak_frac"] is None
    view = kernels_view(p)
    row = next(r for r in view.rows if r[0] == GEMM)
    assert row[view.headers.index("TFLOP/s")] == "–" and row[view.headers.index("rated calls")] == "0 of 2"
    assert any("CUDA graph" in n for n in view.notes), view.notes


def test_every_call_rated_needs_no_column_and_no_note(tmp_path):
    p = profile_of(tmp_path, [gpu_step(0), gpu_step(200)])
    view = kernels_view(p)
    assert "rated calls" not in view.headers and view.notes == ()
    row = next(r for r in view.rows if r[0] == GEMM)
    assert row[view.headers.index("TFLOP/s")] == f"{EAGER_FLOPS / 20e-6 / 1e12:.3f}"


def test_the_top_kernels_leave_out_the_slow_steps_the_breakdowns_means_leave_out(tmp_path):
    steps = [gpu_step(0), gpu_step(200), graph_step(400, 900, extra="stall_kernel")]
    p = profile_of(tmp_path, steps, slow={2})
    assert p["kinds"]["decode"]["steps"] == 2
    names = {k["name"] for k in p["kernels"]}
    assert "stall_kernel" not in names
    (gemm,) = [k for k in p["kernels"] if k["name"] == GEMM]
    assert gemm["count"] == 2  # the slow step's GEMM is not counted
    (note,) = kernels_view(p).notes
    assert "1 slow step" in note and "left out" in note


def _legacy(cuda_graph: bool | None) -> dict[str, Any]:
    """A profile.json written before kernels carried ``rated_calls``: its rate divided the FLOPs of the
    calls with shapes by the time of all calls."""
    rated = {
        "flops_per_s": 3.9e11,
        "bytes_per_s": 1.9e9,
        "flops_peak_frac": 5e-4,
        "bandwidth_peak_frac": 4e-4,
    }
    rows = [
        {"name": GEMM, "category": "GEMM", "count": 2231, "total": 0.2, "mean": 9e-5, **rated},
        {"name": "Memset (Device)", "category": "copies", "count": 9, "total": 1e-5, "mean": 1e-6, **rated},
    ]
    return {
        "variant": "baseline", "mode": "cuda", "device": "cuda", "kernels": rows, "steps": [],
        "peak": {"source": "measured"}, "cuda_graph": cuda_graph,
    }  # fmt: skip


@pytest.mark.parametrize("cuda_graph", [True, None])
def test_a_stored_profile_that_cannot_tell_replayed_calls_shows_no_rate_and_says_so(cuda_graph):
    view = kernels_view(_legacy(cuda_graph))
    for row in view.rows:
        assert row[5:] == ["–"] * 4, row
    assert any("record the profile again" in n for n in view.notes), view.notes


def test_a_stored_profile_without_graphs_keeps_its_rates_but_a_copy_computes_none():
    view = kernels_view(_legacy(False))
    gemm, memset = view.rows
    assert gemm[5] == "0.390" and memset[5:] == ["–"] * 4
