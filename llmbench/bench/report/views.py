"""Report tables as plain data (title, headers, rows of text, alignment, notes), built from groups.

Renderers turn a :class:`View` into Rich (cli), Markdown, or HTML; numbers are right-aligned in all, and
the notes (how intervals were made, the runs' warnings in full) follow the table in every format.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from llmbench.bench.report.compare import (
    DEFAULT_MIN_EFFECT,
    DELTA_METRICS,
    Change,
    chance_note,
    change,
    different_machines,
    different_models,
    judged,
    method_note,
    tables_chance_note,
    workload_differences,
)
from llmbench.bench.report.format import (
    DASH,
    format_change,
    format_change_interval,
    format_ci,
    format_value,
    is_unavailable,
    metric_label,
)
from llmbench.bench.report.frame import Group
from llmbench.bench.report.outputs import OutputComparison, compare_outputs, describe, missed
from llmbench.bench.stats import central

OVERVIEW_METRICS = (
    "ttft_p50", "ttft_p99", "tpot_p50", "e2e_p99", "output_throughput", "request_throughput", "peak_memory",
    "energy_per_token",
)  # fmt: skip


class View(NamedTuple):
    title: str
    headers: list[str]
    rows: list[list[str]]
    numeric: list[bool]  # per column: right-align
    notes: tuple[str, ...] = ()  # lines under the table
    # A view too wide for a terminal is cut into several: ``keys`` leading columns name a row and go in each
    # part; the columns after them go in runs of ``group`` that stay together (a metric's value, change and
    # verdict). 0: cut into single columns only when every one after the keys is a figure, else not at all.
    keys: int = 1
    group: int = 0


def by_scenario(groups: list[Group]) -> dict[str, list[Group]]:
    """Groups per scenario, a variant named "baseline" first."""
    out: dict[str, list[Group]] = {}
    for g in sorted(groups, key=lambda g: g.variant != "baseline"):
        out.setdefault(g.scenario, []).append(g)
    return out


def overview(
    scenario: str,
    groups: list[Group],
    baseline: Group | None,
    metrics: list[str] | None = None,
    intervals: bool = False,
) -> View:
    """Headline metrics down, one column per (configuration, point); changes against the baseline; the
    flags of the runs' warnings on top of each column, the warnings in full under the table. ``metrics``:
    the rows, each shown even where every figure is missing (default: the headline ones that have a figure)."""
    columns = [(g, point) for g in groups for point in g.points]
    headers = ["metric", *(f"{g.label} · {point}" for g, point in columns)]
    rows = [["repeats", *(str(len(g.points[point])) for g, point in columns)]]
    if any(not g.complete for g in groups):
        rows.append(["status", *(g.status for g, _ in columns)])
    flags = [", ".join(g.flags(point)) or DASH for g, point in columns]
    if any(f != DASH for f in flags):
        rows.append(["run warnings", *flags])
    short = False  # a figure some repeats did not record (or recorded as an impossible value)
    for m in metrics or OVERVIEW_METRICS:
        cells = []
        for g, point in columns:
            value = g.value(point, m)
            text = format_value(m, value, is_unavailable(m, g.unavailable))
            if math.isfinite(value) and (n := _recorded(g, point, m)) < len(g.points[point]):
                text += f" ({n} of {len(g.points[point])})"
                short = True
            if intervals and math.isfinite(value):
                est = g.estimate(point, m)
                ci = format_ci(m, est["ci_low"], est["ci_high"])
                text += f" [{ci}]" if ci != DASH else ""
            if (
                baseline is not None
                and g is not baseline
                and point in baseline.points
                and math.isfinite(value)
            ):
                c = change(baseline, g, point, m)
                text += f" ({format_change(m, c.rel, c.absolute)})"
            cells.append(text)
        if metrics or any(c not in (DASH, "unavailable") for c in cells):  # rows asked for by name: always
            rows.append([metric_label(m), *cells])
    notes = tuple(f"{g.label} · {point}: {w}" for g, point in columns for w in g.warnings(point))
    if stopped := sum(g.stopped_out for g in groups):
        notes = (
            f"{stopped} repeat(s) an interrupt or a failure stopped part-way are left out of the figures "
            "(a part of a workload is no measurement of it); the repeats that ran to their end are shown",
            *notes,
        )
    if any(g.traced_out for g in groups):
        notes = (
            "runs of `llmbench profile`: the repeat the profiler recorded is left out (the profiler's own "
            "work slows it); their figures are the untraced repeat's",
            *notes,
        )
    if short:
        notes = (
            "(k of n): the figure of k repeats only; the others recorded none, or one read as missing",
            *notes,
        )
    if intervals:
        legend = "[low – high]: 95% t-interval over the repeats (none with one repeat)"
        shared = [
            g.label for g in groups if not g.own_processes and any(len(r) > 1 for r in g.points.values())
        ]
        if shared:  # measured with --one-process, or by an llmbench that measured every repeat so
            legend += (
                f"; the repeats of {', '.join(shared)} shared one process, so their intervals leave out what "
                "differs between processes"
            )
        notes = (legend, *notes)
    title = scenario + (f" (changes against {baseline.label})" if baseline is not None else "")
    return View(title, headers, rows, [False, *([True] * len(columns))], notes)


def _recorded(group: Group, point: str, metric: str) -> int:
    """How many of the point's repeats recorded a figure of ``metric``."""
    return sum(math.isfinite(v) for v in group.repeat_values(point, metric))


def deltas(
    scenario: str,
    baseline: Group,
    others: list[Group],
    threshold: float = DEFAULT_MIN_EFFECT,
    metrics: list[str] | None = None,
) -> list[View]:
    """Per variant and point: baseline, variant, change with its 95% interval, verdict; outputs compared."""
    headers = ["metric", "baseline", "variant", "change", "95% CI", "verdict"]
    views, tables = [], []
    for g in others:
        for point in baseline.points:
            if point not in g.points:
                continue
            rows, shown = [], []
            for m in metrics or DELTA_METRICS:
                c = change(baseline, g, point, m)
                shown.append((c, judged(baseline, g, point, c, threshold)))
                una = is_unavailable(m, g.unavailable)
                ci = format_change_interval(m, c.rel_low, c.rel_high, c.absolute) if c.method else DASH
                rows.append([
                    metric_label(m), format_value(m, c.base, una), format_value(m, c.new, una),
                    format_change(m, c.rel, c.absolute), ci, shown[-1][1],
                ])  # fmt: skip
            outputs = compare_outputs(baseline, g, point)
            text = describe(outputs) if isinstance(outputs, OutputComparison) else outputs
            rows.append([f"outputs against {_the(baseline)} (greedy)", "", text, "", "", ""])
            notes = [method_note([c for c, _ in shown], threshold), *chance_note(shown)]
            tables.append(shown)
            notes += pair_notes(baseline, g, point)
            flagged = [f"{h.label}: {', '.join(h.flags(point))}" for h in (baseline, g) if h.flags(point)]
            if flagged:
                notes.append(f"run warnings ({'; '.join(flagged)}) are listed in full under the first table")
            title = f"{scenario} · {point}: {g.label} against {baseline.label}"
            views.append(View(title, headers, rows, [False, True, True, True, True, False], tuple(notes)))
    return _with_tables_note(views, tables)


def _with_tables_note(views: list[View], tables: list[list[tuple[Change, str]]]) -> list[View]:
    """``views`` with ``tables_chance_note`` under the last one."""
    if views and (said := tables_chance_note(tables)):
        views[-1] = views[-1]._replace(notes=(*views[-1].notes, *said))
    return views


def changes(
    scenario: str,
    baseline: Group,
    others: list[Group],
    threshold: float = DEFAULT_MIN_EFFECT,
    metrics: list[str] | None = None,
) -> list[View]:
    """Per point, one row per variant: for each metric its value, the change against the baseline with the
    95% interval, and the verdict (the compact form of ``deltas``, for many variants side by side)."""
    shown = list(metrics or ("output_throughput", "tpot_p50", "ttft_p50"))
    views, tables = [], []
    for point in baseline.points:
        members = [g for g in others if point in g.points]
        if not members:
            continue
        headers = ["variant", "repeats"]
        for m in shown:
            headers += [metric_label(m), "change [95% CI]", "verdict"]
        rows = [["baseline: " + baseline.label, str(len(baseline.points[point]))]]
        for m in shown:
            rows[0] += [  # as its changes take it (``stats.central``)
                format_value(
                    m, central(baseline.repeat_values(point, m)), is_unavailable(m, baseline.unavailable)
                ),
                "",
                "",
            ]
        judged_changes = []
        for g in members:
            row = [g.label, str(len(g.points[point]))]
            for m in shown:
                c = change(baseline, g, point, m)
                judged_changes.append((c, judged(baseline, g, point, c, threshold)))
                ci = f" [{format_change_interval(m, c.rel_low, c.rel_high, c.absolute)}]" if c.method else ""
                row += [
                    format_value(m, c.new, is_unavailable(m, g.unavailable)),
                    format_change(m, c.rel, c.absolute) + ci,
                    judged_changes[-1][1],
                ]
            rows.append(row)
        notes = [method_note([c for c, _ in judged_changes], threshold), *chance_note(judged_changes)]
        tables.append(judged_changes)
        notes += dict.fromkeys(n for g in members for n in pair_notes(baseline, g, point))
        outputs = [(g, compare_outputs(baseline, g, point)) for g in members]
        notes += [
            f"outputs of {g.label} against {_the(baseline)} (greedy): "
            + (describe(o) if isinstance(o, OutputComparison) else o)
            for g, o in outputs
            if isinstance(o, OutputComparison) or missed(baseline, g)
        ]
        numeric = [False, True] + [True, True, False] * len(shown)
        views.append(
            View(
                f"{scenario} · {point}: changes against {baseline.label}",
                headers,
                rows,
                numeric,
                tuple(notes),
                keys=2,
                group=3,
            )
        )
    return _with_tables_note(views, tables)


def pair_notes(baseline: Group, variant: Group, point: str) -> list[str]:
    """What to read a variant's changes against the baseline with: that they ran different models, or
    (measured apart) different workloads; that a toggle they differ in had nothing to act on in this
    workload."""
    notes = _idle_toggle(baseline, variant, point)
    if not baseline.paired_with(variant) and (diffs := workload_differences(baseline, variant)):
        notes.insert(
            0, f"{baseline.label} and {variant.label} served different workloads ({'; '.join(diffs)})"
        )
    if models := different_models(baseline, variant):
        across = (
            f"{baseline.label} ran {models[0]}, {variant.label} ran {models[1]}: a comparison across models"
        )
        notes.insert(0, across)
    if machines := different_machines(baseline, variant):
        notes.insert(
            0,
            f"{baseline.label} ran on {machines[0]}, {variant.label} on {machines[1]}: a comparison across machines",
        )
    return notes


def _idle_toggle(baseline: Group, variant: Group, point: str) -> list[str]:
    """A toggle the two differ in that had nothing to act on in this workload, said beside the changes: what
    they show is then the toggle's own cost, or noise. The prefix cache, when no request found a cached
    prefix with it on."""
    configs = [g.meta.get("engine_config") for g in (baseline, variant)]
    if not all(isinstance(c, dict) for c in configs):  # a peer backend's run: the backends differ
        return []
    on = [g for g, c in zip((baseline, variant), configs, strict=True) if c.get("prefix_cache")]
    if len(on) != 1:
        return []
    rates = [v for v in on[0].repeat_values(point, "prefix_cache_hit_rate") if math.isfinite(v)]
    if not rates or max(rates) > 0:
        return []
    return [
        "prefix_cache: no request of this workload found a cached prefix with the cache on (hit rate 0%): the "
        "toggle has nothing to act on here, and a change shown is its bookkeeping's cost, or noise"
    ]


def _the(baseline: Group) -> str:
    """The baseline as a sentence names it: "the baseline", or the configuration chosen as one."""
    return "the baseline" if baseline.label == "baseline" else baseline.label


def startup(scenario: str, groups: list[Group]) -> View:
    """One-off costs, kept apart from steady state."""
    headers = ["variant", "start-ups", "init", "weights", "compile", "graphs"]
    rows = []
    for g in groups:
        s = g.startup()
        keys = ("engine_init_time", "load_time", "compile_time", "graph_capture_time")
        rows.append(
            [g.label, str(len(g.startups)), *("–" if math.isnan(s[k]) else f"{s[k]:.2f}" for k in keys)]
        )
    title = (
        f"{scenario}: startup seconds, the mean over the start-ups (init = weights + compile + graph capture + "
        "KV pool, or a peer backend's start-up; not measured)"
    )
    return View(title, headers, rows, [False, True, True, True, True, True])


def to_markdown(view: View) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [f"### {esc(view.title)}", "", "| " + " | ".join(esc(h) for h in view.headers) + " |"]
    lines.append("|" + "|".join("---:" if num else "---" for num in view.numeric) + "|")
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in view.rows]
    if view.notes:
        lines += ["", *("- " + " ".join(note.split()) for note in view.notes)]  # one line per note
    return "\n".join(lines) + "\n"
