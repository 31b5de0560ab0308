"""Rich renderings shared by commands: a run's summary table and the notes under it.

Numbers are right-aligned; a figure that could not be measured reads "unavailable" (with the reason
listed below the table), never 0.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from llmbench.bench.report.format import (
    SUMMARY_METRICS,
    format_ci,
    format_value,
    is_unavailable,
    metric_label,
)


def summary_table(summary: dict[str, Any], title: str | None = None) -> Table:
    """Metrics down, sweep points across; each cell the estimate, with its 95% interval when known."""
    points = summary.get("points", [])
    unavailable = summary.get("unavailable") or {}
    labels = summary.get("labels") or {}  # e.g. which peak a utilisation is a share of
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("metric", no_wrap=True)
    single = len(points) == 1
    for p in points:
        table.add_column(p.get("label", "?") if not single else "value", justify="right", no_wrap=True)
        if single:
            table.add_column("95% CI", justify="right", no_wrap=True)
    for name in SUMMARY_METRICS:
        cells = []
        shown = False
        for p in points:
            m = (p.get("metrics") or {}).get(name) or {}
            text = format_value(name, m.get("value"), is_unavailable(name, unavailable))
            shown = shown or m.get("value") is not None or is_unavailable(name, unavailable)
            cells.append(text)
            if single:
                cells.append(format_ci(name, m.get("ci_low"), m.get("ci_high")))
        if shown:
            table.add_row(labels.get(name) or metric_label(name), *cells)
    return table


def ci_note(summary: dict[str, Any]) -> str | None:
    kinds = {
        m.get("ci")
        for p in summary.get("points", [])
        for m in (p.get("metrics") or {}).values()
        if isinstance(m, dict) and m.get("ci")
    }
    if "repeats" in kinds:
        return "95% CI: percentile bootstrap of the mean over repeats."
    if "requests" in kinds:
        return "95% CI: one repeat, so latency intervals bootstrap over requests; run --repeats 3+ for all metrics."
    return None
