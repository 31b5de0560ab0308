"""``llmbench report``: compare any set of run folders (terminal table, Markdown, CSV or HTML)."""

from __future__ import annotations

import enum
import io
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from llmbench.cli.console import console, note, warning
from llmbench.cli.errors import handle_errors


class Format(enum.StrEnum):
    table = "table"
    markdown = "markdown"
    html = "html"
    csv = "csv"


@handle_errors
def report(
    dirs: Annotated[
        list[Path], typer.Argument(help="Run folders, or folders holding them (searched recursively).")
    ],
    baseline: Annotated[
        str | None,
        typer.Option(
            help="Run folder or variant name to compare against (default: a variant named 'baseline')."
        ),
    ] = None,
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write to this file instead of stdout.")
    ] = None,
) -> None:
    """Tables comparing runs: grouped by scenario, one row per configuration and sweep point."""
    from llmbench.bench.report import build_report
    from llmbench.bench.report.html import render_html
    from llmbench.bench.report.views import to_markdown
    from llmbench.cli.tables import rich_table

    rep = build_report(dirs, baseline)
    for p in rep.problems:
        warning(f"skipped {p.path}: {p.reason}")
    if format is Format.csv:
        text = rep.frame().to_csv(index=False)
    elif format is Format.markdown:
        text = "\n".join(to_markdown(v) for s in rep.sections for v in s.views)
    elif format is Format.html:
        problems = [f"{p.path}: {p.reason}" for p in rep.problems]
        text = render_html([(s.scenario, s.views, s.groups) for s in rep.sections], problems)
    else:
        target = console if out is None else Console(record=True, width=160, file=io.StringIO())
        for s in rep.sections:
            for v in s.views:
                target.print(rich_table(v))
                target.print()
        if out is None:
            return
        text = target.export_text()
    if out is None:
        print(text, end="" if text.endswith("\n") else "\n")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        note(f"report written to {out}")
