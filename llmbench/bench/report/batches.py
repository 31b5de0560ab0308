"""Decode steps by batch size (``summary.json``'s ``decode_batches``, per repeat) as a report view.

A run drains through every batch size between its largest and one, and a variant's gain is seldom the
same at all of them: a float8 cache halves the K/V reads that dominate a wide batch's step and leaves the
fixed part that dominates a narrow one. One row per (bin of sequences, configuration): steps per repeat,
the bin's share of the configuration's decode time, the mean step, the host's own part of it (the step less
its wait on the device), how much of the bin's time the host waited on the device (near 0: the host sets
the pace there), and the mean step against the baseline's in the same bin. Means pool the repeats' steps;
no interval: the view says where the time goes, the overview and deltas say whether a change is real.
"""

from __future__ import annotations

from typing import Any

from llmbench.bench.report.format import DASH
from llmbench.bench.report.frame import Group
from llmbench.bench.report.views import View

KEY = "decode_batches"
HEADERS = [
    "sequences", "configuration", "steps per repeat", "share of decode time", "step (ms)", "host (ms)",
    "host waiting on the device", "step against the baseline",
]  # fmt: skip


def pooled_bins(entries: list[dict[str, Any]]) -> dict[int, dict[str, Any]] | None:
    """A point's repeats' bins summed, by lower edge; None when no repeat recorded them."""
    recorded = [e[KEY] for e in entries if isinstance(e.get(KEY), list)]
    if not recorded:
        return None
    out: dict[int, dict[str, Any]] = {}
    for bins in recorded:
        for b in bins:
            acc = out.setdefault(b["min"], {"max": b["max"], "steps": 0, "time": 0.0, "device_wait": 0.0})
            acc["steps"] += b["steps"]
            acc["time"] += b["time"]
            acc["device_wait"] += b["device_wait"]
    for acc in out.values():
        acc["repeats"] = len(recorded)
    return out


def bin_label(lo: int, hi: int | None) -> str:
    return str(lo) if hi == lo else f"{lo}-{hi}" if hi is not None else f"{lo}+"


def batch_views(scenario: str, groups: list[Group], baseline: Group | None) -> list[View]:
    views = []
    for point in dict.fromkeys(p for g in groups for p in g.points):
        pooled = {g.label: pooled_bins(g.points.get(point, [])) for g in groups if point in g.points}
        title = f"{scenario} · {point}: decode steps by batch size (means over the repeats' steps)"
        if all(v is None for v in pooled.values()):
            row = ["–", "not recorded: these runs predate the record of decode steps by batch size"]
            views.append(View(title, HEADERS, [row + [""] * (len(HEADERS) - 2)], [False] * len(HEADERS)))
            continue
        base = pooled.get(baseline.label) if baseline is not None else None
        totals = {label: sum(x["time"] for x in (bins or {}).values()) for label, bins in pooled.items()}
        rows = []
        for lo in sorted({lo for bins in pooled.values() if bins for lo in bins}):
            for label, bins in pooled.items():
                b = (bins or {}).get(lo)
                if b is None or not b["steps"]:
                    continue
                total = totals[label]
                step = b["time"] / b["steps"]
                against = DASH
                ref = (base or {}).get(lo)
                if ref is not None and ref["steps"] and label != baseline.label:
                    against = f"{step / (ref['time'] / ref['steps']) - 1:+.1%}"
                rows.append([
                    bin_label(lo, b["max"]), label, f"{b['steps'] / b['repeats']:.0f}",
                    f"{b['time'] / total:.1%}" if total > 0 else DASH, f"{step * 1e3:.3f}",
                    f"{(b['time'] - b['device_wait']) / b['steps'] * 1e3:.3f}",
                    f"{b['device_wait'] / b['time']:.0%}" if b["time"] > 0 else DASH, against,
                ])  # fmt: skip
        if not rows:  # peer backends: no engine steps
            rows = [["–", "no engine decode steps in these runs"] + [""] * (len(HEADERS) - 2)]
        views.append(View(title, HEADERS, rows, [True, False, True, True, True, True, True, True]))
    return views
