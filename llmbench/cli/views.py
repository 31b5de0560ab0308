"""Rich renderings shared by commands: a run's summary table and the notes under it; report views.

Numbers are right-aligned; a figure that could not be measured reads "unavailable" (with the reason
listed below the table), never 0. A run's table shows a 95% interval column only when some figure has
one (two repeats or more): one run says nothing about run-to-run variance, so it gets none.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llmbench.bench.report.format import (
    SUMMARY_METRICS,
    format_ci,
    format_value,
    is_unavailable,
    metric_label,
)
from llmbench.bench.report.views import View
from llmbench.bench.store import OWN_PROCESS
from llmbench.cli.tables import rich_table


def summary_table(summary: dict[str, Any], title: str | None = None) -> Table:
    """Metrics down, sweep points across; each cell the estimate, with its 95% interval when known."""
    points = summary.get("points", [])
    unavailable = summary.get("unavailable") or {}
    labels = summary.get("labels") or {}  # e.g. which peak a utilisation is a share of
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("metric", no_wrap=True)
    single = len(points) == 1
    with_ci = single and any(
        isinstance(m, dict) and m.get("ci") for m in (points[0].get("metrics") or {}).values()
    )
    for p in points:
        table.add_column(p.get("label", "?") if not single else "value", justify="right", no_wrap=True)
        if with_ci:
            table.add_column("95% CI", justify="right", no_wrap=True)
    for name in SUMMARY_METRICS:
        cells = []
        shown = False
        for p in points:
            m = (p.get("metrics") or {}).get(name) or {}
            text = format_value(name, m.get("value"), is_unavailable(name, unavailable))
            shown = shown or m.get("value") is not None or is_unavailable(name, unavailable)
            cells.append(text)
            if with_ci:
                cells.append(format_ci(name, m.get("ci_low"), m.get("ci_high")))
        if shown:
            table.add_row(labels.get(name) or metric_label(name), *cells)
    return table


def split_columns(view: View, width: int) -> list[View]:
    """``view`` cut into views of as many of its column groups (``View.group``) as fit ``width`` beside
    its key columns (each column's widest cell and a separator); the view itself when it fits or cannot be
    cut."""
    sizes = [
        max([len(view.headers[i]), *(len(r[i]) for r in view.rows)]) + 3 for i in range(len(view.headers))
    ]
    keys = list(range(view.keys))
    group = view.group or (1 if all(view.numeric[view.keys :]) else 0)
    if sum(sizes) <= width or not group or len(sizes) - view.keys < 2 * group:
        return [view]
    units = [list(range(i, min(i + group, len(sizes)))) for i in range(view.keys, len(sizes), group)]
    base = sum(sizes[i] for i in keys)
    parts: list[list[int]] = []
    current: list[int] = []
    used = base
    for unit in units:
        size = sum(sizes[i] for i in unit)
        if current and used + size > width:
            parts.append(current)
            current, used = [], base
        current += unit
        used += size
    parts.append(current)
    out = []
    for k, cols in enumerate(parts, start=1):
        keep = [*keys, *cols]
        out.append(
            View(
                f"{view.title} ({k}/{len(parts)})",
                [view.headers[i] for i in keep],
                [[row[i] for i in keep] for row in view.rows],
                [view.numeric[i] for i in keep],
            )
        )
    return out


def ci_note(summary: dict[str, Any]) -> str | None:
    """What the intervals of a run's summary are, or why it has none."""
    entries = [
        m for p in summary.get("points", []) for m in (p.get("metrics") or {}).values() if isinstance(m, dict)
    ]
    ns = sorted({int(m["n"]) for m in entries if m.get("ci") == "repeats" and m.get("n")})
    if ns:
        reps = "/".join(map(str, ns))
        own = summary.get("repeat_processes") == OWN_PROCESS
        if len(summary.get("points", [])) > 1:  # the table has no room for them (``summary_table``)
            where = "each in a process of its own" if own else "repeat-to-repeat variance within one process"
            return (
                f"95% intervals over {reps} repeats ({where}) are in summary.json; `llmbench report RUN_FOLDER "
                "--intervals` shows them beside each figure."
            )
        few = (
            "; from 2 repeats it can be far too narrow where the noise comes in modes (3 or more for verdicts)"
            if ns[0] == 2
            else ""
        )
        if own:
            return (
                f"95% CI: Student-t interval of the mean over {reps} repeats, each in a process of its own: it "
                f"holds what differs between processes as well as between repeats{few}."
            )
        return (
            f"95% CI: Student-t interval of the mean over {reps} repeats, all in one process (--one-process): it "
            "holds repeat-to-repeat variance, not what another process adds (without --one-process each "
            f"repeat runs in a process of its own){few}."
        )
    if any(m.get("n") == 1 for m in entries):
        return (
            "no 95% CI: one repeat says nothing about repeat-to-repeat variance; run --repeats 2 or more "
            "for intervals, 3 or more for verdicts when runs are compared."
        )
    return None


def print_view(view: View, target: Console) -> None:
    """A report view as a Rich table, its notes under it; one too wide for the terminal whose columns are
    all figures (an overview of many configurations) goes in several tables, each with its row labels."""
    for part in split_columns(view, target.width):
        target.print(rich_table(part))
    for line in view.notes:
        target.print(f"[dim]· {escape(line)}[/]", soft_wrap=True, highlight=False)
    target.print()
