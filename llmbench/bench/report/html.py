"""A self-contained HTML report: the report's tables plus matplotlib plots embedded as base64 PNG.

Plots per scenario: latency against the request rate served (sweeps and runs of several rates: TTFT p50
and p99, TPOT p50, with 95% intervals), latency CDFs (TTFT, TPOT, E2E) per variant, output throughput per
variant with 95%
intervals, telemetry over time (GPU utilisation and power with NVML; process CPU % and RSS without), and
each decode step's time against the context it read (the decode step model's data: a variant that moves
the fixed part shifts the cloud, one that moves the K/V read rate tilts it). The page loads nothing from
anywhere. A plot that cannot be drawn (a figure no plot can place, a table that cannot be read) is
replaced by a note saying why; the rest of the page is drawn.
"""

from __future__ import annotations

import base64
import html
import io
import math
import time
from typing import Any

import numpy as np

from llmbench.bench.report.batches import bin_label, pooled_bins
from llmbench.bench.report.frame import Group
from llmbench.bench.report.profile_views import profile_bars
from llmbench.bench.report.tables import damage
from llmbench.bench.report.views import View

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3em 0.7em; }
th { text-align: left; background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; }
.problems { color: #a40; }
.notes { font-size: 0.85em; color: #555; }
"""


def view_html(view: View) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in view.headers)
    body = ""
    for row in view.rows:
        cells = "".join(
            f'<td class="num">{html.escape(c)}</td>' if num else f"<td>{html.escape(c)}</td>"
            for c, num in zip(row, view.numeric, strict=True)
        )
        body += f"<tr>{cells}</tr>\n"
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in view.notes)
    notes = f"<ul class='notes'>{notes}</ul>\n" if notes else ""
    return f"<h3>{html.escape(view.title)}</h3>\n<table><tr>{head}</tr>\n{body}</table>\n{notes}"


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display: render to memory only
    import matplotlib.pyplot as plt

    return plt


def latency_cdfs(groups: list[Group]) -> str:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    plotted = False
    for ax, (metric, title) in zip(
        axes, (("ttft_p50", "TTFT"), ("tpot_p50", "TPOT"), ("e2e_p50", "E2E latency")), strict=True
    ):
        for g in groups:
            for point in g.points:
                x = np.sort(g.request_samples(point, metric))
                x = x[np.isfinite(x)] * 1e3
                if x.size:
                    ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=f"{g.label} {point}")
                    plotted = True
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    if not plotted:
        plt.close(fig)
        return ""
    axes[0].legend(fontsize="small")
    return _png(fig)


def throughput_bars(groups: list[Group]) -> str:
    plt = _pyplot()
    labels, values, lows, highs = [], [], [], []
    for g in groups:
        for point in g.points:
            est = g.estimate(point, "output_throughput")
            if not _drawable(est["value"]):
                continue
            labels.append(f"{g.label}\n{point}")
            values.append(est["value"])
            lows.append(_bar(est["value"], est["ci_low"]))
            highs.append(_bar(est["ci_high"], est["value"]))
    if not values:
        return ""
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(values)), 4))
    ax.bar(range(len(values)), values, yerr=[lows, highs], capsize=4, color="#4878a8")
    ax.set_xticks(range(len(values)), labels, fontsize="small", rotation=30, ha="right")
    ax.set_ylabel("output tok/s (95% CI)")
    ax.set_title("output throughput per variant")
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def _drawable(value: float | None) -> bool:
    """A figure a plot can place: finite and not below 0 (the report reads any other as missing)."""
    return value is not None and math.isfinite(value) and value >= 0


def _bar(high: float | None, low: float | None) -> float:
    """One arm of an error bar, from ``low`` up to ``high``: 0 where an end is missing or they cross."""
    if high is None or low is None or not (math.isfinite(high) and math.isfinite(low)):
        return 0.0
    return max(0.0, high - low)


RATE_PANELS = (("ttft_p50", "TTFT p50"), ("ttft_p99", "TTFT p99"), ("tpot_p50", "TPOT p50"))


def rate_curves(groups: list[Group]) -> str:
    """Latency against the request rate each sweep point served, one line per configuration (what a
    serving benchmark's reader looks for first: where the latency bends as the load grows)."""
    curves = []
    for g in groups:
        points = []
        for point in g.points:
            rate = g.estimate(point, "request_throughput")["value"]
            if _drawable(rate):
                points.append((rate, point))
        if len(points) >= 2:
            curves.append((g, sorted(points)))
    if not curves:
        return ""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(RATE_PANELS), figsize=(15, 4))
    for ax, (metric, title) in zip(axes, RATE_PANELS, strict=True):
        for g, points in curves:
            ests = [g.estimate(point, metric) for _, point in points]
            ys = np.array([e["value"] * 1e3 if _drawable(e["value"]) else np.nan for e in ests])
            lo = np.array([_bar(e["value"], e["ci_low"]) * 1e3 for e in ests])
            hi = np.array([_bar(e["ci_high"], e["value"]) * 1e3 for e in ests])
            ax.errorbar([r for r, _ in points], ys, yerr=[lo, hi], marker="o", capsize=3, label=g.label)
        ax.set_title(f"{title} against the rate served")
        ax.set_xlabel("requests/s served")
        ax.set_ylabel("ms (95% CI)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    return _png(fig)


def telemetry_plot(groups: list[Group]) -> str:
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    plotted = False
    gpu = False
    for g in groups:
        df = g.table(g.runs[0], "telemetry")
        if df.empty:
            continue
        gpu_rows = df[df["gpu"] >= 0]
        if not gpu_rows.empty and np.isfinite(gpu_rows["gpu_util"]).any():
            gpu = True
            for idx, rows in gpu_rows.groupby("gpu"):
                t, util, power = _with_gaps(rows["time"], rows["gpu_util"], rows["power"])
                top.plot(t, util, label=f"{g.label} gpu{idx}")
                bottom.plot(t, power, label=f"{g.label} gpu{idx}")
        else:
            host = df.drop_duplicates("time")
            t, cpu, rss = _with_gaps(host["time"], host["cpu_percent"], host["rss"] / 2**30)
            top.plot(t, cpu, label=g.label)
            bottom.plot(t, rss, label=g.label)
        plotted = True
    if not plotted:
        plt.close(fig)
        return ""
    top.set_ylabel("GPU util (%)" if gpu else "process CPU (%)")
    bottom.set_ylabel("power (W)" if gpu else "RSS (GiB)")
    bottom.set_xlabel("seconds since the run started (first run of each variant)")
    top.legend(fontsize="small")
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3)
    return _png(fig)


def _with_gaps(time: Any, *series: Any) -> tuple[np.ndarray, ...]:
    """``time`` and ``series`` with a NaN wherever no sample was taken for more than three sampling periods
    (between the processes of a run's repeats, each sampled by its own): a plotted line breaks there
    instead of drawing samples that were never taken."""
    t = np.asarray(time, dtype=float)
    cols = [np.asarray(s, dtype=float) for s in series]
    if len(t) < 3:
        return (t, *cols)
    gaps = np.diff(t)
    cut = np.flatnonzero(gaps > 3 * np.median(gaps)) + 1
    return (np.insert(t, cut, t[cut - 1] + gaps[cut - 1] / 2), *(np.insert(c, cut, np.nan) for c in cols))


MAX_STEP_POINTS = 4000  # decode steps drawn per variant (evenly thinned beyond)


def decode_step_points(group: Group) -> tuple[np.ndarray, np.ndarray]:
    """The decode steps of a group's first run: context tokens read (thousands) and step time (ms)."""
    df = group.table(group.runs[0], "steps")
    if df.empty or "context_tokens" not in df:
        return np.empty(0), np.empty(0)
    d = df[(df["kind"] == "decode") & (df["end"] > df["start"])]
    if len(d) > MAX_STEP_POINTS:
        d = d.iloc[np.linspace(0, len(d) - 1, MAX_STEP_POINTS).astype(int)]
    return d["context_tokens"].to_numpy() / 1e3, (d["end"] - d["start"]).to_numpy() * 1e3


def decode_step_plot(groups: list[Group]) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    plotted = False
    for g in groups:
        x, y = decode_step_points(g)
        if x.size:
            ax.scatter(x, y, s=4, alpha=0.4, label=g.label)
            plotted = True
    if not plotted:
        plt.close(fig)
        return ""
    ax.set_xlabel("context tokens read by the step (thousands, summed over its sequences)")
    ax.set_ylabel("decode step (ms)")
    ax.set_title("decode steps: time against the K/V they read (first run of each variant)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small", markerscale=3)
    ax.grid(alpha=0.3)
    return _png(fig)


def decode_batch_plot(groups: list[Group]) -> str:
    """Mean decode step per bin of batch size, a bar per configuration (summary.json's decode_batches:
    kept results have it too); the first sweep point of each."""
    plt = _pyplot()
    series = {}
    for g in groups:
        bins = pooled_bins(next(iter(g.points.values()), []))
        if bins:
            series[g.label] = {lo: b for lo, b in bins.items() if b["steps"]}
    edges = sorted({lo for bins in series.values() for lo in bins})
    if not edges:
        return ""
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(edges) * max(1, len(series)) ** 0.5), 4))
    width = 0.8 / len(series)
    for k, (label, bins) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i, lo in enumerate(edges) if lo in bins]
        ys = [bins[lo]["time"] / bins[lo]["steps"] * 1e3 for lo in edges if lo in bins]
        ax.bar(xs, ys, width=width, label=label)
    last = {lo: b["max"] for bins in series.values() for lo, b in bins.items()}
    ax.set_xticks(range(len(edges)), [bin_label(lo, last[lo]) for lo in edges], fontsize="small")
    ax.set_xlabel("sequences in the decode step")
    ax.set_ylabel("mean decode step (ms)")
    ax.set_title("decode steps by batch size")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


PLOTS = (  # each with the name a note gives it when it cannot be drawn
    ("latency against the rate served", rate_curves),
    ("latency CDFs", latency_cdfs),
    ("output throughput per variant", throughput_bars),
    ("telemetry", telemetry_plot),
    ("decode steps against the K/V they read", decode_step_plot),
    ("decode steps by batch size", decode_batch_plot),
    ("profile", profile_bars),
)


def _close_figures() -> None:
    import matplotlib.pyplot as plt

    plt.close("all")


def render_html(
    sections: list[tuple[str, list[View], list[Group]]], problems: list[str], doubts: list[str] = ()
) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>llmbench report</title><style>{_CSS}</style></head><body>"
    ]
    parts.append(
        f"<h1>llmbench report</h1><p>generated {html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))}</p>"
    )
    if problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in problems)
        parts.append(f"<div class='problems'><p>Skipped:</p><ul>{items}</ul></div>")
    if doubts:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in doubts)
        parts.append(f"<div class='problems'><p>Read in part:</p><ul>{items}</ul></div>")
    if len(sections) > 1:  # a contents list: one link per scenario
        links = "".join(f"<li><a href='#s{i}'>{html.escape(s[0])}</a></li>" for i, s in enumerate(sections))
        parts.append(f"<nav><p>Scenarios:</p><ul>{links}</ul></nav>")
    for i, (scenario, views, groups) in enumerate(sections):
        parts.append(f"<h2 id='s{i}'>{html.escape(scenario)}</h2>")
        parts += [view_html(v) for v in views]
        notes = []
        for name, plot in PLOTS:
            try:
                drawn = plot(groups)
            except Exception as exc:  # one odd figure costs its plot, never the report
                _close_figures()
                notes.append(f"{name}: not drawn ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
                continue
            if drawn:
                parts.append(f"<p>{drawn}</p>")
        notes += [f"{path}: {damage(path, why)}" for g in groups for path, why in g.damaged.items()]
        if notes:
            items = "".join(f"<li>{html.escape(n)}</li>" for n in dict.fromkeys(notes))
            parts.append(f"<ul class='problems'>{items}</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
