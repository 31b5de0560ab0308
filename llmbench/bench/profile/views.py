"""Profile summaries as report views (plain data; the CLI renders them with Rich, the report as Markdown
or HTML): the breakdown per kind of step, the top kernels, one row per rank, the slow steps, and the
comparison of a variant with the baseline. Times are shown in ms per step.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from typing import Any

from llmbench.bench.profile.diff import TRACED, UNTRACED
from llmbench.bench.report.format import format_pct
from llmbench.bench.report.views import View
from llmbench.engine.kernel_roles import CATEGORIES, COPIES, GEMM


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.3f}"


def _words(profile: dict[str, Any]) -> tuple[str, str]:
    """What busy and idle mean: GPU kernels, or on a CPU the framework's ops."""
    return ("GPU busy", "GPU idle") if profile.get("mode") == "cuda" else ("in ops (CPU)", "outside ops")


def breakdown_view(profile: dict[str, Any]) -> View:
    kinds = profile.get("kinds", {})
    busy, idle = _words(profile)
    headers = ["ms per step", *(f"{k} ({v['steps']} steps)" for k, v in kinds.items())]
    columns = list(kinds.values())

    def row(label: str, pick) -> list[str]:
        return [label, *(_ms(pick(c)) for c in columns)]

    rows = [row("step (wall)", lambda c: c["wall"]), row("engine step time", lambda c: c.get("engine_time"))]
    if any(c.get("untraced_median") for c in columns):  # profiles with an untraced reference repeat
        rows.append(row("  median, traced", lambda c: c.get("traced_median")))
        rows.append(row("  median, untraced", lambda c: c.get("untraced_median")))
    # and the host's wait on the device in those steps: a GPU's (on a CPU the device is the host)
    if profile.get("mode") == "cuda" and any(c.get("untraced_wait") is not None for c in columns):
        rows.append(row("    host waiting on the device", lambda c: c.get("untraced_wait")))
    rows.append(row(busy, lambda c: c["busy"]))
    for cat in CATEGORIES:
        if any(c["device"].get(cat) for c in columns):
            rows.append(row(f"  {cat}", lambda c, cat=cat: c["device"].get(cat, 0.0)))
    rows.append(row(idle, lambda c: c["idle"]))
    waits = sorted(
        {w for c in columns for w in c["waited_for"]},
        key=lambda w: -max(c["waited_for"].get(w, 0.0) for c in columns),
    )
    for w in waits:
        rows.append(
            row(
                f"  waiting for {w}" if profile.get("mode") == "cuda" else f"  {w}",
                lambda c, w=w: c["waited_for"].get(w, 0.0),
            )
        )
    if any(c.get("overlap") for c in columns):
        rows.append(row("kernels overlapping", lambda c: c["overlap"]))
    if any(c.get("launches") for c in columns):
        rows.append(["launches", *(f"{c['launches']:.1f}" for c in columns)])
    title = f"{profile['variant']}: where a step's time goes (mean of the window's steady steps, {profile['device']})"
    return View(title, headers, rows, [False, *([True] * len(columns))], tuple(profile.get("notes") or ()))


def _rate_notes(profile: dict[str, Any], cover: bool, hidden: bool) -> list[str]:
    notes = []
    if cover:
        notes.append(
            "TFLOP/s, GB/s and % of peak are over the rated calls alone, those launched by an op whose input "
            "shapes were recorded, in their own time: a call replayed from a CUDA graph records no shapes, "
            "so its cost is unknown (rated calls: how many of a kernel's calls its rates are over; – where none)"
        )
    if hidden:
        why = (
            "its variant replayed CUDA graphs, whose calls record no shapes"
            if profile.get("cuda_graph")
            else "whether its variant replayed CUDA graphs (whose calls record no shapes) is not recorded"
        )
        notes.append(
            "FLOP/s and bandwidth are not shown: this profile was made by an earlier llmbench, which divided "
            f"the FLOPs of the calls with recorded shapes by the time of all calls, and {why}, so its rates "
            "may read low; record the profile again to see them"
        )
    slow = sum(1 for s in profile.get("steps", []) if s.get("window") and s.get("slow"))
    if slow and profile.get("kernels_leave_out_slow"):
        notes.append(f"the window's {slow} slow step(s) are left out, as from the breakdown's means")
    elif slow:
        notes.append(
            f"the window's {slow} slow step(s) are counted here, though the breakdown's means leave them out "
            "(a profile made before they were left out here too)"
        )
    return notes


def kernels_view(profile: dict[str, Any]) -> View:
    peak = profile.get("peak")
    gpu = profile.get("mode") == "cuda"
    what = "kernels" if gpu else "ops (self time)"
    kernels = profile.get("kernels", [])
    # a profile made before kernels carried rated_calls divided the FLOPs of the calls with shapes by the
    # time of all calls: right only where no call was replayed from a CUDA graph
    trusted = all("rated_calls" in k for k in kernels) or profile.get("cuda_graph") is False

    def partial(k: dict[str, Any]) -> bool:  # calls left unrated where a rate could be: say how many are
        rated = k.get("rated_calls")
        return rated is not None and rated < k["count"] and (rated > 0 or (gpu and k["category"] == GEMM))

    cover = any(partial(k) for k in kernels)
    headers = ["name", "category", "count", "total ms", "mean us", "TFLOP/s", "GB/s"]
    if peak:
        headers += [f"% peak FLOP/s ({peak['source']})", f"% peak bandwidth ({peak['source']})"]
    if cover:
        headers.append("rated calls")
    rows = []
    for k in kernels:
        name = k["name"] if len(k["name"]) <= 60 else k["name"][:57] + "..."
        # a copy or fill computes no product (profiles made before gave a memset a share of its GEMM's)
        rated = trusted and k["category"] != COPIES
        row = [
            name, k["category"], str(k["count"]), f"{k['total'] * 1e3:.3f}",
            f"{k['mean'] * 1e6:.1f}" if k["mean"] is not None else "–",
            f"{k['flops_per_s'] / 1e12:.3f}" if rated and k["flops_per_s"] else "–",
            f"{k['bytes_per_s'] / 1e9:.1f}" if rated and k["bytes_per_s"] else "–",
        ]  # fmt: skip
        if peak:
            row += [
                f"{100 * k['flops_peak_frac']:.1f}" if rated and k["flops_peak_frac"] else "–",
                f"{100 * k['bandwidth_peak_frac']:.1f}" if rated and k["bandwidth_peak_frac"] else "–",
            ]
        if cover:
            row.append(f"{k['rated_calls']} of {k['count']}" if partial(k) else "")
        rows.append(row)
    hidden = not trusted and any(k.get("flops_per_s") or k.get("bytes_per_s") for k in kernels)
    return View(
        f"{profile['variant']}: top {what} in the window",
        headers,
        rows,
        [False, False, *([True] * (len(headers) - 2))],
        tuple(_rate_notes(profile, cover, hidden)),
    )


def ranks_view(profile: dict[str, Any]) -> View | None:
    ranks = profile.get("ranks", [])
    if len(ranks) < 2:
        return None
    busy, idle = _words(profile)
    cats = [c for c in CATEGORIES if any(r["device"].get(c) for r in ranks)]
    headers = ["rank", "steps", "step (wall)", busy, *cats, idle]
    rows = [
        [str(r["rank"]), str(r["steps"]), _ms(r["wall"]), _ms(r["busy"]), *(_ms(r["device"].get(c, 0.0)) for c in cats), _ms(r["idle"])]
        for r in ranks
    ]  # fmt: skip
    return View(
        f"{profile['variant']}: each rank, ms per step",
        headers,
        rows,
        [False, *([True] * (len(headers) - 1))],
    )


_CHUNK = re.compile(r"trace-steps(\d+)-\d+-rank")


def slow_causes(profile: dict[str, Any]) -> list[list[str]]:
    """Each slow step's causes, with "trace start" for the first step of a recorded chunk (what the
    profiler's start costs; read from the trace files' step ranges, so profiles written before the
    cause existed show it too)."""
    starts = {int(m.group(1)) for name in profile.get("traces", []) if (m := _CHUNK.search(name))}
    out = []
    for s in profile.get("slow_steps", []):
        causes = [c for c in s["causes"] if c != "unexplained"]
        if profile.get("slow_steps_recorded") and s["step"] in starts and "trace start" not in causes:
            causes.append("trace start")
        out.append(causes or ["unexplained"])
    return out


def slow_summary_view(profile: dict[str, Any]) -> View | None:
    """The slow steps by cause (a step with two causes counts under each): how many, and how slow."""
    slow = profile.get("slow_steps", [])
    if not slow:
        return None
    by_cause: dict[str, list[dict[str, Any]]] = {}
    for s, causes in zip(slow, slow_causes(profile), strict=True):
        for c in causes:
            by_cause.setdefault(c, []).append(s)
    headers = ["cause", "slow steps", "kinds", "engine step ms, median", "x median of kind", "longest ms"]
    rows = [
        [cause, str(len(steps)), ", ".join(sorted({s["kind"] for s in steps})),
         _ms(statistics.median(s["engine_time"] for s in steps)),
         f"{statistics.median(s.get('ratio', 0) for s in steps):.1f}", _ms(max(s["engine_time"] for s in steps))]
        for cause, steps in sorted(by_cause.items(), key=lambda kv: -len(kv[1]))
    ]  # fmt: skip
    title = (
        f"{profile['variant']}: slow steps recorded by cause (>{profile['slow_factor']:g}x the median of "
        "their kind)"
    )
    return View(title, headers, rows, [False, True, False, True, True, True])


def slow_view(profile: dict[str, Any]) -> View | None:
    slow = profile.get("slow_steps", [])
    if not slow:
        return None
    busy, idle = _words(profile)
    headers = ["step", "kind", "tokens", "sequences", "engine step ms", "x median", "traced call ms", busy, idle,
               "causes"]  # fmt: skip
    rows = [
        [str(s["step"]), s["kind"], str(s["prefill_tokens"] + s["decode_tokens"]), str(s["num_seqs"]),
         _ms(s.get("engine_time")), f"{s.get('ratio', 0):.1f}", _ms(s["wall"]), _ms(sum(s["device"].values())),
         _ms(s["idle"]), ", ".join(causes)]
        for s, causes in zip(slow, slow_causes(profile), strict=True)
    ]  # fmt: skip
    title = (
        f"{profile['variant']}: slow steps recorded (>{profile['slow_factor']:g}x the median of their kind)"
    )
    note = (
        "engine step ms: the engine's own step time, what x median divides by its kind's median; traced call "
        f"ms: the traced step() call, which {busy} and {idle} add up to"
    )
    return View(title, headers, rows, [True, False, *([True] * 7), False], (note,))


def _delta(r: dict[str, Any]) -> str:
    """The row's change per step: ms (launches: a count), what it added to the step."""
    if r["baseline"] is None or r["variant"] is None:
        return "–"
    d = r["variant"] - r["baseline"]
    text = f"{d:+.1f}" if r["unit"] == "count" else f"{d * 1e3:+.3f}"
    return text[1:] if float(text) == 0 else text  # no sign on a change that rounds to nothing


def compile_note(base: dict[str, Any], other: dict[str, Any]) -> str | None:
    """What a diff between a compiled variant and an eager one must say (None: both alike, or not known)."""
    a, b = base.get("torch_compile"), other.get("torch_compile")
    if a is None or b is None or a == b:
        return None
    on, off = (other, base) if b else (base, other)
    return (
        f"{on.get('variant', '?')} ran torch.compile and {off.get('variant', '?')} did not: the regions it "
        "compiles lose the layer ranges that put their kernels (ops) in norm, attention and the like, so their "
        'time falls in "other"; the categories are not comparable across the two, the step rows are'
    )


def diff_view(baseline: str, variant: str, rows: list[dict[str, Any]], notes: Sequence[str] = ()) -> View:
    """``notes``: said under the table before its own (compile_note)."""
    headers = ["kind", "ms per step", baseline, variant, "Δ ms", "change", "steps (n)"]
    out = []
    for r in rows:
        fmt = (lambda v: "–" if v is None else f"{v:.1f}") if r["unit"] == "count" else _ms
        change = "–" if r["change"] is None else format_pct(r["change"])
        if r["figure"] != UNTRACED and 1 in (r.get("n") or ()):
            change += " (n=1)"  # one traced step's figure on a side: no typical step
        out.append([r["kind"], r["figure"], fmt(r["baseline"]), fmt(r["variant"]), _delta(r), change, _n(r)])
    disagree = [
        f"{kind}: the untraced steps changed {format_pct(untraced)}, the traced ones {format_pct(traced)}: "
        "tracing slowed the two by different factors, so the rows below the untraced step say where the "
        "traced time went, not by how much the variant changed it"
        for kind, untraced, traced in _disagreements(rows)
    ]
    return View(
        f"{variant} against {baseline}: mean per step",
        headers,
        out,
        [False, False, True, True, True, True, True],
        (*notes, *disagree),
    )


def _n(row: dict[str, Any]) -> str:
    """Beside the two step rows, the steps each side's figure is over (the rows under them share the
    traced one's): the untraced steps of the median, the window's traced steps."""
    if row["figure"] not in (UNTRACED, TRACED):
        return ""
    return " / ".join("–" if x is None else str(x) for x in row.get("n") or (None, None))


DISAGREE = 0.05  # traced and untraced step changes further apart than this (5 points) disagree


def _disagreements(rows: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(kind, untraced change, traced change) where the two are more than DISAGREE apart."""
    changes: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["figure"] in (UNTRACED, TRACED) and r["change"] is not None:
            changes.setdefault(r["kind"], {})[r["figure"]] = r["change"]
    out = []
    for kind, c in changes.items():
        u, t = c.get(UNTRACED), c.get(TRACED)
        if u is not None and t is not None and abs(u - t) > DISAGREE:
            out.append((kind, u, t))
    return out


def profile_views(profile: dict[str, Any]) -> list[View]:
    """Every view of one variant's profile, the breakdown first: what ``llmbench profile`` prints and what
    ``llmbench report`` shows of a stored profile alike (a view added here shows in both)."""
    views = [breakdown_view(profile), kernels_view(profile)]
    views += [
        v for v in (ranks_view(profile), slow_summary_view(profile), slow_view(profile)) if v is not None
    ]
    return views
