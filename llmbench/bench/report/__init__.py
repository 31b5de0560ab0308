"""Reports over any set of run folders: groups, tidy frame, tables, Markdown, CSV, HTML.

``build_report`` reads the folders (nested too), skips broken ones (listing why), groups the runs by
scenario and configuration (incomplete runs shown, marked, never judged), and picks each scenario's
baseline among the complete groups: the one named by ``baseline`` (a run folder or a variant name), else a
variant called "baseline" (what ``ablate`` writes for toggles), else the one an ablation's
``ablation.json`` names (``backend=engine`` when backends are compared), else none. ``threshold`` is the
practical effect size of the verdicts (``--min-effect``, a fraction).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from llmbench.bench.errors import StoreError
from llmbench.bench.metrics import METRICS
from llmbench.bench.report.compare import DEFAULT_MIN_EFFECT
from llmbench.bench.report.format import SUMMARY_METRICS
from llmbench.bench.report.frame import Group, load_groups, tidy
from llmbench.bench.report.views import View, by_scenario, deltas, overview, startup
from llmbench.bench.store import Problem


class Section(NamedTuple):
    scenario: str
    groups: list[Group]
    baseline: Group | None
    views: list[View]


class Report(NamedTuple):
    sections: list[Section]
    problems: list[Problem]

    def frame(self, metrics: list[str] | None = None) -> pd.DataFrame:
        """The tidy DataFrame (default: the summary metrics)."""
        groups = [g for s in self.sections for g in s.groups]
        return tidy(groups, metrics or list(SUMMARY_METRICS))


def _in(path: Path, group: Group) -> bool:
    target = path.resolve()
    return any(r.path.resolve() == target or target in r.path.resolve().parents for r in group.runs)


def pick_baseline(groups: list[Group], baseline: str | None) -> Group | None:
    """The named baseline (complete groups first), or the default one among the complete groups."""
    if baseline:
        groups = sorted(groups, key=lambda g: not g.complete)
        path = Path(baseline)
        matches = [g for g in groups if _in(path, g)] if path.exists() else []
        matches = matches or [g for g in groups if baseline in (g.label, g.variant)]
        return matches[0] if matches else None
    groups = [g for g in groups if g.complete]
    named = [g for g in groups if g.variant == "baseline"]
    if named:
        return named[0]
    declared = [g for g in groups if _ablation_baseline(g) == g.variant]  # e.g. backend=engine
    return declared[0] if declared else None


def _ablation_baseline(group: Group) -> str | None:
    """The baseline an ablation folder holding this group's runs names in its ablation.json."""
    for run in group.runs:
        record = run.path.parent / "ablation.json"
        if record.is_file():
            try:
                return json.loads(record.read_text()).get("baseline")
            except (OSError, ValueError):
                return None
    return None


VIEWS = ("overview", "deltas", "startup", "profile")


def build_report(
    paths: list[Path],
    baseline: str | None = None,
    threshold: float = DEFAULT_MIN_EFFECT,
    metrics: list[str] | None = None,
    views: list[str] | None = None,
) -> Report:
    """``metrics``: the rows of the overview and delta tables (default: each view's own headline metrics);
    ``views``: which of ``VIEWS`` to build (default: all)."""
    unknown = [m for m in metrics or [] if m not in METRICS]
    if unknown:
        raise StoreError(f"Unknown metric: {unknown[0]!r}. Metrics: {', '.join(METRICS)}")
    bad = [v for v in views or [] if v not in VIEWS]
    if bad:
        raise StoreError(f"Unsupported view: {bad[0]!r}. Supported: {', '.join(VIEWS)}")
    wanted = views or list(VIEWS)
    groups, problems = load_groups(paths)
    if not groups:
        listed = "; ".join(f"{p.path}: {p.reason}" for p in problems) or "nothing found"
        raise StoreError(f"no run to report under {', '.join(map(str, paths))} ({listed})")
    sections = []
    found_baseline = False
    for scenario, members in by_scenario(groups).items():
        base = pick_baseline(members, baseline)
        found_baseline = found_baseline or base is not None
        built: list[View] = []
        if "overview" in wanted:
            built.append(overview(scenario, members, base, metrics))
        others = [g for g in members if g is not base]
        if "deltas" in wanted and base is not None and others:
            built += deltas(scenario, base, others, threshold, metrics)
        if "startup" in wanted:
            built.append(startup(scenario, members))
        if "profile" in wanted:
            from llmbench.bench.report.profile_views import profile_section  # (it imports bench.profile)

            built += profile_section(members, base)  # runs recorded by ``llmbench profile``
        sections.append(Section(scenario, members, base, built))
    if baseline and not found_baseline:
        raise StoreError(f"--baseline {baseline}: no run folder or variant of that name among the runs read")
    return Report(sections, problems)


__all__ = ["VIEWS", "Report", "Section", "build_report", "pick_baseline"]
