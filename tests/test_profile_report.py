"""A stored profile reads the same through ``llmbench report --view profile`` as ``llmbench profile``
printed it: every view of each variant (bench/profile/caveats.py ``variant_views``), then the comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmbench.bench.profile.caveats import comparison_view, variant_views
from llmbench.bench.report import build_report
from llmbench.bench.report.profile_views import profile_problem


def _profile(variant: str, scale: float) -> dict[str, Any]:
    """A variant's profile.json with something for every view: kinds, kernels, two ranks, slow steps."""
    kind = {
        "steps": 8, "wall": 0.002 * scale, "engine_time": 0.0021 * scale, "traced_median": 0.002 * scale,
        "untraced_median": 0.0019 * scale, "untraced_wait": 0.001, "busy": 0.0015 * scale,
        "device": {"GEMM": 0.001 * scale, "attention": 0.0005 * scale}, "idle": 0.0005 * scale,
        "waited_for": {"schedule": 0.0005 * scale}, "overlap": 0.0, "launches": 12.0,
    }  # fmt: skip
    kernel = {
        "name": "nvjet_tst_128x64_64x3_1x2_h_bz_coopA_NNT", "category": "GEMM", "count": 8, "total": 0.008,
        "mean": 0.001, "rated_calls": 8, "flops_per_s": 4e14, "bytes_per_s": 1e12, "flops_peak_frac": 0.5,
        "bandwidth_peak_frac": 0.3,
    }  # fmt: skip
    rank = {"steps": 8, "wall": 0.002, "busy": 0.0015, "device": {"GEMM": 0.001}, "idle": 0.0005}
    slow = {
        "step": 40, "kind": "decode", "causes": ["Triton compile"], "engine_time": 0.05, "ratio": 25.0,
        "wall": 0.05, "device": {"GEMM": 0.001}, "idle": 0.049, "prefill_tokens": 0, "decode_tokens": 8,
        "num_seqs": 8,
    }  # fmt: skip
    return {
        "variant": variant, "status": "complete", "device": "cuda:0", "mode": "cuda", "steps_per_kind": 8,
        "slow_steps_recorded": True, "slow_factor": 5.0,
        "peak": {"matmul_flops": 8e14, "mem_bandwidth": 3.3e12, "source": "datasheet"},
        "traces": ["trace-steps32-47-rank0.json.gz"], "kinds": {"decode": kind},
        "ranks": [{"rank": 0, **rank}, {"rank": 1, **rank}], "kernels": [kernel], "slow_steps": [slow],
        "steps": [], "notes": ["decode: 8 step(s) of the 20 asked for; the window held no more of them"],
    }  # fmt: skip


def _stored(folder: Path, profile: dict[str, Any]) -> None:
    """A variant's folder as ``llmbench profile`` leaves it: its run and, beside it, its profile.json."""
    run = folder / profile["variant"] / "run"
    run.mkdir(parents=True)
    repeats = [{"repeat": 0, "status": "complete", "metrics": {"tpot_p50": 0.002}}]
    summary = {"status": "complete", "points": [{"label": "offline", "repeats": repeats, "metrics": {}}]}
    child = ["llmbench", "run", "prof.yaml", "--trace-dir", str(run.parent)]  # as profile starts its children
    meta = {
        "status": "complete",
        "scenario_name": "prof",
        "variant": profile["variant"],
        "command_line": child,
    }
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "summary.json").write_text(json.dumps(summary))
    (run.parent / "profile.json").write_text(json.dumps(profile))


def test_a_stored_profile_reads_the_same_through_report_as_the_command_printed_it(tmp_path):
    base, other = _profile("baseline", 1.0), _profile("x", 1.2)
    for p in (base, other):
        _stored(tmp_path, p)
    (section,) = build_report([tmp_path], views=["profile"]).sections
    printed = [  # as ``llmbench profile`` prints them (cli/profile.py)
        *variant_views(base),
        *variant_views(other),
        comparison_view("baseline", "x", base, other),
    ]
    assert [(v.title, v.rows, v.notes) for v in section.views] == [
        (v.title, v.rows, v.notes) for v in printed
    ]
    titles = [v.title for v in section.views]
    for shown in ("top kernels", "each rank", "slow steps recorded by cause", "slow steps recorded (>"):
        assert any(shown in t for t in titles), (shown, titles)  # so that the comparison is no empty one


def test_a_profile_that_one_of_its_views_cannot_read_is_said_so():
    broken = _profile("baseline", 1.0)
    del broken["kernels"][0]["count"]  # read by the top kernels view alone
    assert "KeyError" in profile_problem(broken)


def test_a_variant_whose_profile_json_is_missing_is_said_so_not_dropped_in_silence(tmp_path):
    for p in (_profile("baseline", 1.0), _profile("x", 1.2)):
        _stored(tmp_path / "prof", p)
    missing = tmp_path / "prof" / "baseline" / "profile.json"
    missing.unlink()
    plain = tmp_path / "plain" / "run"  # a run `llmbench run` made: no profile.json belongs beside it
    plain.mkdir(parents=True)
    meta = {
        "status": "complete",
        "scenario_name": "other",
        "variant": "v",
        "command_line": ["llmbench", "run"],
    }
    (plain / "meta.json").write_text(json.dumps(meta))
    (plain / "summary.json").write_text(json.dumps({"status": "complete", "points": []}))
    report = build_report([tmp_path], views=["profile"])
    said = [(d.path, d.reason) for d in report.doubts]
    assert len(said) == 1 and said[0][0] == missing, said
    assert said[0][1].startswith("missing") and said[0][1].endswith("its profile is not shown")


def test_a_slow_steps_ms_is_the_engine_step_time_its_ratio_is_of_beside_the_traced_call():
    from llmbench.bench.profile.views import slow_view

    p = _profile("baseline", 1.0)
    p["slow_steps"][0].update(engine_time=0.4208, wall=0.016146, ratio=267.1)
    view = slow_view(p)
    (row,) = view.rows
    assert row[view.headers.index("engine step ms")] == "420.800"
    assert row[view.headers.index("x median")] == "267.1"
    assert any(
        n.startswith("engine step ms: the engine's own step time, what x median divides") for n in view.notes
    )
    assert row[view.headers.index("traced call ms")] == "16.146"


def test_a_cpu_profile_shows_no_host_wait_on_a_device():
    from llmbench.bench.profile.views import breakdown_view

    gpu = _profile("baseline", 1.0)
    cpu = {**gpu, "mode": "cpu", "device": "cpu"}
    assert any("host waiting on the device" in r[0] for r in breakdown_view(gpu).rows)
    assert not any("host waiting on the device" in r[0] for r in breakdown_view(cpu).rows)


def test_the_profile_bars_mark_each_untraced_median_and_say_what_bar_and_mark_are(tmp_path):
    from llmbench.bench.report.frame import load_groups
    from llmbench.bench.report.profile_views import profile_bars, untraced_marks

    base, other = _profile("baseline", 1.0), _profile("x", 1.2)
    prefill = {**base["kinds"]["decode"], "untraced_median": None, "untraced_wait": None}
    base["kinds"]["prefill"] = other["kinds"]["prefill"] = prefill
    for p in (base, other):
        _stored(tmp_path, p)
    groups, _ = load_groups([tmp_path])
    profiles = [p for g in groups if (p := _profile_of(g)) is not None]
    assert untraced_marks(profiles, "decode") == pytest.approx([1.9, 1.9 * 1.2])  # ms per step
    assert untraced_marks(profiles, "prefill") == [None, None]
    html = profile_bars(groups)
    assert html.startswith("<img")
    caption = html.split(">", 1)[1]
    assert "traced" in caption and "untraced median" in caption
    assert "No untraced median for prefill (2 of 2 bars)" in caption and "decode" not in caption


def _profile_of(group):
    from llmbench.bench.report.profile_views import group_profile

    return group_profile(group)


def test_a_diff_in_a_report_says_when_one_side_ran_torch_compile(tmp_path):
    base, other = _profile("baseline", 1.0), _profile("torch_compile=on", 1.0)
    for p in (base, other):
        _stored(tmp_path, p)
    meta = tmp_path / "torch_compile=on" / "run" / "meta.json"
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps({**data, "engine_config": {"torch_compile": True, "cuda_graph": True}}))
    base_meta = tmp_path / "baseline" / "run" / "meta.json"
    data = json.loads(base_meta.read_text())
    base_meta.write_text(json.dumps({**data, "engine_config": {"torch_compile": False, "cuda_graph": True}}))
    (section,) = build_report([tmp_path], views=["profile"]).sections
    (diff,) = [v for v in section.views if "against" in v.title]
    assert any("torch.compile" in n for n in diff.notes), diff.notes
