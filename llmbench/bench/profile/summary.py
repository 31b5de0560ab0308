"""A variant's ``profile.json``: its traces read (trace.py) and paired with the engine's step statistics.

Per step (rank 0): the breakdown, with the step's kind, size and the engine's own step time. Per kind:
the mean per step over the window's steps that were not slow, and the median engine step time of those
traced steps and of the untraced steps of the reference repeat (window.py), with a note when tracing
slowed a kind by ``TRACING_NOTE`` or more, and the median time the host waited on the device in those
untraced steps (``device_wait``: near the step time when the device bounds a kind, near 0 when the host
does; the profiler's own cost on the host makes the traced steps' idle time no guide to that). Per rank:
the mean per step over all its window steps (ranks > 0 serve rank 0's steps one for one, and have no
range for a call that ran none). The top kernels (or, on a CPU, ops) of rank 0's window, over the steps the
means are over (its slow steps left out alike), with achieved FLOP/s and bytes/s against the device's
peaks, where known: over the calls whose cost is known, in their own time (``rated_calls`` of ``count``:
a call replayed from a CUDA graph records no shapes, and so no cost). Slow steps recorded around
(``--slow-steps``) are listed with their causes and breakdown.

All times are seconds; a step's breakdown adds up to its wall time (trace.py).

Every trace read is written back with its step ranges named after the steps they hold (trace.py
``name_steps``: ``llmbench.step 42 (decode)``), so that a step of the profile's tables can be found in
Perfetto or chrome://tracing by its number.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from llmbench.bench.peaks import PeakUsed
from llmbench.bench.profile.trace import (
    KernelStat,
    StepBreakdown,
    TraceBreakdown,
    analyse,
    name_steps,
    step_name,
)
from llmbench.bench.slow_steps import MIN_STEPS_OF_KIND

TOP_KERNELS = 15
KINDS = ("prefill", "decode", "mixed")
TRACING_NOTE = 1.2  # traced / untraced median engine step time from which the summary says so


def read_trace(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def write_trace(path: Path, trace: dict[str, Any]) -> None:
    """Replace a trace file: written beside, then renamed, so that a reader never sees half a file."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    # zlib's default level: the highest (torch's) takes about twice as long for a few percent less
    with gzip.open(part, "wt", compresslevel=6) as f:
        json.dump(trace, f)
    os.replace(part, path)


def rank_files(folder: Path, template: str) -> dict[int, Path]:
    """The files of one chunk, by rank."""
    pattern = re.compile(re.escape(template).replace(re.escape("{rank}"), r"(\d+)") + "$")
    found = {}
    for p in folder.iterdir():
        m = pattern.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def _step_row(call: dict[str, Any], b: StepBreakdown) -> dict[str, Any]:
    return {
        **call,
        "wall": b.wall,
        "device": b.device,
        "idle": b.idle,
        "waited_for": b.waited_for,
        "phases": b.phases,
        "overlap": b.overlap,
        "launches": b.launches,
    }


def _mean_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean per step of every figure of a breakdown (a category missing from a step counts 0 there)."""
    n = len(rows)
    out: dict[str, Any] = {"steps": n}
    for key in ("wall", "idle", "overlap", "launches", "engine_time", "call_time"):
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = sum(values) / len(values) if values else None
    for key in ("device", "waited_for", "phases"):
        total: dict[str, float] = defaultdict(float)
        for r in rows:
            for name, v in r[key].items():
                total[name] += v
        out[key] = {name: v / n for name, v in sorted(total.items(), key=lambda kv: -kv[1])}
    out["busy"] = sum(out["device"].values())
    return out


def _untraced_medians(
    durations: list[float], waits: list[float], slow_factor: float
) -> tuple[float | None, float | None]:
    """The medians of the reference repeat's step times and of the host's waits in them (None for a
    profile that recorded none), its slow steps left out as the window's are."""
    if len(durations) < MIN_STEPS_OF_KIND:
        return None, None
    median = statistics.median(durations)
    kept = [i for i, d in enumerate(durations) if d <= slow_factor * median]
    wait = statistics.median(waits[i] for i in kept) if len(waits) == len(durations) else None
    return statistics.median(durations[i] for i in kept), wait


def _kernels(stats: list[KernelStat], peak: PeakUsed | None) -> list[dict[str, Any]]:
    merged: dict[tuple[str, str], list[float]] = {}
    for k in stats:
        row = merged.setdefault((k.name, k.category), [0, 0.0, 0.0, 0.0, 0, 0.0])
        for i, v in enumerate((k.count, k.total, k.flops, k.bytes, k.rated, k.rated_total)):
            row[i] += v
    out = []
    for (name, category), (count, total, flops, nbytes, rated, rated_total) in merged.items():
        # over the rated calls' own time: the others' cost is unknown, not nothing
        flop_rate = flops / rated_total if flops and rated_total > 0 else None
        byte_rate = nbytes / rated_total if nbytes and rated_total > 0 else None
        out.append(
            {
                "name": name,
                "category": category,
                "count": int(count),
                "total": total,
                "mean": total / count if count else None,
                "rated_calls": int(rated),
                "flops_per_s": flop_rate,
                "bytes_per_s": byte_rate,
                "flops_peak_frac": flop_rate / peak.matmul_flops if flop_rate and peak else None,
                "bandwidth_peak_frac": byte_rate / peak.mem_bandwidth if byte_rate and peak else None,
            }
        )
    out.sort(key=lambda r: -r["total"])
    return out[:TOP_KERNELS]


def summarise(
    folder: Path,
    record: dict[str, Any],
    variant: str,
    device: str,
    peak: PeakUsed | None,
    peak_source: str | None,
    status: str,
    torch_compile: bool | None = None,
) -> dict[str, Any]:
    """Read every trace the window wrote into ``folder`` and build the variant's profile summary
    (``torch_compile``: whether the variant ran it, which the views of a comparison need)."""
    calls = record["calls"]
    rows: list[dict[str, Any]] = []
    per_rank: dict[int, list[StepBreakdown]] = defaultdict(list)
    kernels: list[KernelStat] = []
    mode = "cuda" if device.startswith("cuda") else "cpu"
    notes: list[str] = []
    traces: list[str] = []
    for chunk in record["chunks"]:
        files = rank_files(folder, chunk["file"])
        if 0 not in files:
            notes.append(f"{chunk['file'].format(rank=0)} is missing: its steps are left out")
            continue
        members = [calls[i] for i in chunk["calls"]]
        for rank, path in files.items():
            traces.append(path.name)
            # a rank > 0 has a range for each step rank 0 sent it, none for a call that ran no step
            served = members if rank == 0 else [c for c in members if c["kind"] != "idle"]
            trace = read_trace(path)
            breakdown: TraceBreakdown = analyse(trace)
            if name_steps(trace, [step_name(c["step"], c["kind"]) for c in served]):
                write_trace(path, trace)
            if mode == "cuda" and breakdown.mode == "cpu" and breakdown.steps:
                notes.append(
                    f"{path.name} holds no GPU activity (CUPTI unavailable, or taken by another tool): "
                    "its breakdown is over CPU ops"
                )
            mode = breakdown.mode
            if len(breakdown.steps) < len(served):
                notes.append(f"{path.name}: {len(breakdown.steps)} step ranges for {len(served)} steps")
            pairs = list(zip(served, breakdown.steps, strict=False))
            per_rank[rank] += [b for c, b in pairs if c["window"]]
            if rank == 0:
                rows += [_step_row(c, b) for c, b in pairs]
                # the calls of the steps the means are over (and of no step, in a chunk that holds some)
                kept = {i for i, c in enumerate(members) if c["window"] and not c["slow"]}
                kernels += [k for k in breakdown.kernels if k.step in kept or (k.step is None and kept)]
    steady = [r for r in rows if r["window"] and not r["slow"]]
    kinds = {}
    for kind in KINDS:
        members = [r for r in steady if r["kind"] == kind]
        slow = sum(r["window"] and r["slow"] and r["kind"] == kind for r in rows)
        if slow:
            notes.append(
                f"{kind}: {slow} of the window's {slow + len(members)} steps were slow (over "
                f"{record['slow_factor']:g}x their kind's running median) and are left out of its means"
                + ("" if members else ": none is left to show")
            )
        if members:
            kinds[kind] = _mean_rows(members)
            traced = statistics.median(r["engine_time"] for r in members)
            untraced, waited = _untraced_medians(
                record.get("reference", {}).get(kind, []),
                record.get("reference_waits", {}).get(kind, []),
                record["slow_factor"],
            )
            kinds[kind].update(traced_median=traced, untraced_median=untraced, untraced_wait=waited)
            if untraced and traced >= TRACING_NOTE * untraced:
                notes.append(
                    f"{kind} steps ran {traced / untraced:.2f}x slower traced than untraced (median engine "
                    f"step time {traced * 1e3:.3g} ms against {untraced * 1e3:.3g} ms in the untraced "
                    "reference repeat): the profiler's cost falls on the host, so the host's share of these "
                    "steps reads high"
                )
    n = record["steps_per_kind"]
    for kind, count in record.get("window_counts", {}).items():
        if count < n:
            notes.append(f"{kind}: {count} step(s) of the {n} asked for; the window held no more of them")
    ranks = []
    for rank, steps in sorted(per_rank.items()):
        as_rows = [
            {"wall": s.wall, "idle": s.idle, "overlap": s.overlap, "launches": s.launches, "device": s.device,
             "waited_for": s.waited_for, "phases": s.phases}
            for s in steps
        ]  # fmt: skip
        if as_rows:
            ranks.append({"rank": rank, **_mean_rows(as_rows)})
    return {
        "variant": variant,
        "status": status,
        "device": device,
        "mode": mode,
        "torch_compile": torch_compile,
        "steps_per_kind": n,
        "slow_steps_recorded": record["slow_steps"],
        "slow_factor": record["slow_factor"],
        "peak": None if peak is None else {**peak._asdict(), "datasheet": None, "source": peak_source},
        "traces": traces,
        "kinds": kinds,
        "ranks": ranks,
        "kernels": _kernels(kernels, peak),
        "kernels_leave_out_slow": True,  # the top kernels are of the steady steps (profiles before: all)
        "slow_steps": [r for r in rows if r["slow"]],
        "steps": rows,
        "notes": notes,
    }


def device_peak(device: str) -> tuple[PeakUsed | None, str | None]:
    """The peaks FLOP/s and bytes/s are compared with, and where they come from: this device's
    calibration (``llmbench calibrate``) when there is one, else the datasheet (bench/peaks.py)."""
    from llmbench.bench.peaks import choose_peak

    peak = choose_peak(device).peak
    return (peak, peak.source) if peak is not None else (None, None)


def write_profile(
    folder: Path,
    record: dict[str, Any],
    variant: str,
    device: str,
    status: str,
    torch_compile: bool | None = None,
) -> Path:
    """``folder/profile.json`` for one variant (what ``llmbench profile``'s child process writes)."""
    from llmbench.bench.store import write_json

    peak, source = device_peak(device)
    path = Path(folder) / "profile.json"
    write_json(path, summarise(Path(folder), record, variant, device, peak, source, status, torch_compile))
    return path
