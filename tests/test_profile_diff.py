"""A profile comparison leads with the untraced steps (tracing slows each variant by its own factor) and
says when the traced breakdown below them disagrees with them."""

from __future__ import annotations

from llmbench.bench.profile.diff import TRACED, UNTRACED, diff_rows
from llmbench.bench.profile.views import diff_view


def profile(untraced: float, traced: float, attention: float) -> dict:
    kind = {
        "wall": traced, "busy": traced * 0.9, "idle": traced * 0.1, "device": {"attention": attention},
        "waited_for": {}, "untraced_median": untraced, "launches": 10,
    }  # fmt: skip
    return {"mode": "cuda", "kinds": {"decode": kind}}


def test_the_untraced_step_leads_and_a_traced_breakdown_that_disagrees_is_said():
    base, slower = profile(0.010, 0.030, 0.004), profile(0.0115, 0.026, 0.005)  # +15% untraced, -13% traced
    rows = diff_rows(base, slower)
    assert [r["figure"] for r in rows[:2]] == [UNTRACED, TRACED]
    assert abs(rows[0]["change"] - 0.15) < 1e-9 and abs(rows[1]["change"] + 0.4 / 3) < 1e-9
    view = diff_view("baseline", "b", rows)
    assert view.rows[0][1] == UNTRACED and view.rows[0][view.headers.index("change")] == "+15.0%"
    (note,) = view.notes
    assert note.startswith("decode: the untraced steps changed +15.0%, the traced ones -13.3%")


def test_a_traced_breakdown_that_agrees_needs_no_note_and_huge_changes_read_as_ratios():
    rows = diff_rows(profile(0.010, 0.030, 1e-9), profile(0.0102, 0.0305, 0.004))
    view = diff_view("baseline", "b", rows)
    assert view.notes == ()
    (attention,) = [r for r in view.rows if r[1].strip() == "attention"]
    assert attention[view.headers.index("change")].startswith(
        "×"
    )  # from almost nothing: a ratio, not +399999900.0%


def test_a_breakdown_carries_its_profiles_notes_to_every_reader():
    from llmbench.bench.profile.views import breakdown_view

    p = {
        **profile(0.01, 0.02, 0.004),
        "variant": "v",
        "device": "cuda",
        "notes": ["decode steps ran 2x slower traced"],
    }
    p["kinds"]["decode"]["steps"] = 3
    assert breakdown_view(p).notes == ("decode steps ran 2x slower traced",)


def test_each_row_shows_the_ms_per_step_it_added_beside_its_percentage():
    base, slower = profile(0.010, 0.030, 0.004), profile(0.0115, 0.026, 0.005)
    view = diff_view("baseline", "b", diff_rows(base, slower))
    delta, pct = view.headers.index("Δ ms"), view.headers.index("change")
    by_figure = {r[1].strip(): r for r in view.rows}
    assert by_figure[UNTRACED][delta] == "+1.500" and by_figure[UNTRACED][pct] == "+15.0%"
    assert by_figure[TRACED][delta] == "-4.000"
    assert by_figure["attention"][delta] == "+1.000"
    assert by_figure["launches"][delta] == "0.0"  # a count, as its row's other columns; no sign on nothing


def test_a_diff_across_torch_compile_says_its_categories_are_not_comparable():
    from llmbench.bench.profile.views import compile_note

    base, compiled = profile(0.010, 0.030, 0.004), profile(0.009, 0.028, 0.0005)
    base["torch_compile"], compiled["torch_compile"] = False, True
    note = compile_note(base, compiled)
    assert note is not None and "torch.compile" in note and "not comparable" in note
    view = diff_view("baseline", "torch_compile=on", diff_rows(base, compiled), notes=[note])
    assert note in view.notes
    assert compile_note(base, {**compiled, "torch_compile": False}) is None
    assert compile_note(base, {k: v for k, v in compiled.items() if k != "torch_compile"}) is None  # unknown
