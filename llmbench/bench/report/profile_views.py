"""Profile summaries in a report, next to the run metrics: for every group whose run was recorded by
``llmbench profile`` (its ``profile.json`` sits beside the run folder), the views ``llmbench profile``
printed for it (bench/profile/caveats.py ``variant_views``: a stored profile reads the same either way),
and the comparison with the baseline's profile (``comparison_view``); in the HTML report, stacked bars of
the breakdown per variant (traced time), each marked with its untraced median step.

A profile.json made before it said whether its variant ran torch.compile and CUDA graphs (what the views
need to know of it) is told by its run's resolved engine config.
"""

from __future__ import annotations

from typing import Any

from llmbench.bench.profile.caveats import NOTHING_BESIDE, Beside, comparison_view, read_beside, variant_views
from llmbench.bench.profile.diff import diff_rows
from llmbench.bench.profile.views import profile_views
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
            engine = run.meta.get("engine_config")
            engine = engine if isinstance(engine, dict) else {}
            for key in ("torch_compile", "cuda_graph"):  # where the profile.json does not say
                if data.get(key) is None:
                    data[key] = engine.get(key)
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
        _ = (
            c["idle"]
            + sum(c["device"].get(seg, 0.0) for seg in CATEGORIES)
            + (c.get("untraced_median") or 0.0)
        )


def _beside(group: Group) -> Beside:
    """What the run folder beside the group's profile says of it (its warnings, why it stopped)."""
    for run in group.runs:
        if (run.path.parent / PROFILE_FILE).is_file():
            return read_beside(run.path)
    return NOTHING_BESIDE


def profile_section(groups: list[Group], baseline: Group | None) -> list[View]:
    profiles = {id(g): p for g in groups if (p := group_profile(g)) is not None}
    sides = {id(g): _beside(g) for g in groups if id(g) in profiles}
    # as ``llmbench profile`` prints them: each variant's views, then the comparisons
    views = [
        v for g in groups if id(g) in profiles for v in variant_views(profiles[id(g)], sides[id(g)], g.label)
    ]
    base = profiles.get(id(baseline)) if baseline is not None else None
    if base is not None:
        for g in groups:
            if g is not baseline and id(g) in profiles:
                try:
                    view = comparison_view(
                        baseline.label, g.label, base, profiles[id(g)], (sides[id(baseline)], sides[id(g)])
                    )
                except _MALFORMED:  # each is sound alone, and they differ in shape: no diff
                    continue
                if view is not None:
                    views.append(view)
    return views


def untraced_marks(profiles: list[dict[str, Any]], kind: str) -> list[float | None]:
    """The untraced median step of each profile with steps of ``kind``, ms (None: it has none)."""
    out = []
    for p in profiles:
        if kind in p["kinds"]:
            median = p["kinds"][kind].get("untraced_median")
            out.append(median * 1e3 if median else None)
    return out


def _bars_caption(profiles: list[dict[str, Any]], kinds: list[str]) -> str:
    """What the bars and ticks are, and which bars have no tick."""
    caption = "Bars: traced time per step (the profiler slows the host, each variant by its own factor)."
    marks = {k: untraced_marks(profiles, k) for k in kinds}
    if any(m is not None for ms in marks.values() for m in ms):
        caption += " Black tick: the variant's untraced median step, what variants compare by."
    missing = [f"{k} ({ms.count(None)} of {len(ms)} bars)" for k, ms in marks.items() if None in ms]
    if missing:
        caption += (
            f" No untraced median for {', '.join(missing)}: the untraced repeat held too few such steps, or "
            "the profile recorded none."
        )
    return caption


def profile_bars(groups: list[Group]) -> str:
    """Stacked bars, one per variant and kind of step: ms per step by category, then idle time (traced);
    a tick at each bar's untraced median step; a caption says which is which."""
    import html

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
        marks = untraced_marks([p for _, p in profiles], kind)
        at = [i for i, m in enumerate(marks) if m is not None]
        if at:
            ys = [marks[i] for i in at]  # a tick a little wider than its bar (0.8)
            ax.hlines(ys, [i - 0.45 for i in at], [i + 0.45 for i in at], colors="black", linewidths=2.5,
                      zorder=3, label="untraced median step")  # fmt: skip
        ax.set_xticks(range(len(present)), [label for label, _ in present], fontsize="small")
        ax.set_ylabel("ms per step")
        ax.set_title(f"{kind} steps: where the time goes")
        ax.grid(axis="y", alpha=0.3)
    shown = {}  # every axis's entries, once: a kind may lack a category or the tick
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            shown.setdefault(label, handle)
    axes[0][-1].legend(
        shown.values(), shown.keys(), fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0)
    )
    caption = _bars_caption([p for _, p in profiles], kinds)
    return f"{_png(fig)}<br><span class='notes'>{html.escape(caption)}</span>"
