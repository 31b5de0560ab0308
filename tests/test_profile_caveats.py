"""What a profile's views say beside its figures, alike in ``llmbench profile`` and ``llmbench report``:
how many steps each untraced median and traced mean is over, the run's busy-machine warnings, a kind of
step only one side has, a kind with too few untraced steps for a median, and a variant that recorded
nothing said in one line instead of empty tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmbench.bench.profile.caveats import Beside, comparison_view, variant_views
from llmbench.bench.profile.diff import TRACED, UNTRACED
from llmbench.bench.profile.reference import add_untraced_steps, untraced_steps
from llmbench.bench.report import build_report

BUSY = "the machine was busy when the run started (3.0 threads of other processes ready to run on 2 cores)"


def _kind(steps: int, untraced: float | None, n_untraced: int | None) -> dict[str, Any]:
    kind = {"steps": steps, "wall": 0.01, "engine_time": 0.01, "traced_median": 0.01, "busy": 0.008,
            "device": {"GEMM": 0.008}, "idle": 0.002, "waited_for": {"forward": 0.002}, "overlap": 0.0,
            "launches": 0.0, "untraced_median": untraced, "untraced_wait": None}  # fmt: skip
    if n_untraced is not None:
        kind["untraced_steps"] = n_untraced
    return kind


def _profile(variant: str, kinds: dict[str, dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"variant": variant, "status": "complete", "device": "cpu", "mode": "cpu", "steps_per_kind": 4,
            "slow_steps_recorded": False, "slow_factor": 5.0, "peak": None, "traces": [], "kinds": kinds,
            "ranks": [], "kernels": [], "slow_steps": [], "steps": [{"step": 1}], "notes": [], **more}  # fmt: skip


def _cell(view, figure: str, kind: str, column: str) -> str:
    (row,) = [r for r in view.rows if r[0] == kind and r[1] == figure]
    return row[view.headers.index(column)]


def test_the_untraced_median_shows_its_steps_and_a_one_step_traced_row_is_marked():
    base = _profile("baseline", {"prefill": _kind(1, None, 1), "decode": _kind(20, 0.006, 37)})
    other = _profile("b", {"prefill": _kind(1, None, 1), "decode": _kind(4, 0.005, 41)})
    view = comparison_view("baseline", "b", base, other)
    assert _cell(view, UNTRACED, "decode", "steps (n)") == "37 / 41"
    assert _cell(view, TRACED, "decode", "steps (n)") == "20 / 4"
    assert not _cell(view, TRACED, "decode", "change").endswith("(n=1)")
    assert _cell(view, TRACED, "prefill", "change").endswith("(n=1)")  # one traced step on each side
    assert all(r[5].endswith("(n=1)") for r in view.rows if r[0] == "prefill")
    # and prefill has no untraced median: the notes say why, rather than leaving it out unsaid
    (said,) = [n for n in view.notes if n.startswith("prefill:")]
    assert said == (
        "prefill: no untraced median to compare (untraced steps: 1 on baseline, 1 on b; a median needs 5): "
        "its rows compare traced steps only"
    )
    (breakdown, *_) = variant_views(base)
    prefix = (
        "prefill: no untraced median (the reference repeat made 1 untraced prefill step, a median needs 5)"
    )
    assert any(n.startswith(prefix) for n in breakdown.notes), breakdown.notes


def test_a_profile_that_did_not_count_its_untraced_steps_still_says_why_a_kind_has_no_median():
    stored = _profile("baseline", {"prefill": _kind(1, None, None), "decode": _kind(20, 0.006, None)})
    (breakdown, *_) = variant_views(stored)
    prefix = "prefill: no untraced median (the reference repeat made fewer than the 5 untraced prefill steps"
    assert any(n.startswith(prefix) for n in breakdown.notes), breakdown.notes
    view = comparison_view("baseline", "b", stored, stored)
    assert _cell(view, UNTRACED, "decode", "steps (n)") == "– / –"
    assert any(n.startswith("steps (n) of an untraced median: – where its profile") for n in view.notes)


def test_a_kind_only_one_side_has_is_named_in_the_comparison_both_ways():
    base = _profile("baseline", {"decode": _kind(8, 0.006, 30), "mixed": _kind(3, None, 2)})
    other = _profile("chunked_prefill=off", {"decode": _kind(8, 0.006, 30), "prefill": _kind(1, None, 1)})
    view = comparison_view("baseline", "chunked_prefill=off", base, other)
    assert "mixed: baseline only (3 steps); chunked_prefill=off has none" in view.notes
    assert "prefill: chunked_prefill=off only (1 step); baseline has none" in view.notes
    assert {r[0] for r in view.rows} == {"decode"}


def test_the_runs_busy_warnings_are_repeated_under_the_profile_and_the_comparison():
    base = _profile("baseline", {"decode": _kind(8, 0.006, 30)})
    busy = Beside(timing_warnings=(BUSY,))
    (breakdown, *_) = variant_views(base, busy)
    assert f"the run: {BUSY}" in breakdown.notes
    view = comparison_view("baseline", "b", base, base, (Beside(), busy))
    assert f"b: {BUSY}" in view.notes and not any(n.startswith("baseline:") for n in view.notes)


def _stored(folder: Path, profile: dict[str, Any], meta: dict[str, Any], warnings: list[str]) -> Path:
    """A variant's folder as ``llmbench profile`` leaves it: its run and, beside it, its profile.json."""
    run = folder / profile["variant"] / "run"
    run.mkdir(parents=True)
    status = meta.get("status", "complete")
    repeats = [{"repeat": 0, "status": status, "metrics": {"tpot_p50": 0.002}}]
    summary = {"status": status, "warnings": warnings,
               "points": [{"label": "offline", "repeats": repeats, "metrics": {}}]}  # fmt: skip
    child = ["llmbench", "run", "prof.yaml", "--trace-dir", str(run.parent)]  # as profile starts its children
    meta = {"status": "complete", "scenario_name": "prof", "variant": profile["variant"], "command_line": child,
            **meta}  # fmt: skip
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "summary.json").write_text(json.dumps(summary))
    (run.parent / "profile.json").write_text(json.dumps(profile))
    return run.parent


def test_a_variant_that_recorded_nothing_is_said_in_one_line_naming_the_trace_left_on_disk(tmp_path):
    base = _profile("baseline", {"decode": _kind(8, 0.006, 30)})
    empty = _profile("paged_kv=off", {}, status="incomplete", steps=[],
                     notes=["prefill: 1 step(s) of the 30 asked for; the window held no more of them"])  # fmt: skip
    _stored(tmp_path, base, {}, [BUSY])
    left = _stored(tmp_path, empty, {"status": "incomplete", "stop_reason": "interrupted"}, [])
    (left / "trace-steps144-223-rank0.json.gz").write_bytes(b"")
    (section,) = build_report([tmp_path], views=["profile"]).sections
    titles = [v.title for v in section.views]
    (nothing,) = [v for v in section.views if v.title.startswith("paged_kv=off")]
    assert nothing.title == "paged_kv=off (incomplete): nothing recorded (interrupted)"
    assert nothing.rows == [["paged_kv=off (incomplete)", "0", "trace-steps144-223-rank0.json.gz"]]
    assert not any("asked for" in n for n in nothing.notes)  # the window's count before it stopped
    assert any(n.startswith("trace-steps144-223-rank0.json.gz is on disk but unread") for n in nothing.notes)
    assert not any("against" in t for t in titles)  # no comparison with nothing
    (breakdown,) = [v for v in section.views if v.title.startswith("baseline: where")]
    assert f"the run: {BUSY}" in breakdown.notes  # the run's own warning, read from beside the profile


def test_the_untraced_steps_a_median_is_over_are_counted_without_the_slow_ones(tmp_path):
    record = {"slow_factor": 5.0, "reference": {"decode": [0.01] * 6 + [0.2], "prefill": [0.05]}}
    assert untraced_steps(record) == {"decode": 6, "prefill": 1}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(_profile("v", {"decode": _kind(8, 0.01, None)})))
    add_untraced_steps(path, record)
    profile = json.loads(path.read_text())
    assert profile["kinds"]["decode"]["untraced_steps"] == 6
    assert profile["untraced_steps"] == {"decode": 6, "prefill": 1}
