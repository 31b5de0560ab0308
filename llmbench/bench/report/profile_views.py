"""Profile summaries in a report, next to the run metrics: for every group whose run was recorded by
``llmbench profile`` (its ``profile.json`` sits beside the run folder), the views ``llmbench profile``
printed for it (bench/profile/views.py ``profile_views``: a stored profile reads the same either way), and
the comparison with the baseline's profile; in the HTML report, stacked bars of the breakdown per variant.
"""

from __future__ import annotations

from typing import Any

from llmbench.bench.profile.diff import diff_rows
from llmbench.bench.profile.views import diff_view, profile_views
from llmbench.bench.report.frame import Group
from llmbench.bench.report.kept import read_object
from llmbench.bench.report.views import View
from llmbench.engine.kernel_roles import CATEGORIES

PROFILE_FILE = "profile.json"
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError)  # a record of the wrong shape


def group_profile(group: Group) -> dict[str, Any] | None:
    """The profile.json written beside this group's run folder, if one was (and its views can be made)."""
    for run in group.runs:
        data, _ = read_object(run.path.parent / PROFILE_FILE)
        if data is not None and data.get("variant") == group.variant and "kinds" in data:
            return data if profile_problem(data) is None else None
    return None


def profile_problem(data: dict[str, Any]) -> str | None:
    """Why a profile record cannot be shown (a field missing or of the wrong type), or None."""
    try:
        profile_views(data)
        diff_rows(data, data)
        profile_bars_data(data)
    except _MALFORMED as exc:
        return f"a field is missing or of the wrong type ({type(exc).__name__}: {exc})"
    return None


def profile_bars_data(data: dict[str, Any]) -> None:
    """What ``profile_bars`` reads of a record, read once (it raises where the record is malformed)."""
    for c in data["kinds"].values():
        _ = c["idle"] + sum(c["device"].get(seg, 0.0) for seg in CATEGORIES)


def profile_section(groups: list[Group], baseline: Group | None) -> list[View]:
    profiles = {id(g): p for g in groups if (p := group_profile(g)) is not None}
    # as ``llmbench profile`` prints them: each variant's views, then the comparisons
    views = [v for g in groups if id(g) in profiles for v in profile_views(profiles[id(g)])]
    base = profiles.get(id(baseline)) if baseline is not None else None
    if base is not None:
        for g in groups:
            if g is not baseline and id(g) in profiles:
                try:
                    rows = diff_rows(base, profiles[id(g)])
                except _MALFORMED:  # each is sound alone, and they differ in shape: no diff
                    continue
                views.append(diff_view(baseline.label, g.label, rows))
    return views


def profile_bars(groups: list[Group]) -> str:
    """Stacked bars, one per variant and kind of step: ms per step by category, then idle time."""
    from llmbench.bench.report.html import _png, _pyplot

    profiles = [(g.label, p) for g in groups if (p := group_profile(g)) is not None and p.get("kinds")]
    if not profiles:
        return ""
    kinds = [k for k in ("prefill", "decode", "mixed") if any(k in p["kinds"] for _, p in profiles)]
    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(kinds), figsize=(max(6, 2.2 * len(profiles)) * len(kinds), 4.5), squeeze=False
    )
    idle_label = "GPU idle" if profiles[0][1].get("mode") == "cuda" else "outside ops (CPU)"
    segments = [*CATEGORIES, idle_label]
    colours = dict(zip(segments, plt.get_cmap("tab10").colors, strict=False))
    for ax, kind in zip(axes[0], kinds, strict=True):
        present = [(label, p["kinds"][kind]) for label, p in profiles if kind in p["kinds"]]
        bottom = [0.0] * len(present)
        for seg in segments:
            values = [
                1e3 * (c["idle"] if seg == idle_label else c["device"].get(seg, 0.0)) for _, c in present
            ]
            if any(values):
                ax.bar(range(len(present)), values, bottom=bottom, label=seg, color=colours[seg])
                bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xticks(range(len(present)), [label for label, _ in present], fontsize="small")
        ax.set_ylabel("ms per step")
        ax.set_title(f"{kind} steps: where the time goes")
        ax.grid(axis="y", alpha=0.3)
    axes[0][-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)
