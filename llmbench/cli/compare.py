"""``llmbench compare``: a regression gate between two runs (non-zero exit on a regression).

A regression is a ``worse`` verdict of the report's own rule with ``--fail-above`` as its threshold: the
whole 95% interval of the change lies beyond the threshold on the worse side. Runs with a single repeat
have no interval, so they are never judged (``inconclusive (n=1)``); an incomplete run is never judged.

Exit status: 1 on a regression; 2 when nothing could be compared (no scenario, sweep point or metric
that both hold: bad input, like a folder without runs), so that a gate never passes on nothing; else 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from llmbench.bench.errors import StoreError
from llmbench.cli.console import console, error, note, warning
from llmbench.cli.errors import EXIT_FAILED, handle_errors

if TYPE_CHECKING:
    from llmbench.bench.report.frame import Group


def _models(a: Group, b: Group) -> tuple[str, str] | None:
    """The models two groups measured, when they differ: as loaded (model_info) where both recorded it,
    else as their scenarios named them. One name read from two folders (a hub id's cache moved to another
    revision) is two models, named by their folders."""
    ia, ib = ((g.meta.get("model_info") or {}) for g in (a, b))
    fa, fb = ia.get("folder"), ib.get("folder")
    if ia.get("name") and ia.get("name") == ib.get("name") and fa and fb and fa != fb:
        return f"{ia['name']} from {fa}", f"{ib['name']} from {fb}"
    for outer in ("model_info", "scenario"):
        key = "name" if outer == "model_info" else "model"
        ma, mb = ((g.meta.get(outer) or {}).get(key) for g in (a, b))
        if ma and mb:
            return (ma, mb) if ma != mb else None
    return None


def _one_per_scenario(path: Path, role: str) -> dict[str, Group]:
    from llmbench.bench.report.frame import load_groups

    groups, problems = load_groups([path])
    for p in problems:
        warning(f"skipped {p.path}: {p.reason}")
    for p in (d for g in groups for d in g.doubts):
        warning(f"{p.path}: {p.reason}")
    if not groups:
        raise StoreError(f"{role} {path}: holds no run")
    out: dict[str, Group] = {}
    for g in groups:
        if g.scenario in out:
            raise StoreError(
                f"{role} {path}: holds several configurations of scenario {g.scenario!r} "
                f"({out[g.scenario].label}, {g.label}); point at one run folder"
            )
        out[g.scenario] = g
    return out


@handle_errors
def compare(
    base: Annotated[
        Path, typer.Argument(help="The reference run folder (or a folder with one run per scenario).")
    ],
    new: Annotated[Path, typer.Argument(help="The run folder to check against it.")],
    fail_above: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Fail when a metric got worse by more than this many percent: its whole 95% interval beyond it.",
        ),
    ] = 5.0,
) -> None:
    """Fail (exit 1) when NEW is worse than BASE: the whole 95% interval of a change beyond the threshold;
    exit 2 when they have nothing to compare (no scenario, sweep point or metric in common)."""
    from llmbench.bench.report.compare import GATE_METRICS, change, judged, method_note
    from llmbench.bench.report.format import format_pct, format_pct_interval, format_value, metric_label

    a, b = _one_per_scenario(base, "BASE"), _one_per_scenario(new, "NEW")
    common = sorted(set(a) & set(b))
    if not common:
        raise StoreError(f"BASE and NEW share no scenario (BASE: {', '.join(a)}; NEW: {', '.join(b)})")
    for role, only in (("BASE", sorted(set(a) - set(b))), ("NEW", sorted(set(b) - set(a)))):
        if only:
            warning(f"only in {role}, not compared: {', '.join(only)}")
    threshold = fail_above / 100
    regressions = inconclusive = judged_metrics = 0
    for scenario in common:
        ga, gb = a[scenario], b[scenario]
        if models := _models(ga, gb):
            warning(f"{scenario}: BASE ran {models[0]}, NEW ran {models[1]}: the comparison is across models")
        points = [p for p in ga.points if p in gb.points]
        if not points:
            warning(
                f"{scenario}: BASE and NEW share no sweep point (BASE: {', '.join(ga.points) or 'none'}; "
                f"NEW: {', '.join(gb.points) or 'none'})"
            )
        for point in points:
            names = (ga.label, gb.label) if ga.label != gb.label else (str(base), str(new))
            table = Table(
                title=f"{scenario} {point}: {names[0]} → {names[1]}", title_justify="left", show_edge=False
            )
            for h, right in (
                ("metric", False),
                ("base", True),
                ("new", True),
                ("change", True),
                ("95% CI", True),
                ("verdict", False),
            ):
                table.add_column(h, justify="right" if right else "left", no_wrap=not right)
            changes = []
            for m in GATE_METRICS:
                c = change(ga, gb, point, m)
                v = judged(ga, gb, point, c, threshold)
                if v == "n/a":
                    continue
                changes.append(c)
                judged_metrics += 1
                regressions += v.startswith("worse")
                inconclusive += v.startswith(("inconclusive", "none"))
                style = "red" if v.startswith("worse") else "green" if v.startswith("better") else ""
                ci = format_pct_interval(c.rel_low, c.rel_high) if c.method else "–"
                table.add_row(
                    metric_label(m),
                    format_value(m, c.base),
                    format_value(m, c.new),
                    format_pct(c.rel),
                    ci,
                    f"[{style}]{v}[/]" if style else v,
                )
            console.print(table)
            note(method_note(changes, threshold))
            for g in (ga, gb):
                for w in g.warnings(point):
                    warning(f"{g.label}: {w}")
    if not judged_metrics:
        raise StoreError(
            "nothing was compared: BASE and NEW share no sweep point with a metric measured on both sides"
        )
    if regressions:
        error(
            f"{regressions} metric(s) got worse by more than {fail_above:g}%, their whole 95% interval beyond it"
        )
        raise typer.Exit(EXIT_FAILED)
    if inconclusive:
        note(f"{inconclusive} metric(s) inconclusive or not judged: no regression shown, none ruled out")
    note(f"no regression beyond {fail_above:g}% (whole 95% interval)")
