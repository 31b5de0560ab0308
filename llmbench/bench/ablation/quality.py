"""``ablate --quality``: each variant's outputs against the baseline's, each side in a process of its own.

First the baseline's child (``python -m llmbench quality-child SPEC``) records its greedy continuation and
teacher-forced distributions (``bench/quality/measure.py``) in ``quality/baseline.pt`` of the ablation's
folder; then one child per variant reads that file and writes its figures. Only one engine is alive at a
time. ``quality.json`` in the ablation's folder gathers the settings, a note on what the figures mean,
and one entry per variant (its figures, or why it has none); the baseline's file, large (prompts x
tokens x vocabulary floats), is deleted at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmbench.bench.ablation.checks import config_problem
from llmbench.bench.ablation.execute import (
    AblationOutcome,
    ChildTimeout,
    _run_child,
    child_error,
)
from llmbench.bench.ablation.plan import Variant
from llmbench.bench.child_process import package_env
from llmbench.bench.quality.compare import RANDOM_WEIGHTS_NOTE
from llmbench.bench.quality.measure import QualitySettings, read_side
from llmbench.bench.report.quality import QUALITY_FILE, QUALITY_WORK
from llmbench.bench.scenario.loader import ResolvedScenario
from llmbench.bench.store import slug, write_json
from llmbench.interrupts import is_interrupted_exit

METHOD = (
    "teacher-forced on the baseline's greedy continuation, one decode step per token; KL(baseline || "
    "variant) over the whole vocabulary per position; greedy outputs free-running"
)


def _child(
    resolved: ResolvedScenario,
    sets: list[str],
    variant: Variant,
    settings: QualitySettings,
    work: Path,
    out: Path | None,
    timeout_s: float | None,
) -> str | None:
    """Run one side; None when it succeeded, else why it did not."""
    spec = work / f"{slug(variant.name)}.spec.json"
    write_json(
        spec,
        {
            "scenario": str(resolved.path),
            "sets": sets,
            "profile": resolved.profile.name or "none",
            "options": variant.options,
            "settings": settings._asdict(),
            "baseline": str(work / "baseline.pt"),
            "out": None if out is None else str(out),
        },
    )
    env = package_env()
    result = _run_child([sys.executable, "-m", "llmbench", "quality-child", str(spec)], env, timeout_s)
    if isinstance(result, ChildTimeout):
        return f"timed out after {result.seconds:g} s (--timeout)"
    code, stderr = result
    if is_interrupted_exit(code):
        raise KeyboardInterrupt
    return None if code == 0 else child_error(stderr)


def run_quality(
    resolved: ResolvedScenario,
    sets: list[str],
    variants: list[Variant],
    folder: Path,
    settings: QualitySettings,
    on_event: Callable[[str, str], None] = lambda level, text: None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Every variant after the first (the baseline) against it; returns what ``quality.json`` holds."""
    work = folder / QUALITY_WORK
    work.mkdir(exist_ok=True)
    baseline, others = variants[0], variants[1:]
    record: dict[str, Any] = {
        "baseline": baseline.name,
        "settings": settings._asdict(),
        "method": METHOD,
        "note": None,
        "status": "running",
        "variants": [],
    }
    try:
        on_event("phase", f"quality · {baseline.name}: greedy continuation and its distributions")
        problem = config_problem(resolved, baseline) or _child(
            resolved, sets, baseline, settings, work, None, timeout_s
        )
        for v in others:
            entry: dict[str, Any] = {"name": v.name, "options": v.options, "status": "failed"}
            why = problem and f"the baseline's side failed: {problem}"
            why = why or config_problem(resolved, v)
            if why is None:
                on_event("phase", f"quality · {v.name} against {baseline.name}")
                out = work / f"{slug(v.name)}.json"
                why = _child(resolved, sets, v, settings, work, out, timeout_s)
                if why is None:
                    figures = read_side(out)
                    if figures.pop("random_weights", False):
                        record["note"] = RANDOM_WEIGHTS_NOTE
                    entry.update(status="ok", **figures)
            if why is not None:
                entry["error"] = why
                on_event("warning", f"quality of {v.name}: {why.splitlines()[0]}")
            record["variants"].append(entry)
            write_json(folder / QUALITY_FILE, record)
    except KeyboardInterrupt:  # kept as far as it got: the variants it did not reach say so
        done = {e["name"] for e in record["variants"]}
        record["status"] = "interrupted"
        record["variants"] += [
            {"name": v.name, "options": v.options, "status": "interrupted"}
            for v in others
            if v.name not in done
        ]
        write_json(folder / QUALITY_FILE, record)
        raise
    finally:
        (work / "baseline.pt").unlink(missing_ok=True)
    record["status"] = "complete"
    write_json(folder / QUALITY_FILE, record)
    return record


def quality_after(
    outcome: AblationOutcome,
    resolved: ResolvedScenario,
    sets: list[str],
    variants: list[Variant],
    settings: QualitySettings,
    on_event: Callable[[str, str], None] = lambda level, text: None,
    timeout_s: float | None = None,
) -> tuple[AblationOutcome, bool]:
    """``ablate --quality``'s second phase, once the timings are complete: every variant's outputs against
    the baseline's (``run_quality``; its note said through ``on_event``). Returns the ablation's outcome
    (``interrupted`` when Ctrl-C stopped this phase: the timings stay, the quality record does not) and
    whether a variant's quality could not be measured."""
    if outcome.status != "complete":
        return outcome, False
    try:
        record = run_quality(resolved, sets, variants, outcome.folder, settings, on_event, timeout_s)
    except KeyboardInterrupt:
        return outcome._replace(status="interrupted"), False
    if record["note"]:
        on_event("info", f"quality: {record['note']}")
    return outcome, any(v["status"] != "ok" for v in record["variants"])
