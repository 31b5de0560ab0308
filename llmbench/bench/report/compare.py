"""A variant against its baseline: the relative change of each metric, its 95% interval, and a verdict.

``change`` takes the per-repeat values of both groups. Variants of one ablation are paired
by repeat index (same prompts and arrival times, run back to back): t-interval on the per-repeat log
ratios. Other pairs of groups (separate runs, different ablations) are compared unpaired: Welch t-interval
on the logs. See ``stats.relative_change``.

``verdict`` applies one rule everywhere (``ablate``, ``report``, and ``compare``, where a regression is a
``worse`` verdict) with a practical threshold h: ``better`` / ``worse`` when the whole 95% interval lies
beyond h on that side, ``equivalent`` when it lies within [-h, +h], otherwise ``inconclusive (n=K)``, K
the repeats compared (below ``stats.MIN_VERDICT_REPEATS`` always: one repeat has no interval, two give a
verdict by chance when run-to-run noise comes in modes; see ``stats.classify``). A change that is a
difference in the metric's unit (a baseline of 0, or a metric that can be below 0: ``stats.relative_change``)
is judged the same way against ±h of the baseline's value (0 when the baseline is 0). Metrics without a
better direction get ``n/a``, as does one not measured on both sides. ``judged`` is the verdict as shown:
none for incomplete runs (they are shown, not judged), and marked when the runs carry warnings that make
timings doubtful (busy machine, lagging driver). ``chance_note`` says, under a table of many verdicts, how
many of them a change that does nothing would still give.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from llmbench.bench.metrics import METRICS
from llmbench.bench.report.frame import Group
from llmbench.bench.report.kept import SIGNED
from llmbench.bench.report.warning_flags import TIMING_FLAGS
from llmbench.bench.stats import (
    BETTER,
    CONFIDENCE,
    EQUIVALENT,
    MIN_VERDICT_REPEATS,
    WORSE,
    classify,
    relative_change,
)

# What an ablation and the regression gate look at first.
DELTA_METRICS = (
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "itl_p50",
    "e2e_p50",
    "output_throughput",
    "decode_step_mean",  # the per-step cost of what a variant changes (a sampling setting, a kernel)
    "decode_fixed",  # ... and which part of it: the step's fixed part, or the rate it reads K/V at
    "decode_kv_rate",
    "decode_host_time",  # the host's own work per decode step (a step the device waits for)
    "peak_memory",
    "energy_per_token",
)
# What ``llmbench compare`` gates by default: few, so that its intervals, widened for the number of
# comparisons, stay narrow enough to catch a regression (``--metric`` picks others).
GATE_METRICS = ("output_throughput", "ttft_p50", "ttft_p99", "tpot_p50")
DEFAULT_MIN_EFFECT = 0.01  # 1%: smaller changes are not worth a verdict in practice
TIMED_UNITS = ("s", "tok/s", "req/s")  # metrics a busy machine or a lagging driver distorts
_WORDS = {BETTER: "better", WORSE: "worse", EQUIVALENT: "equivalent"}


class Change(NamedTuple):
    metric: str
    base: float  # the baseline's repeats compared: their geometric mean (arithmetic when one is <= 0)
    new: float  # the same of the variant's (new / base - 1 == rel)
    rel: float  # relative change (ratio of geometric means - 1; see stats.relative_change) ...
    rel_low: float  # ... with its 95% interval, NaN when there is none
    rel_high: float
    n: int  # repeats compared (pairs when paired)
    # "paired" | "unpaired" (+ " (difference)" or " (absolute difference)"), None without an interval
    method: str | None
    absolute: bool = False  # rel, rel_low, rel_high are new - base in the metric's unit, not fractions


WORKLOAD_KEYS = ("workload", "arrival", "sampling", "slo", "warmup", "seed")


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two resolved scenario values differ, as ``path: a against b`` (dicts compared key by key)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _differences(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        return out
    return [] if a == b else [f"{path}: {a!r} against {b!r}"]


def workload_differences(a: Group, b: Group) -> list[str]:
    """Where two groups' workloads differ (requests, arrivals, sampling, SLO, warm-up, seed): runs that
    did not serve the same requests, whose latencies and outputs compare nothing."""
    sa, sb = (g.meta.get("scenario") or {} for g in (a, b))
    if not sa or not sb:  # runs that did not record their scenario: nothing to check
        return []
    return [d for key in WORKLOAD_KEYS for d in _differences(sa.get(key), sb.get(key), key)]


def machine_of(g: Group) -> str | None:
    """What a group ran on, as far as timings depend on it: its GPUs' models, or the host and its CPUs when
    it used none (None when its runs did not record it)."""
    m = g.meta.get("machine") or {}
    gpus = [str(x.get("name", "?")) for x in m.get("gpus") or [] if isinstance(x, dict)]
    if gpus:
        names = sorted(set(gpus))
        return ", ".join(f"{gpus.count(n)} x {n}" if gpus.count(n) > 1 else n for n in names)
    if m.get("hostname"):
        return f"{m['hostname']} ({m.get('cpu_count', '?')} CPUs, no GPU)"
    return None


def different_machines(a: Group, b: Group) -> tuple[str, str] | None:
    """The machines two groups ran on, when they differ (their GPU models, or CPU hosts): their timings
    then compare machines as much as configurations."""
    ma, mb = machine_of(a), machine_of(b)
    return (ma, mb) if ma and mb and ma != mb else None


def different_models(a: Group, b: Group) -> tuple[str, str] | None:
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


def change(base: Group, new: Group, point: str, metric: str, confidence: float = CONFIDENCE) -> Change:
    """``confidence``: of the interval (``llmbench compare`` widens it for the many metrics it gates)."""
    a, b = base.repeat_values(point, metric), new.repeat_values(point, metric)
    if base.paired_with(new):
        by_repeat = dict(zip(new.repeat_indices(point), b, strict=True))
        common = [
            (x, by_repeat[r]) for r, x in zip(base.repeat_indices(point), a, strict=True) if r in by_repeat
        ]
        xs, ys = [x for x, _ in common], [y for _, y in common]
        rc = relative_change(xs, ys, paired=True, confidence=confidence, signed=metric in SIGNED)
        if rc.n >= 2 or (rc.n == 1 and min(_count(a), _count(b)) < 2):
            return Change(metric, *rc)
        # Too few repeats share an index (a repeat failed on one side): compare the sets unpaired.
    return Change(
        metric, *relative_change(a, b, paired=False, confidence=confidence, signed=metric in SIGNED)
    )


def _count(values: list[float]) -> int:
    return sum(math.isfinite(v) for v in values)


def verdict(c: Change, threshold: float) -> str:
    """``better`` / ``worse`` / ``equivalent`` / ``inconclusive (n=K)`` / ``n/a`` (see the module
    docstring); ``threshold`` is a fraction (0.01 = 1%)."""
    better = METRICS[c.metric].better if c.metric in METRICS else ""
    if not better or math.isnan(c.rel):
        return "n/a"
    h = threshold * abs(c.base) if c.absolute else threshold  # a difference: h of the baseline's value
    code = int(classify(c.rel_low, c.rel_high, better, h, c.n))
    return _WORDS.get(code, f"inconclusive (n={c.n})")


def judged(base: Group, new: Group, point: str, c: Change, threshold: float) -> str:
    """The verdict as a report shows it: none on incomplete runs; on runs flagged busy or lagging, a
    verdict on a timing (latency, throughput) says so."""
    incomplete = [g.label for g in (base, new) if not g.complete]
    if incomplete:
        return f"none ({' and '.join(incomplete)}: incomplete run)"
    v = verdict(c, threshold)
    doubt = [f for f in TIMING_FLAGS if f in base.flags(point) or f in new.flags(point)]
    if doubt and v != "n/a" and METRICS[c.metric].unit in TIMED_UNITS:
        flagged = f"runs flagged {', '.join(doubt)}"
        v = f"{v[:-1]}; {flagged})" if v.endswith(")") else f"{v} ({flagged})"
    return v


def method_note(changes: list[Change], threshold: float, confidence: float = CONFIDENCE) -> str:
    """One line saying how the intervals and verdicts of a comparison were made."""
    methods = {c.method.split(" ")[0] for c in changes if c.method}
    ns = sorted({c.n for c in changes if c.n})
    reps = f" (n={'/'.join(map(str, ns))})" if ns else ""
    if "paired" in methods:
        how = "t-interval on per-repeat log ratios, repeats paired by index"
    elif "unpaired" in methods:
        how = "Welch t-interval on the log values of separate runs"
    elif ns:
        how = "no interval: one repeat per side has no run-to-run variance; use --repeats 3 or more"
    else:
        how = "none: no metric here was measured on both sides"
    if any(c.method and c.method.endswith("(difference)") for c in changes):
        how += "; for a metric with a zero among its repeats, on the difference of the means"
    absolute = (
        "; a change in the metric's unit, not in %, is the difference of the means with its t-interval, "
        "where a percentage has no base (a baseline of 0, or a metric that can be below 0), judged against "
        f"±{threshold * 100:g}% of the baseline's value"
        if any(c.absolute for c in changes)
        else ""
    )
    few = ns and max(ns) < MIN_VERDICT_REPEATS
    return (
        f"{confidence * 100:.3g}% CI: {how}{reps}; change: ratio of the repeats' geometric means (the "
        f"values shown beside it){absolute}. Verdicts: better/worse when the whole interval lies beyond "
        f"±{threshold * 100:g}%, equivalent when it lies within it, else inconclusive; none below "
        f"{MIN_VERDICT_REPEATS} repeats" + (" (use --repeats 3 or more for one)." if few else ".")
    )


MANY_VERDICTS = 3  # from this many verdicts in one table, the chance of one among them is worth a line


def _verdicts(shown: list[tuple[Change, str]]) -> int:
    """How many of ``shown`` could get a verdict (``chance_note``)."""
    return sum(
        1 for c, v in shown if c.method and c.n >= MIN_VERDICT_REPEATS and not v.startswith(("n/a", "none"))
    )


def tables_chance_note(tables: list[list[tuple[Change, str]]], confidence: float = CONFIDENCE) -> list[str]:
    """One line under the last of several tables (one a sweep point or a variant): the verdicts of all of
    them and how many a change that does nothing would give by chance, each table's own count being a part."""
    counts = [_verdicts(shown) for shown in tables]
    if sum(1 for n in counts if n) < 2:
        return []
    total, alpha = sum(counts), 1 - confidence
    return [
        f"across the {len(tables)} tables of these comparisons: {total} verdicts, up to {total * alpha:.2g} "
        "of them better or worse by chance for changes that do nothing"
    ]


def chance_note(shown: list[tuple[Change, str]], confidence: float = CONFIDENCE) -> list[str]:
    """One line for a table of several verdicts (``shown``: each change with its verdict as shown): how many
    it holds, and how many of them a change that does nothing would read better or worse by chance: at most
    1 - ``confidence`` each (an interval misses the true change that often, and a practical threshold only
    makes a verdict rarer; BENCHMARKS.md's calibration measures it). Comparisons that cannot get a verdict
    (no interval, too few repeats, no direction, an incomplete run) are not counted."""
    count = _verdicts(shown)
    if count < MANY_VERDICTS:
        return []
    alpha = 1 - confidence
    return [
        f"{count} verdicts, each better or worse by chance in at most {alpha * 100:.3g}% of tables for a change "
        f"that does nothing: up to {count * alpha:.2g} such verdicts expected here; read a lone one among many "
        "with that in mind"
    ]
