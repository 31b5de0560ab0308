"""``llmbench compare``: a regression gate between two runs (non-zero exit on a regression).

A regression is a ``worse`` verdict of the report's own rule with ``--fail-above`` as its threshold: the
whole 95% interval of the change lies beyond the threshold on the worse side. Runs with a single repeat
have no interval, so they are never judged (``inconclusive (n=1)``); an incomplete run is never judged.

The gate judges a few headline metrics (``GATE_METRICS``, or ``--metric``) at every sweep point both runs
hold, and holds its false alarms to 5% for the whole gate, not per metric: each interval is widened to
1 - 0.05/m for m comparisons (Bonferroni), so two identical configurations fail it by chance in at most 5%
of gates however many metrics and points it looks at.

NEW losing a larger share of its requests than BASE (failed ones, or outputs not the length asked for) is a
regression too, whatever the latencies of the requests it served say, when more than chance explains it: a
one-sided exact binomial test (``stats.excess_loss_p``) at the same 0.05/m. Each kind of lost request that
either run lost one to at a sweep point is one of the m comparisons; a kind neither lost any to cannot fail
the gate, so it takes no share.

Exit status: 0 when at least one metric was judged and none got worse; 1 on a regression; 2 when nothing
can be compared (no scenario, sweep point or metric that both hold; one run folder given twice; runs of
different workloads unless ``--allow-other-workload``); 3 when the data cannot support a verdict (a run is
incomplete, or no metric got one: too few repeats, too much spread), so that a gate never passes on
nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NamedTuple

import typer
from rich.table import Table

from llmbench.bench.errors import StoreError
from llmbench.cli.console import console, error, note, warning
from llmbench.cli.errors import EXIT_FAILED, EXIT_UNJUDGED, handle_errors

if TYPE_CHECKING:
    from llmbench.bench.report.frame import Group

# What two runs must share to be compared: the load they served (engine options may differ: that is what
# a gate compares).


def _one_per_scenario(path: Path, role: str) -> dict[str, Group]:
    from llmbench.bench.report.frame import load_groups
    from llmbench.bench.report.tables import probe

    groups, problems = load_groups([path])
    for p in problems:
        warning(f"skipped {p.path}: {p.reason}")
    for p in (d for g in groups for d in g.doubts):
        warning(f"{p.path}: {p.reason}")
    for run in (r for g in groups for r in g.runs):  # the gate judges summary.json's figures alone
        for path, why in probe(run).items():
            warning(f"{path}: unreadable ({why}); the gate reads summary.json's figures, not this table")
    if not groups:
        raise StoreError(
            f"{role} {path}: {'holds no run' if Path(path).exists() else 'no such file or folder'}"
        )
    out: dict[str, Group] = {}
    for g in groups:
        if g.scenario in out:
            raise StoreError(
                f"{role} {path}: holds several configurations of scenario {g.scenario!r} "
                f"({out[g.scenario].label}, {g.label}); point at one run folder"
            )
        out[g.scenario] = g
    return out


def _rate(group: Group, point: str) -> float | None:
    """The request rate a sweep point served (a fraction of each run's own capacity differs by run)."""
    for p in group.runs[0].summary.get("points") or []:
        if p.get("label") == point and isinstance(p.get("arrival"), dict):
            rate = p["arrival"].get("rate")
            return float(rate) if isinstance(rate, int | float) else None
    return None


def _gate_point(
    title: str,
    names: tuple[str, str],
    ga: Group,
    gb: Group,
    point: str,
    gated: list[str],
    confidence: float,
    threshold: float,
) -> list[str]:
    """One sweep point's table of the gated metrics; the verdict of each metric that has a direction."""
    from llmbench.bench.report.compare import change, judged, method_note
    from llmbench.bench.report.format import format_change, format_change_interval, format_value, metric_label

    rates = [_rate(g, point) for g in (ga, gb)]
    served = (
        f" (BASE at {rates[0]:.3g} req/s, NEW at {rates[1]:.3g} req/s)"
        if None not in rates and rates[0] != rates[1]
        else ""
    )
    table = Table(title=f"{title}: {names[0]} → {names[1]}{served}", title_justify="left", show_edge=False)
    headers = ("metric", "base", "new", "change", f"{confidence * 100:.3g}% CI", "verdict")
    for h in headers:
        right = h not in ("metric", "verdict")
        table.add_column(h, justify="right" if right else "left", no_wrap=not right)
    changes, verdicts = [], []
    for m in gated:
        c = change(ga, gb, point, m, confidence)
        v = judged(ga, gb, point, c, threshold)
        if v == "n/a":
            continue
        changes.append(c)
        verdicts.append(v)
        style = "red" if v.startswith("worse") else "green" if v.startswith("better") else ""
        ci = format_change_interval(m, c.rel_low, c.rel_high, c.absolute) if c.method else "–"
        table.add_row(
            metric_label(m), format_value(m, c.base), format_value(m, c.new),
            format_change(m, c.rel, c.absolute), ci, f"[{style}]{v}[/]" if style else v,
        )  # fmt: skip
    console.print(table)
    note(method_note(changes, threshold, confidence))
    for role, g in (("BASE", ga), ("NEW", gb)):  # the two may share a label (both "default")
        for w in dict.fromkeys(g.warnings(point)):
            warning(f"{role} ({g.label}): {w}")
    return verdicts


# Requests NEW lost: a failure, or an output stopped short of (or past) the length asked. Each is a
# regression when NEW lost a larger share of its requests than BASE did by more than chance explains: the
# latencies of what was served say nothing of what was not.
LOST = (
    ("num_failed", "NEW failed {new} of {n_new} requests (BASE {base} of {n_base}"),
    ("num_output_mismatch", "NEW's outputs were not the length asked for in {new} of {n_new} requests (BASE {base} of {n_base}"),
)  # fmt: skip


class LostTest(NamedTuple):
    text: str  # what NEW lost against BASE, with the test's p-value
    regression: bool  # below the gate's per-comparison alpha


def _total(g: Group, point: str, metric: str) -> int:
    return int(sum(v for v in g.repeat_values(point, metric) if v == v))  # NaN: not recorded


def _served(group: Group, point: str) -> float:
    """The requests the group's repeats completed at ``point`` (NaN when none recorded the count)."""
    counts = [v for v in group.repeat_values(point, "num_completed") if v == v]
    return sum(counts) if counts else float("nan")


def _lost_kinds(ga: Group, gb: Group, point: str) -> int:
    """How many kinds of lost request BASE or NEW lost one to at ``point``: the gate's comparisons of them."""
    return sum(_total(ga, point, m) + _total(gb, point, m) > 0 for m, _ in LOST)


def _lost(ga: Group, gb: Group, point: str, alpha: float) -> list[LostTest]:
    """Each kind of lost request of which NEW lost a larger share than BASE at ``point``, tested: a regression
    when the one-sided exact binomial test's p-value is below ``alpha``."""
    from llmbench.bench.stats import excess_loss_p

    out = []
    n_base, n_new = _total(ga, point, "num_requests"), _total(gb, point, "num_requests")
    for metric, text in LOST:
        base, new = _total(ga, point, metric), _total(gb, point, metric)
        if not n_new or new * max(n_base, 1) <= base * n_new:
            continue
        p = excess_loss_p(base, n_base, new, n_new)
        why = (
            f"; p = {p:.2g} < {alpha:.2g}, one-sided exact binomial test)"
            if p < alpha
            else f"; p = {p:.2g}, not below {alpha:.2g}: within chance, not held against NEW)"
        )
        line = text.format(new=new, n_new=n_new, base=base, n_base=n_base) + why
        out.append(LostTest(f"{gb.scenario} {point}: {line}", p < alpha))
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
            help="Fail when a metric got worse by more than this many percent: its whole interval beyond it.",
        ),
    ] = 5.0,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            "-m",
            help="Metrics to gate (repeatable, or comma-separated; default: output throughput, TTFT p50 and "
            "p99, TPOT p50). The more metrics and sweep points, the wider each interval.",
        ),
    ] = None,
    allow_other_workload: Annotated[
        bool,
        typer.Option(
            help="Compare runs whose workload, arrivals, sampling or SLO differ (by default an error)."
        ),
    ] = False,
    require_all: Annotated[
        bool,
        typer.Option(
            help="Exit 3 unless every gated comparison got a verdict: an inconclusive one (a regression "
            "neither shown nor ruled out) does not pass the gate.",
        ),
    ] = False,
) -> None:
    """Fail (exit 1) when NEW is worse than BASE: the whole interval of a change beyond the threshold; exit
    2 when they have nothing to compare, 3 when the data cannot support a verdict."""
    from llmbench.bench.metrics import METRICS
    from llmbench.bench.report.compare import (
        GATE_METRICS,
        different_machines,
        different_models,
        workload_differences,
    )
    from llmbench.bench.stats import CONFIDENCE, MIN_VERDICT_REPEATS
    from llmbench.suggest import did_you_mean

    gated = [m.strip() for item in metric or [] for m in item.split(",") if m.strip()] or list(GATE_METRICS)
    for m in gated:
        if m not in METRICS or not METRICS[m].better:
            judgeable = [k for k, info in METRICS.items() if info.better]
            raise StoreError(
                f"--metric {m!r}: not a metric with a better direction{did_you_mean(m, judgeable)}. "
                f"Metrics: {', '.join(judgeable)}"
            )
    if base.resolve() == new.resolve():
        raise StoreError(f"BASE and NEW are the same folder ({base}): compare two runs")
    a, b = _one_per_scenario(base, "BASE"), _one_per_scenario(new, "NEW")
    common = sorted(set(a) & set(b))
    if not common:
        raise StoreError(f"BASE and NEW share no scenario (BASE: {', '.join(a)}; NEW: {', '.join(b)})")
    for role, only in (("BASE", sorted(set(a) - set(b))), ("NEW", sorted(set(b) - set(a)))):
        if only:
            warning(f"only in {role}, not compared: {', '.join(only)}")
    for scenario in common:
        if (diffs := workload_differences(a[scenario], b[scenario])) and not allow_other_workload:
            raise StoreError(
                f"{scenario}: BASE and NEW served different workloads ({'; '.join(diffs[:4])}"
                f"{'; ...' if len(diffs) > 4 else ''}): their latencies and throughputs do not compare "
                "(--allow-other-workload to compare them anyway)"
            )
    pairs = [(s, p) for s in common for p in a[s].points if p in b[s].points]
    # Bonferroni: m comparisons at 1 - 0.05/m each keep the whole gate's false alarms at 5%; a kind of lost
    # request is one of them where either side lost one (given the counts, its test holds its level).
    kinds = sum(_lost_kinds(a[s], b[s], p) for s, p in pairs)
    comparisons = len(pairs) * len(gated) + kinds
    alpha = (1 - CONFIDENCE) / max(1, comparisons)
    confidence = 1 - alpha
    threshold = fail_above / 100
    incomplete = sorted(
        {
            f"{role} {g.label}: {g.status}"
            for s in common
            for role, g in (("BASE", a[s]), ("NEW", b[s]))
            if not g.complete
        }
    )
    shown: list[str] = []  # every comparison's verdict
    for scenario in common:
        ga, gb = a[scenario], b[scenario]
        if models := different_models(ga, gb):
            warning(f"{scenario}: BASE ran {models[0]}, NEW ran {models[1]}: the comparison is across models")
        if machines := different_machines(ga, gb):
            warning(
                f"{scenario}: BASE ran on {machines[0]}, NEW on {machines[1]}: the comparison is across "
                "machines as well as configurations"
            )
        points = [p for p in ga.points if p in gb.points]
        if not points:
            warning(
                f"{scenario}: BASE and NEW share no sweep point (BASE: {', '.join(ga.points) or 'none'}; "
                f"NEW: {', '.join(gb.points) or 'none'})"
            )
        names = (ga.label, gb.label) if ga.label != gb.label else (str(base), str(new))
        for point in points:
            shown += _gate_point(f"{scenario} {point}", names, ga, gb, point, gated, confidence, threshold)
    tests = [t for s, p in pairs for t in _lost(a[s], b[s], p, alpha)]
    lost = [t.text for t in tests if t.regression]
    for t in tests:
        (error if t.regression else note)(t.text)
    regressions = sum(v.startswith("worse") for v in shown) + len(lost)
    verdicts = sum(v.startswith(("worse", "better", "equivalent")) for v in shown)
    judged_metrics = len(shown)
    # NEW served none of a point's requests where BASE served some: a regression whatever their number (a
    # test of shares needs more requests than a small run has; a run that served nothing failed outright)
    dead = [f"{s} {p}" for s, p in pairs if _served(b[s], p) == 0 < _served(a[s], p)]
    if dead:
        error(f"NEW completed no request at {', '.join(dead)}, where BASE completed some")
    if not judged_metrics and (lost or dead):  # no latency left to compare: the lost requests decide
        error("no metric measured on both sides: NEW's lost requests (above) are the regression")
        raise typer.Exit(EXIT_FAILED)
    if dead:
        raise typer.Exit(EXIT_FAILED)
    if not judged_metrics:
        raise StoreError(
            "nothing was compared: BASE and NEW share no sweep point with a metric measured on both sides"
        )
    if comparisons > 1:
        of_lost = (
            f" ({kinds} of them whether NEW lost more requests, each at p < {alpha:.2g})" if kinds else ""
        )
        shared = [
            role
            for role, groups in (("BASE", a), ("NEW", b))
            if not all(g.own_processes for g in groups.values())
        ]
        holds = (
            f"{' and '.join(shared)}'s repeats share one process (--one-process), so what differs between "
            "processes or hours is not in its intervals"
            if shared
            else "each repeat ran in a process of its own, but what differs between two sittings (another "
            "hour, a warmer GPU) is not in its intervals"
        )
        note(
            f"{comparisons} comparisons{of_lost}, each interval at {confidence * 100:.3g}% so that together "
            "they hold 95%: two identical configurations fail this gate by chance in at most 5% of gates, "
            f"where the runs differ by their repeats' noise alone ({holds}: interleave with `llmbench ablate` "
            "to cover it)"
        )
    if regressions > len(lost):
        error(
            f"{regressions - len(lost)} metric(s) got worse by more than {fail_above:g}%, their whole interval "
            "beyond it"
        )
    if regressions:
        raise typer.Exit(EXIT_FAILED)
    if incomplete:
        error(f"no verdict: {'; '.join(incomplete)} (an incomplete run is shown, never judged)")
        raise typer.Exit(EXIT_UNJUDGED)
    if not verdicts:
        fewest = (
            min(len(g.points.get(p, [])) for s in common for g in (a[s], b[s]) for p in g.points)
            if common
            else 0
        )
        why = (
            f"too few repeats: use --repeats {MIN_VERDICT_REPEATS} or more"
            if fewest < MIN_VERDICT_REPEATS
            else "the repeats spread too widely for an interval that narrow: more repeats narrow it"
        )
        error(
            f"no verdict: none of the {judged_metrics} comparisons could be judged ({why}): no regression "
            "shown, none ruled out"
        )
        raise typer.Exit(EXIT_UNJUDGED)
    if verdicts < judged_metrics:
        (error if require_all else note)(
            f"{judged_metrics - verdicts} comparison(s) inconclusive: no regression shown there, none ruled out"
            + (" (--require-all)" if require_all else "")
        )
        if require_all:
            raise typer.Exit(EXIT_UNJUDGED)
    note(f"no regression beyond {fail_above:g}% among the {verdicts} comparison(s) judged")
