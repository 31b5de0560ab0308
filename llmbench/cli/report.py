"""``llmbench report``: compare any set of run folders (terminal table, Markdown, CSV or HTML)."""

from __future__ import annotations

import enum
import io
import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from llmbench.bench.errors import BenchError
from llmbench.cli.console import console, error, note, warning
from llmbench.cli.errors import EXIT_INPUT, handle_errors

MinEffectOption = Annotated[
    float,
    typer.Option(
        min=0.0,
        help="Practical threshold of the verdicts, in percent: better/worse only when the whole 95% interval "
        "lies beyond it, equivalent when it lies within it, otherwise inconclusive.",
    ),
]


class ViewName(enum.StrEnum):  # bench/report's VIEWS
    overview = "overview"
    deltas = "deltas"
    changes = "changes"
    startup = "startup"
    profile = "profile"
    quality = "quality"
    batches = "batches"


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
        str | None,
        typer.Option(
            "--out",
            "-o",
            help="Write to this file instead of stdout (HTML always goes to a file: default "
            "./llmbench-report-<time>.html); to a folder (one that exists, or a path ending in /): "
            "llmbench-report-<time>.<format> inside it.",
        ),
    ] = None,
    min_effect: MinEffectOption = 1.0,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            "-m",
            help="A metric to show in the overview and delta tables (repeatable, or comma-separated; default: "
            "each table's headline metrics), e.g. output_throughput, tpot_p50, ttft_p99.",
        ),
    ] = None,
    view: Annotated[
        list[ViewName] | None,
        typer.Option(
            help="A table to build (repeatable; default: all but changes, the compact form of deltas, and "
            "batches, decode steps by batch size)."
        ),
    ] = None,
    intervals: Annotated[
        bool, typer.Option("--intervals", help="Show each figure's 95% interval beside it in the overview.")
    ] = False,
) -> None:
    """Tables comparing runs: grouped by scenario, one column per configuration and sweep point; incomplete
    runs are shown, marked, and never judged."""
    from llmbench.bench.report import build_report
    from llmbench.bench.report.html import render_html
    from llmbench.bench.report.views import to_markdown
    from llmbench.bench.store import os_reason
    from llmbench.cli.views import print_view

    metrics = [m.strip() for item in metric or [] for m in item.split(",") if m.strip()]
    views = [v.value for v in view or []] or None
    rep = build_report(dirs, baseline, min_effect / 100, metrics or None, views, intervals)
    for p in rep.problems:
        warning(f"skipped {p.path}: {p.reason}")
    for p in rep.doubts:
        warning(f"{p.path}: {p.reason}")
    nothing = bool(views) and len(rep.empty) == len(set(views))  # nothing asked for has anything to show
    for line in rep.empty:
        (error if nothing else warning)(line)
    if nothing:
        raise typer.Exit(EXIT_INPUT)
    if format is Format.csv:
        text = _csv(rep, metrics, views)
    elif format is Format.markdown:
        text = "\n".join(to_markdown(v) for s in rep.sections for v in s.views)
    elif format is Format.html:
        problems = [f"{p.path}: {p.reason}" for p in rep.problems]
        doubts = [f"{p.path}: {p.reason}" for p in rep.doubts]
        text = render_html([(s.scenario, s.views, s.groups) for s in rep.sections], problems, doubts)
        out = out or "."  # megabytes of embedded plots are of no use on a terminal
    else:
        target = console if out is None else Console(record=True, width=160, file=io.StringIO())
        for s in rep.sections:
            for v in s.views:
                print_view(v, target)
        if out is None:
            _damaged_late(rep)
            return
        text = target.export_text()
    _damaged_late(rep)
    if out is None:
        print(text, end="" if text.endswith("\n") else "\n")
        return
    target = Path(out)
    if target.is_dir() or out.endswith(("/", os.sep)):  # a folder: a new file inside it, named by the time
        target = _free(target / f"llmbench-report-{time.strftime('%Y%m%d-%H%M%S')}.{_SUFFIX[format]}")
    if (kept := _kept_by_llmbench(target)) is not None:
        raise BenchError(f"--out {target}: {kept}; write the report elsewhere")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BenchError(
            f"--out {target}: cannot write the report there ({os_reason(exc, target)})"
        ) from None
    note(f"report written to {target}")


def _damaged_late(rep) -> None:
    """Warn of the tables found unreadable only when read in full (their footers were sound)."""
    from llmbench.bench.report.tables import damage

    said = {p.path for p in rep.doubts}
    for g in (g for s in rep.sections for g in s.groups):
        for path, why in g.damaged.items():
            if path not in said:
                warning(f"{path}: {damage(path, why)}")
                said.add(path)


CSV_VIEWS = ("deltas", "changes")  # a view with a CSV form of its own: the comparisons


def _csv(rep, metrics: list[str], views: list[str] | None) -> str:
    """The tidy figures (one row per configuration, point and metric), or with ``--view deltas`` or
    ``changes`` every comparison with the baseline (change, interval, verdict)."""
    other = [v for v in views or [] if v not in CSV_VIEWS]
    if other:
        raise BenchError(
            f"--format csv --view {other[0]}: CSV holds the figures (no --view) or the comparisons with the "
            f"baseline (--view {' or '.join(CSV_VIEWS)}); that view has no CSV form (use --format markdown or html)"
        )
    if views:
        return rep.comparisons(metrics or None).to_csv(index=False)
    return rep.frame(metrics or None).to_csv(index=False)


_SUFFIX = {Format.table: "txt", Format.markdown: "md", Format.html: "html", Format.csv: "csv"}
RECORDS = ("ablation.json", "profile.json", "comparison.json", "quality.json")  # an ablation's or a profile's


def _kept_by_llmbench(target: Path) -> str | None:
    """Why a report must not be written at ``target``: it is inside a run folder (results are never
    overwritten, and a file added there is read as part of the run) or it is the record of an ablation or a
    profile. Any other path is the user's to name, an existing file too."""
    from llmbench.bench.store import REQUIRED, TABLES

    where = target.resolve()
    run_files = (*REQUIRED, *(f"{t}.parquet" for t in TABLES))
    if any((where.parent / name).exists() for name in run_files):
        return f"{where.parent} is a run folder, which llmbench never writes into after the run"
    if where.name in RECORDS and where.exists():
        return f"{where.name} is the record llmbench keeps of an ablation or a profile"
    return None


def _free(path: Path) -> Path:
    """``path``, or ``<stem>-2<suffix>``, ``-3``... when it is taken."""
    candidate, k = path, 2
    while candidate.exists():
        candidate, k = path.with_name(f"{path.stem}-{k}{path.suffix}"), k + 1
    return candidate
