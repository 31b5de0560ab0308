"""Reports over any set of run folders: groups, tidy frame, tables, Markdown, CSV, HTML.

``build_report`` reads the folders (nested too), skips broken ones (listing why), groups the runs by
scenario and configuration (incomplete runs shown, marked, never judged), and picks each scenario's
baseline among the complete groups: the one named by ``baseline`` (a run folder or a variant name), else a
variant called "baseline" (what ``ablate`` writes for toggles), else the one an ablation's
``ablation.json`` names (``backend=engine`` when backends are compared), else none. ``threshold`` is the
practical effect size of the verdicts (``--min-effect``, a fraction). Values of the wrong type in the
kept files (meta.json, summary.json, and the side files of an ablation or a profile) read as missing; the
report's ``doubts`` name each file once, and each request, step or telemetry table that cannot be read
(only the parts drawn from it are then missing: ``tables.USES``).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from llmbench.bench.errors import StoreError
from llmbench.bench.metrics import METRICS
from llmbench.bench.report.ablation_record import ablation_notes
from llmbench.bench.report.batches import batch_views
from llmbench.bench.report.compare import DEFAULT_MIN_EFFECT, DELTA_METRICS, change, judged
from llmbench.bench.report.format import SUMMARY_METRICS
from llmbench.bench.report.frame import ABLATION_FILE, Group, damaged_tables, load_groups, tidy
from llmbench.bench.report.kept import is_text, read_object, show
from llmbench.bench.report.outputs import COMPARISON_FILE, comparison_problems, table_gaps
from llmbench.bench.report.quality import QUALITY_FILE, quality_problems, quality_views
from llmbench.bench.report.views import View, by_scenario, changes, deltas, overview, startup
from llmbench.bench.store import Problem, died
from llmbench.suggest import did_you_mean


class Section(NamedTuple):
    scenario: str
    groups: list[Group]
    baseline: Group | None
    views: list[View]


COMPARISON_COLUMNS = (
    "scenario", "point", "baseline", "variant", "metric", "unit", "base", "new", "change", "ci_low", "ci_high",
    "n", "method", "verdict",
)  # fmt: skip


class Report(NamedTuple):
    sections: list[Section]
    problems: list[Problem]
    empty: list[str] = []  # why a view asked for by name has nothing to show, one line each
    doubts: list[Problem] = []  # files read in part: values of the wrong type read as missing
    threshold: float = DEFAULT_MIN_EFFECT

    def frame(self, metrics: list[str] | None = None) -> pd.DataFrame:
        """The tidy DataFrame (default: the summary metrics)."""
        groups = [g for s in self.sections for g in s.groups]
        return tidy(groups, metrics or list(SUMMARY_METRICS))

    def comparisons(self, metrics: list[str] | None = None) -> pd.DataFrame:
        """Every variant against its section's baseline, one row per (point, metric): the figures the deltas
        view shows (default: its metrics), with the interval's ends and the verdict as numbers and words."""
        rows = []
        for s in self.sections:
            for g in (g for g in s.groups if s.baseline is not None and g is not s.baseline):
                for point in (p for p in s.baseline.points if p in g.points):
                    for m in metrics or DELTA_METRICS:
                        c = change(s.baseline, g, point, m)
                        rows.append({
                            "scenario": s.scenario, "point": point, "baseline": s.baseline.label,
                            "variant": g.label, "metric": m, "unit": METRICS[m].unit, "base": c.base,
                            "new": c.new, "change": c.rel, "ci_low": c.rel_low, "ci_high": c.rel_high,
                            "n": c.n, "method": c.method, "verdict": judged(s.baseline, g, point, c, self.threshold),
                        })  # fmt: skip
        return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


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
        record, why = read_object(run.path.parent / ABLATION_FILE)
        if record is not None or why is not None:
            baseline = (record or {}).get("baseline")
            return baseline if is_text(baseline) else None
    return None


def side_file_problems(groups: list[Group]) -> list[Problem]:
    """The side files of the folders holding these runs that cannot be used, in whole or in part."""
    from llmbench.bench.report.profile_views import PROFILE_FILE, profile_problem

    checks = {  # the check of a file's contents; what follows when it cannot be read, when in part
        ABLATION_FILE: (
            _ablation_problems,
            "its baseline is not known from it",
            "its baseline is not known from it",
        ),
        QUALITY_FILE: (quality_problems, "its quality rows are not shown", "read as missing (–)"),
        COMPARISON_FILE: (
            comparison_problems,
            "outputs are compared from the request tables only",
            "those rows are not used",
        ),
        PROFILE_FILE: (
            lambda r: [why] if (why := profile_problem(r)) else [],
            "",
            "its profile is not shown",
        ),
    }
    out = []
    folders = {run.path.parent for g in groups for run in g.runs}
    profiled = {run.path.parent for g in groups for run in g.runs if _profiled(run.meta)}
    for folder in sorted(folders):
        for name, (check, unreadable, partly) in checks.items():
            record, why = read_object(folder / name)
            if why is not None:
                out.append(Problem(folder / name, f"{why}: {unreadable or partly}"))
            elif record is not None and (issues := check(record)):
                out.append(Problem(folder / name, f"{'; '.join(issues[:3])}: {partly}"))
            elif record is None and name == PROFILE_FILE and folder in profiled:
                out.append(Problem(folder / name, f"missing beside a run `llmbench profile` made: {partly}"))
    # An ablation, or a profile (whose variant folders hold its runs), that died while it said it ran.
    for folder in sorted(folders | {f.parent for f in folders}):
        for name in (ABLATION_FILE, PROFILE_FILE):
            record, _ = read_object(folder / name)
            if record is not None and (gone := died(record, folder / name)):
                out.append(Problem(folder / name, f"{gone}; its runs are shown as it left them"))
    return out


def _profiled(meta: dict) -> bool:
    """Whether ``llmbench profile`` made this run (its child is given the folder for its traces), so that
    a profile.json belongs beside it."""
    command = meta.get("command_line")
    return isinstance(command, list) and "--trace-dir" in command


def _ablation_problems(record: dict) -> list[str]:
    baseline = record.get("baseline")
    return [] if baseline is None or is_text(baseline) else [f"'baseline' is {show(baseline)}, not a text"]


VIEWS = ("overview", "deltas", "changes", "startup", "profile", "quality", "batches")


def _by_ablation(scenario: str, members: list[Group], baseline: str | None) -> list[tuple[str, list[Group]]]:
    """One scenario's groups, split so that every ablation's variants are compared with that ablation's own
    baseline (paired by repeat): each ablation with a baseline is a part of its own; standalone runs (and
    ablations without a baseline) share one. With a ``baseline`` named by the user, one part."""
    if baseline:
        return [(scenario, members)]
    ablations: dict[tuple[str, Path | None], list[Group]] = {}  # by name and folder: a name can be shared
    rest: list[Group] = []
    for g in members:
        if g.recorded_ablation is not None:
            ablations.setdefault((g.recorded_ablation, g.home), []).append(g)
        else:
            rest.append(g)
    parts = []
    for (ablation, folder), groups in ablations.items():
        if pick_baseline(groups, None) is not None:
            shared = sum(name == ablation for name, _ in ablations) > 1
            parts.append((str(folder) if shared else ablation, groups))  # the folder tells them apart
        else:
            rest += groups
    if rest or not parts:
        parts.append(("", rest))
    if len(parts) == 1:
        return [(scenario, parts[0][1])]
    return [(f"{scenario} · {ablation}" if ablation else scenario, groups) for ablation, groups in parts]


def build_report(
    paths: list[Path],
    baseline: str | None = None,
    threshold: float = DEFAULT_MIN_EFFECT,
    metrics: list[str] | None = None,
    views: list[str] | None = None,
    intervals: bool = False,
) -> Report:
    """``metrics``: the rows of the overview and delta tables (default: each view's own headline metrics);
    ``views``: which of ``VIEWS`` to build (default: all but ``changes``, the compact form of the deltas, and
    ``batches``, decode steps by batch size); ``intervals``: the overview shows each figure's 95% interval
    beside it."""
    unknown = [m for m in metrics or [] if m not in METRICS]
    if unknown:
        near = did_you_mean(unknown[0], METRICS)
        raise StoreError(f"Unknown metric: {unknown[0]!r}{near}. Metrics: {', '.join(METRICS)}")
    bad = [v for v in views or [] if v not in VIEWS]
    if bad:
        raise StoreError(f"Unsupported view: {bad[0]!r}. Supported: {', '.join(VIEWS)}")
    # changes (the compact form of the deltas) and batches (decode steps by batch size) when asked for
    wanted = views or [v for v in VIEWS if v not in ("changes", "batches")]
    groups, problems = load_groups(paths)
    if not groups:
        listed = "; ".join(f"{p.path}: {p.reason}" for p in problems) or "nothing found"
        raise StoreError(f"no run to report under {', '.join(map(str, paths))} ({listed})")
    sections = []
    built_kinds: set[str] = {"overview", "startup"}  # built for every section
    found_baseline = False
    parts = [
        part for sc, members in by_scenario(groups).items() for part in _by_ablation(sc, members, baseline)
    ]
    for scenario, members in parts:
        base = pick_baseline(members, baseline)
        found_baseline = found_baseline or base is not None
        built: list[View] = []
        add = partial(_add, built, built_kinds)
        if "overview" in wanted:
            built.append(overview(scenario, members, base, metrics, intervals))
        others = [g for g in members if g is not base]
        if "deltas" in wanted and base is not None and others:
            add("deltas", deltas(scenario, base, others, threshold, metrics))
        if "changes" in wanted and base is not None and others:
            add("changes", changes(scenario, base, others, threshold, metrics))
        if "startup" in wanted:
            built.append(startup(scenario, members))
        if "profile" in wanted:
            from llmbench.bench.report.profile_views import profile_section  # (it imports bench.profile)

            add("profile", profile_section(members, base))  # runs recorded by ``llmbench profile``
        if "quality" in wanted:
            add("quality", quality_views(scenario, members))  # ablate --quality's rows, when it wrote them
        if "batches" in wanted:
            add("batches", batch_views(scenario, members, base))
        if built and (said := ablation_notes(members)):  # under the section's first table
            built[0] = built[0]._replace(notes=(*built[0].notes, *said))
        sections.append(Section(scenario, members, base, built))
    if baseline and not found_baseline:
        raise StoreError(f"--baseline {baseline}: no run folder or variant of that name among the runs read")
    doubts = [d for g in groups for d in g.doubts] + side_file_problems(groups) + damaged_tables(groups)
    doubts += table_gaps(groups)  # request tables the output comparison cannot use
    return Report(sections, problems, _empty_views(views or [], parts, built_kinds), doubts, threshold)


__all__ = ["COMPARISON_COLUMNS", "VIEWS", "Report", "Section", "build_report", "pick_baseline"]


def _add(built: list[View], kinds: set[str], kind: str, views: list[View]) -> None:
    built.extend(views)
    if views:
        kinds.add(kind)


def _empty_views(asked: list[str], parts: list[tuple[str, list[Group]]], built: set[str]) -> list[str]:
    """For each view asked for by name that no section could build, why."""
    one_each = all(len(groups) < 2 for _, groups in parts)
    # an ablation's baseline that did not finish (interrupted, timed out) is never picked by default
    stalled = [g for _, groups in parts for g in groups if not g.complete and _named_baseline(g)]
    compare = (
        "every scenario here has one configuration: there is nothing to compare it with"
        if one_each
        else f"no baseline to compare with: the ablation's baseline (variant {stalled[0].variant}) is "
        f"{stalled[0].status}, and an incomplete run is not taken as the baseline; name another with "
        f"--baseline NAME (a run folder, or a variant or label), or --baseline {stalled[0].variant} to compare "
        "with it as it is"
        if stalled
        else "no baseline to compare with: these runs are not variants of one `llmbench ablate`; name "
        "one with --baseline (a run folder, or a variant or label)"
    )
    why = {
        "deltas": compare,
        "changes": compare,
        "profile": "none of these runs was recorded by `llmbench profile`",
        "quality": "no quality rows: `llmbench ablate --quality` writes them",
        "batches": "no decode steps by batch size in these runs' summaries (runs of older versions, or no "
        "decode step)",
    }
    return [f"--view {v}: {why[v]}" for v in dict.fromkeys(asked) if v not in built and v in why]


def _named_baseline(group: Group) -> bool:
    """Whether ``group`` is its ablation's baseline: the variant called "baseline", or the one its
    ablation.json names."""
    return group.variant == "baseline" or _ablation_baseline(group) == group.variant
