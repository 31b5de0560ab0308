"""A profile's views with what a reader must know beside its figures: what ``llmbench profile`` prints and
``llmbench report --view profile`` shows of a stored profile alike.

A variant's ``profile.json`` holds what the profiler recorded; the run folder beside it (``run/``) tells
the rest (``Beside``): the run's warnings that make timings doubtful (a busy machine, a driver that lagged:
report/warning_flags.py ``TIMING_FLAGS``), why the run ended early, and which trace files lie on disk.
``variant_views`` is views.py ``profile_views`` with those warnings and a note for each kind whose steps
have no untraced median (too few untraced steps); a variant that recorded nothing is said in one line,
naming any trace file left unread, instead of empty tables. ``comparison_view`` is the diff against the
baseline with the same notes for both sides, and one for each kind of step only one side has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from llmbench.bench.profile.diff import UNTRACED, diff_rows, one_sided
from llmbench.bench.profile.views import compile_note, diff_view, profile_views
from llmbench.bench.report.kept import read_object
from llmbench.bench.report.views import View
from llmbench.bench.report.warning_flags import TIMING_FLAGS, flag
from llmbench.bench.slow_steps import MIN_STEPS_OF_KIND


class Beside(NamedTuple):
    """What the run folder beside a profile says of it."""

    timing_warnings: tuple[str, ...] = ()  # the run's warnings that make its timings doubtful
    stopped: str | None = None  # why the run ended early ("interrupted", "timed out ..."); None: it did not
    traces_on_disk: tuple[str, ...] = ()  # the trace files in the profile's folder


NOTHING_BESIDE = Beside()  # a profile read alone


def read_beside(run_dir: Path, stopped: str | None = None) -> Beside:
    """``Beside`` of the profile whose run folder is ``run_dir`` (its profile.json is in the folder above);
    ``stopped`` as the caller knows it (a timeout), else as the run's meta.json records it."""
    summary, _ = read_object(run_dir / "summary.json")
    meta, _ = read_object(run_dir / "meta.json")
    warnings = (summary or {}).get("warnings")
    timing = (
        [w for w in warnings if isinstance(w, str) and flag(w) in TIMING_FLAGS]
        if isinstance(warnings, list)
        else []
    )
    if stopped is None and meta is not None and meta.get("status") not in (None, "complete"):
        stopped = str(meta.get("stop_reason") or meta.get("status"))
    folder = run_dir.parent
    traces = sorted(p.name for p in folder.glob("trace-*.json.gz")) if folder.is_dir() else []
    return Beside(tuple(timing), stopped, tuple(traces))


def too_few_untraced(profile: dict[str, Any]) -> dict[str, int | None]:
    """The kinds of the breakdown with no untraced median because the reference repeat made fewer than
    ``MIN_STEPS_OF_KIND`` of them, with how many it made (None: the profile did not count them). A profile
    that shows no untraced median at all and counted none (no reference repeat) has none to name."""
    kinds = profile.get("kinds", {})
    counts = profile.get("untraced_steps")
    if counts is None and not any(c.get("untraced_median") for c in kinds.values()):
        return {}
    return {
        kind: c.get("untraced_steps", (counts or {}).get(kind))
        for kind, c in kinds.items()
        if not c.get("untraced_median")
    }


def _made(kind: str, n: int | None) -> str:
    """How many untraced steps of ``kind`` the reference repeat made, too few for a median."""
    if n is None:
        steps = f"fewer than the {MIN_STEPS_OF_KIND} untraced {kind} steps a median needs"
    else:
        steps = f"{n} untraced {kind} step{'' if n == 1 else 's'}, a median needs {MIN_STEPS_OF_KIND}"
    return f"the reference repeat made {steps}"


def _nothing_view(profile: dict[str, Any], beside: Beside) -> View:
    """One line for a variant whose window shows no steady step: nothing recorded, or every step slow."""
    label, steps = profile["variant"], profile.get("steps") or []
    unread = [t for t in beside.traces_on_disk if t not in (profile.get("traces") or [])]
    if steps:
        title = f"{label}: no steady step of the window to show"
        notes = list(profile.get("notes") or ())  # they say why (every step of its kinds slow...)
    else:
        why = beside.stopped or ("interrupted" if profile.get("status") == "incomplete" else "no trace read")
        title = f"{label}: nothing recorded ({why})"
        # what the window counted before it stopped is no step of the profile's: only the traces' notes
        notes = [n for n in profile.get("notes") or () if ".json.gz" in n]
    notes += [
        f"{t} is on disk but unread: the run stopped before the profile named it (ui.perfetto.dev opens it)"
        for t in unread
    ]
    row = [label, str(len(steps)), ", ".join(unread) or "none"]
    return View(
        title, ["variant", "steps recorded", "trace files unread"], [row], [False, True, False], tuple(notes)
    )


def variant_views(
    profile: dict[str, Any], beside: Beside = NOTHING_BESIDE, label: str | None = None
) -> list[View]:
    """Every view of one variant's profile (``label``: its name as the caller shows it, marked when it
    failed or stopped), with the notes of ``Beside`` under its breakdown."""
    shown = {**profile, "variant": label or profile["variant"]}
    views = profile_views(shown)
    if not profile.get("kinds"):  # no breakdown, no top ops: one line, and the slow steps if any
        return [_nothing_view(shown, beside), *(v for v in views[1:] if v.rows)]
    notes = [
        f"{kind}: no untraced median ({_made(kind, n)}), so nothing says how much tracing slowed these steps"
        for kind, n in too_few_untraced(profile).items()
    ]
    notes += [f"the run: {w}" for w in beside.timing_warnings]
    views[0] = views[0]._replace(notes=(*views[0].notes, *notes))  # the breakdown
    return views


def comparison_view(
    baseline: str,
    variant: str,
    base: dict[str, Any],
    other: dict[str, Any],
    sides: tuple[Beside, Beside] = (NOTHING_BESIDE, NOTHING_BESIDE),
) -> View | None:
    """The diff of ``other`` (shown as ``variant``) against ``base`` (``baseline``); None when either
    shows no steady step (``variant_views`` says so)."""
    if not base.get("kinds") or not other.get("kinds"):
        return None
    notes = [said] if (said := compile_note(base, other)) else []
    notes += one_sided_notes(baseline, variant, base, other)
    names = (baseline, variant)
    few = [too_few_untraced(base), too_few_untraced(other)]
    for kind in dict.fromkeys(
        k for k in base["kinds"] if k in other["kinds"] and (k in few[0] or k in few[1])
    ):
        lacking = ", ".join(
            f"{'too few' if f[kind] is None else f[kind]} on {name}"
            for name, f in zip(names, few, strict=True)
            if kind in f
        )
        notes.append(
            f"{kind}: no untraced median to compare (untraced steps: {lacking}; a median needs "
            f"{MIN_STEPS_OF_KIND}): its rows compare traced steps only"
        )
    notes += [f"{name}: {w}" for name, side in zip(names, sides, strict=True) for w in side.timing_warnings]
    rows = diff_rows(base, other)
    if any(r["figure"] == UNTRACED and None in r["n"] for r in rows):
        notes.append(
            "steps (n) of an untraced median: – where its profile, made by an earlier llmbench, did not "
            "count them"
        )
    return diff_view(baseline, variant, rows, notes)


def one_sided_notes(baseline: str, variant: str, base: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """The notes of ``comparison_view`` for the kinds only one side has (what profile.json keeps)."""
    out = []
    for kind, in_base, steps in one_sided(base, other):
        has, lacks = (baseline, variant) if in_base else (variant, baseline)
        out.append(f"{kind}: {has} only ({steps} step{'' if steps == 1 else 's'}); {lacks} has none")
    return out


__all__ = ["Beside", "comparison_view", "read_beside", "too_few_untraced", "variant_views"]
