"""One run from its repeats' parts: a run whose repeats each ran in a process of their own
(``repeat_processes.py``) is written as one run folder, as a run whose repeats shared a process is.

Each part is a one-repeat run folder. Its times count from its own process's origin; merged, they count from
the first part's, each part's shifted by the wall-clock time between the two processes' starts, so that the
requests, steps and telemetry of every repeat share one time axis. A point's estimates are computed again
over all its repeats (``summary.point_summary``), a repeat that an interrupt or a failure stopped left out
where whole ones exist, as a run in one process does. Warnings said by several parts are kept once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from llmbench.bench.errors import StoreError
from llmbench.bench.slow_steps import SLOW_COLUMNS, SLOW_FACTOR, SLOW_LINE, causes_warning
from llmbench.bench.store import OWN_PROCESS, TABLES, load_run
from llmbench.bench.summary import point_summary, whole_repeats

# the tables' columns that hold times since the run's origin (``tables.py``), shifted when parts merge
TIME_COLUMNS = {
    "requests": ("arrival", "submitted", "first_scheduled", "first_token", "last_token"),
    "steps": ("start", "end"),
    "telemetry": ("time",),
}


class Part(NamedTuple):
    """One repeat's run folder as its process wrote it."""

    path: Path
    meta: dict[str, Any]
    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame]


def read_part(path: Path) -> Part | None:
    """The part a repeat's process wrote at ``path``; None when it wrote none (it stopped before it
    measured). A part that cannot be read is a StoreError."""
    if not (Path(path) / "summary.json").exists():
        return None
    run = load_run(path)
    return Part(Path(path), run.meta, run.summary, {name: run.table(name) for name in TABLES})


def _offset(part: Part, first: Part) -> float:
    """Seconds from the first part's origin to ``part``'s (0 when either start is unknown)."""
    a, b = first.meta.get("started_unix"), part.meta.get("started_unix")
    return float(b) - float(a) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else 0.0


def _shifted(df: pd.DataFrame, name: str, by: float) -> pd.DataFrame:
    if df.empty or not by:
        return df
    df = df.copy()
    for col in TIME_COLUMNS[name]:
        if col in df.columns:
            df[col] = df[col] + by
    if name == "requests" and "token_times" in df.columns:
        df["token_times"] = [[t + by for t in times] for times in df["token_times"]]
    return df


def _points(parts: list[Part], offsets: list[float]) -> list[dict[str, Any]]:
    points: dict[str, dict[str, Any]] = {}
    for part, by in zip(parts, offsets, strict=True):
        for p in part.summary.get("points") or []:
            entry = points.setdefault(p["label"], {**p, "repeats": [], "metrics": {}})
            for rep in p.get("repeats") or []:
                window = rep.get("window")
                if isinstance(window, list):
                    rep = {**rep, "window": [None if w is None else w + by for w in window]}
                if "capacity" in (
                    p.get("arrival") or {}
                ):  # a sweep's rate, measured in this repeat's process
                    rep = {**rep, "arrival": p["arrival"]}
                entry["repeats"].append(rep)
    for entry in points.values():
        entry["repeats"].sort(key=lambda e: e.get("repeat", 0))
        untraced = [e for e in entry["repeats"] if not e.get("traced")]
        entry["metrics"] = point_summary([e.get("metrics") or {} for e in whole_repeats(untraced)])
        own = [e["arrival"] for e in entry["repeats"] if "arrival" in e]
        if own:  # the point's rate and capacity: the mean of its repeats' (each measured its own)
            mean = {k: sum(a[k] for a in own) / len(own) for k in ("rate", "capacity")}
            entry["arrival"] = {**entry["arrival"], **mean}
    return list(points.values())


def _steps(parts: list[Part], offsets: list[float]) -> pd.DataFrame:
    """The parts' steps on one clock, numbered on from one part to the next (each process counts its
    engine's steps from its start, as one process counts them through all its repeats)."""
    frames: list[pd.DataFrame] = []
    after: int | None = None  # the step number the next part's first step takes (the first part's: its own)
    for part, by in zip(parts, offsets, strict=True):
        df = _shifted(part.tables["steps"], "steps", by)
        if "step" in df.columns and len(df):
            df = df.copy()
            if after is not None:
                df["step"] = df["step"] - df["step"].min() + after
            after = int(df["step"].max()) + 1
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def _warnings(parts: list[Part], steps: pd.DataFrame, slow_factor: float) -> list[str]:
    """The parts' warnings, each once; their slow-step lines (one a part) as one line over the run."""
    said = [w for p in parts for w in p.summary.get("warnings") or [] if not SLOW_LINE.match(w)]
    if "slow" in steps.columns and len(steps):
        slow = steps[steps["slow"].astype(bool)]
        line = causes_warning([str(c).split(", ") for c in slow["slow_causes"]], slow_factor)
        if line:
            said.append(f"{line} ({SLOW_COLUMNS})")
    return list(dict.fromkeys(said))


def merge_parts(
    parts: list[Part],
    stop_reason: str | None,
    error: str | None,
    own: dict[str, Any],
    slow_factor: float = SLOW_FACTOR,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, pd.DataFrame]]:
    """meta.json, summary.json and the tables of the run whose repeats are ``parts`` (at least one, in
    the order they ran); complete when ``stop_reason`` is None. ``own``: what the run's own process says of
    itself in meta.json (its command line, its process id, the scenario as the user named it), in place of
    the first part's."""
    if not parts:
        raise StoreError("no repeat was measured: there is no run to write")
    first = parts[0]
    offsets = [_offset(p, first) for p in parts]
    status = "complete" if stop_reason is None else "incomplete"
    steps = _steps(parts, offsets)
    warnings = _warnings(parts, steps, slow_factor)
    unavailable = {k: v for p in parts for k, v in (p.summary.get("unavailable") or {}).items()}
    summary = {
        **first.summary,
        "status": status,
        "stop_reason": stop_reason,
        "points": _points(parts, offsets),
        "warnings": warnings,
        "unavailable": unavailable,
        "repeat_processes": OWN_PROCESS,
    }
    meta = {
        **first.meta,
        **own,
        "repeat_index": None,
        "status": status,
        "stop_reason": stop_reason,
        "error": error,
        "unavailable": unavailable,
        "points": [p["arrival"] for p in summary["points"]],  # with a sweep's rates, their mean
        "finished_at": parts[-1].meta.get("finished_at"),
        "repeat_processes": [
            {
                "repeat": part.meta.get("repeat_index"),
                "pid": part.meta.get("pid"),
                "started_at": part.meta.get("started_at"),
                "startup": part.meta.get("startup"),
            }
            for part in parts
        ],
    }
    tables = {
        name: pd.concat(
            [_shifted(p.tables[name], name, by) for p, by in zip(parts, offsets, strict=True)],
            ignore_index=True,
        )
        for name in TABLES
        if name != "steps"
    }
    tables["steps"] = steps
    return meta, summary, tables
