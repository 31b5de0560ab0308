"""The comparison of two variants' profiles: per kind of step, each figure's mean per step side by side.

Rows: the median step of the untraced reference repeat (the change between the variants: tracing slows
each by its own factor), then the traced steps' wall time, the device busy time and each category in it,
the device idle time and the host phases the device waited for (on a CPU: time in ops, and outside them by
phase), the launches per step: where the traced time went. A figure one side lacks counts 0 there (a
category with no kernel), except the step times, which both sides have. Each row carries ``n``, the steps
it is over on each side: the untraced steps of the median (None where the profile did not count them), or
the window's traced steps. A kind that only one side has makes no rows (``one_sided`` names it).
"""

from __future__ import annotations

from typing import Any

from llmbench.engine.kernel_roles import CATEGORIES

UNTRACED = "step untraced (median)"
TRACED = "step traced (wall)"


def _row(
    kind: str, figure: str, base: float | None, new: float | None, n: list[int | None], unit: str = "s"
) -> dict[str, Any]:
    change = (new - base) / base if base and new is not None else None
    return {"kind": kind, "figure": figure, "unit": unit, "baseline": base, "variant": new, "change": change,
            "n": n}  # fmt: skip


def one_sided(base: dict[str, Any], other: dict[str, Any]) -> list[tuple[str, bool, int]]:
    """The kinds of step only one side's window holds: (kind, whether it is the baseline's, its steps)."""
    b, o = base.get("kinds", {}), other.get("kinds", {})
    return [(k, True, b[k]["steps"]) for k in b if k not in o] + [
        (k, False, o[k]["steps"]) for k in o if k not in b
    ]


def diff_rows(base: dict[str, Any], other: dict[str, Any]) -> list[dict[str, Any]]:
    gpu = base.get("mode") == "cuda"
    busy, idle, waiting = (
        ("GPU busy", "GPU idle", "waiting for ") if gpu else ("in ops (CPU)", "outside ops", "")
    )
    rows = []
    for kind, b in base.get("kinds", {}).items():
        o = other.get("kinds", {}).get(kind)
        if o is None:
            continue  # one_sided
        if b.get("untraced_median") and o.get("untraced_median"):
            untraced = [b.get("untraced_steps"), o.get("untraced_steps")]
            rows.append(_row(kind, UNTRACED, b["untraced_median"], o["untraced_median"], untraced))
        n = [b.get("steps"), o.get("steps")]  # the window's steps, what every traced row is a mean over
        rows.append(_row(kind, TRACED, b["wall"], o["wall"], n))
        rows.append(_row(kind, busy, b["busy"], o["busy"], n))
        for cat in CATEGORIES:
            x, y = b["device"].get(cat, 0.0), o["device"].get(cat, 0.0)
            if x or y:
                rows.append(_row(kind, f"  {cat}", x, y, n))
        rows.append(_row(kind, idle, b["idle"], o["idle"], n))
        waits = sorted(  # the largest on either side first: what the variant added counts as much
            set(b["waited_for"]) | set(o["waited_for"]),
            key=lambda k: -max(b["waited_for"].get(k, 0.0), o["waited_for"].get(k, 0.0)),
        )
        for name in waits:
            x, y = b["waited_for"].get(name, 0.0), o["waited_for"].get(name, 0.0)
            rows.append(_row(kind, f"  {waiting}{name}", x, y, n))
        if b.get("launches") or o.get("launches"):
            rows.append(_row(kind, "launches", b.get("launches"), o.get("launches"), n, unit="count"))
    return rows
