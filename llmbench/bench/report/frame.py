"""Runs on disk -> groups of comparable measurements -> one tidy DataFrame.

A *group* is one engine configuration of one scenario measured together: the runs sharing
(scenario, ablation folder, variant); two ablations of one name (a time stamp) are never pooled, and a copy
of an ablation's runs is read once (``copies``). An ablation's variant is one group whose repeats live in
several folders (one process per repeat); a standalone run is a group of its own. Runs that were
interrupted or failed (marked incomplete) form groups of their own, labelled "(incomplete)": they are shown,
never judged. Per sweep point a group pools the repeats of all its runs; estimates and 95% intervals come from
``summary.interval``. Labels are unique within a scenario: configurations measured more than once are told
apart by their ablation or run folder time stamp.

The tidy frame has one row per (group, point, metric): scenario, ablation, variant, label, status, point,
metric, value, ci_low, ci_high, ci, n, unit, better, warnings (the flags of the run warnings that concern
that point). Tables, CSV, Markdown and HTML are all views of it.

Paths given twice, or inside another path given, are read once. A run whose files hold values of the wrong
type is kept, those values read as missing (``kept.sound_run``), and its group's ``doubts`` say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from llmbench.bench.errors import error_headline
from llmbench.bench.metrics import METRICS, REQUEST_LEVEL
from llmbench.bench.report import tables, warning_flags
from llmbench.bench.report.copies import Copies, home, written_where_made
from llmbench.bench.report.kept import is_text, read_object, sound_run
from llmbench.bench.store import NO_RUN, OWN_PROCESS, Problem, Run, find_runs
from llmbench.bench.summary import interval, whole_repeats

TIDY_COLUMNS = (
    "scenario", "ablation", "variant", "label", "status", "point", "metric", "value", "ci_low", "ci_high",
    "ci", "n", "unit", "better", "warnings",
)  # fmt: skip
_REQUEST_COLUMN = {
    "ttft": "ttft", "tpot": "tpot", "e2e": "e2e", "queue": "queue_time", "client_queue": "client_queue",
}  # fmt: skip


@dataclass
class Group:
    scenario: str
    ablation: str
    variant: str
    runs: list[Run]
    complete: bool = True
    label: str = ""
    points: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # point -> repeat entries
    _requests: pd.DataFrame | None = None
    doubts: list[Problem] = field(default_factory=list)  # runs read with values of the wrong type left out
    traced_out: int = 0  # repeats left out because the profiler ran in them (``untraced``)
    stopped_out: int = (
        0  # repeats left out because an interrupt or a failure stopped them (``whole_repeats``)
    )
    damaged: dict[Path, str] = field(default_factory=dict)  # tables that could not be read, and why
    home: Path | None = None  # the folder of the ablation (or profile) holding the runs (``copies.home``)

    @property
    def meta(self) -> dict[str, Any]:
        return self.runs[0].meta

    @property
    def unavailable(self) -> dict[str, str]:
        return self.runs[0].summary.get("unavailable") or {}

    @property
    def own_processes(self) -> bool:
        """Whether each of the group's repeats ran in a process of its own: an ablation's (a run folder a
        repeat), or a run's whose repeats did (``repeat_processes`` in its summary)."""
        return len(self.runs) > 1 or all(r.summary.get("repeat_processes") == OWN_PROCESS for r in self.runs)

    @property
    def recorded_ablation(self) -> str | None:
        """The ablation the runs belong to (its folder name); None for standalone runs."""
        return self.meta.get("ablation")

    def paired_with(self, other: Group) -> bool:
        """Whether this group's repeats pair with ``other``'s by repeat index: variants of one ablation,
        run back to back on the same prompts and arrival times (one ablation folder: a name is shared)."""
        return (
            self.recorded_ablation is not None
            and self.recorded_ablation == other.recorded_ablation
            and self.home == other.home
        )

    @property
    def status(self) -> str:
        """Either complete, or incomplete with the reasons its runs recorded (interrupted, failed...)."""
        if self.complete:
            return "complete"
        why = sorted({str(r.meta.get("stop_reason") or r.meta.get("status")) for r in self.runs})
        return f"incomplete ({', '.join(why)})"

    def repeat_values(self, point: str, metric: str) -> list[float]:
        vals = [(e.get("metrics") or {}).get(metric) for e in self.points.get(point, [])]
        return [math.nan if v is None else float(v) for v in vals]

    def repeat_indices(self, point: str) -> list[int]:
        """The repeat index of each entry of ``repeat_values`` (what pairs repeats across variants)."""
        return [int(e.get("repeat", i)) for i, e in enumerate(self.points.get(point, []))]

    def warnings(self, point: str) -> list[str]:
        """The runs' warnings that concern ``point``; with several runs each names its run folder."""
        out = []
        for r in self.runs:
            points = [p.get("label", "?") for p in r.summary.get("points", [])]
            for text in r.summary.get("warnings") or []:
                if warning_flags.concerns(text, point, points):
                    out.append(f"{r.path.name}: {text}" if len(self.runs) > 1 else text)
        return out

    def flags(self, point: str) -> list[str]:
        return warning_flags.flags(self.warnings(point))

    def table(self, run: Run, name: str) -> pd.DataFrame:
        """One of a run's tables; empty when it is not kept or cannot be read (then named in ``damaged``)."""
        df, why = tables.read(run, name)
        if why is not None:
            self.damaged[run.path / f"{name}.parquet"] = why
        return df

    def unreadable(self, name: str) -> str | None:
        """The first of the group's ``name`` tables that could not be read, with why (None: all could)."""
        for path, why in self.damaged.items():
            if path.name == f"{name}.parquet":
                return f"{path} is unreadable ({why})"
        return None

    def requests(self) -> pd.DataFrame:
        """All runs' requests (loaded once); a run whose table cannot be read adds none."""
        if self._requests is None:
            frames = [self.table(r, "requests") for r in self.runs]
            frames = [f for f in frames if len(f)]
            self._requests = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return self._requests

    def request_samples(self, point: str, metric: str) -> np.ndarray:
        """Per-request values behind a latency statistic (ITL: pooled gaps), finished requests only."""
        base = REQUEST_LEVEL[metric][0] if metric in REQUEST_LEVEL else metric
        df = self.requests()
        if df.empty or "point" not in df:
            return np.empty(0)
        df = df[(df["point"] == point) & df["finish_reason"].isin(["length", "stop"])]
        if base == "itl":
            gaps = [np.diff(np.asarray(t, dtype=float)) for t in df["token_times"]]
            return np.concatenate(gaps) if gaps else np.empty(0)
        column = _REQUEST_COLUMN[base]
        if column not in df:  # a run written before the column existed
            return np.empty(0)
        return df[column].to_numpy(dtype=float)

    def value(self, point: str, metric: str) -> float:
        """The estimate alone (mean over repeats), without an interval."""
        x = np.asarray(self.repeat_values(point, metric), dtype=float)
        x = x[np.isfinite(x)]
        return float(x.mean()) if x.size else math.nan

    def estimate(self, point: str, metric: str) -> dict[str, Any]:
        return interval(self.repeat_values(point, metric))

    @property
    def startups(self) -> list[dict[str, Any]]:
        """Every start-up of the group's runs: a run's own, or, where each repeat ran in a process of its
        own, each process's (meta.json's ``repeat_processes``)."""
        out = []
        for r in self.runs:
            each = [p.get("startup") for p in r.meta.get("repeat_processes") or []]
            out += [s for s in each if isinstance(s, dict)] or [r.meta.get("startup") or {}]
        return out

    def startup(self) -> dict[str, float]:
        """Mean one-off costs over the group's start-ups (seconds); NaN for a part none measured (a remote
        server's weights, compile and graphs are not the client's to time)."""
        keys = ("engine_init_time", "load_time", "compile_time", "graph_capture_time")
        out = {}
        for k in keys:
            vals = [float(v) for s in self.startups if (v := s.get(k)) is not None]
            out[k] = float(np.mean(vals)) if vals else math.nan
        return out


def load_groups(paths: list[Any]) -> tuple[list[Group], list[Problem]]:
    """Runs grouped (incomplete ones in groups of their own, see the module docstring); folders that
    cannot be read become problems."""
    found, problems = find_runs(paths)
    problems = [_explained(p) for p in problems]
    groups: dict[tuple[str, str, str, bool], Group] = {}
    copies = Copies()
    # where llmbench wrote them first (<scenario>/<ablation>/...): of two copies the one kept is the original
    for found_run in sorted(found, key=lambda r: not written_where_made(r)):  # stable: the rest as found
        if copies.read_before(found_run):
            continue
        run, doubt = sound_run(found_run)
        if run is None:
            problems.append(doubt)
            continue
        m = run.meta
        folder = home(run)
        key = (_comparable(m), str(folder), m["variant"], run.complete)
        ablation = m.get("ablation") or str(run.path)
        g = groups.setdefault(key, Group(key[0], ablation, key[2], [], run.complete, home=folder))
        g.runs.append(run)
        if doubt is not None:
            g.doubts.append(doubt)
        for i, p in enumerate(run.summary["points"]):
            kept = untraced(run, i, p.get("repeats", []))
            g.traced_out += len(p.get("repeats", [])) - len(kept)
            whole = whole_repeats(kept)
            g.stopped_out += len(kept) - len(whole)
            g.points.setdefault(p.get("label", "?"), []).extend(whole)
    out = list(groups.values())
    _label(out)
    return out, problems + copies.problems()


def damaged_tables(groups: list[Group]) -> list[Problem]:
    """The groups' tables that cannot be read (found from their footers, recorded in each ``damaged``),
    each with what is not shown for it."""
    out = []
    for g in groups:
        for run in g.runs:
            g.damaged.update(tables.probe(run))
        out += [Problem(path, tables.damage(path, why)) for path, why in g.damaged.items()]
    return out


def _headline(error: object) -> str:
    """One line of a variant's recorded error (``error_headline``); "failed" where none is recorded."""
    return error_headline(error) if is_text(error) and error.strip() else "failed"


def untraced(run: Run, point: int, repeats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A point's repeats less those the profiler ran in (``llmbench profile``'s traced repeat, which runs
    slower by the profiler's cost: its times are no run's). Runs written before repeats said so: a run
    that ``profile`` made with an untraced reference traced its first point's last repeat."""
    if any("traced" in e for p in run.summary["points"] for e in p.get("repeats", [])):
        return [e for e in repeats if not e.get("traced")]
    if point != 0 or "--trace-reference" not in (run.meta.get("command_line") or []):
        return repeats
    last = max((int(e.get("repeat", i)) for i, e in enumerate(repeats)), default=None)
    return [e for i, e in enumerate(repeats) if int(e.get("repeat", i)) != last]


def _explained(problem: Problem) -> Problem:
    """A folder holding no run, said better when it is an ablation: what its ablation.json recorded."""
    if problem.reason != NO_RUN:
        return problem
    records = sorted(Path(problem.path).rglob(ABLATION_FILE))
    if not records:
        return problem

    def named(record: Path) -> str:  # the ablation folder, unless it is the path given
        return "ablation" if record.parent == Path(problem.path) else f"ablation {record.parent.name}"

    return Problem(problem.path, "; ".join(f"{named(r)}: {_ablation_outcome(r)}" for r in records))


ABLATION_FILE = "ablation.json"


def _ablation_outcome(path: Path) -> str:
    """Why an ablation folder holds no run, as its ablation.json tells it."""
    record, why = read_object(path)
    if record is None:
        return f"no run folder, and {ABLATION_FILE} is {why or 'missing'}"
    variants = [v for v in record.get("variants") or [] if isinstance(v, dict)]
    failed = [v for v in variants if v.get("status") == "failed"]
    if variants and len(failed) == len(variants):
        errors = "; ".join(f"{v.get('name', '?')}: {_headline(v.get('error'))}" for v in failed)
        return f"every variant failed or timed out: {errors}"
    status = record.get("status")
    if status == "running":
        return f"no variant wrote a run yet: {ABLATION_FILE} says it is running (or it died before it ended)"
    if status == "interrupted":
        return "interrupted before any variant wrote a run"
    states = ", ".join(f"{v.get('name', '?')}: {v.get('status', '?')}" for v in variants) or "no variants"
    return f"no variant wrote a run ({ABLATION_FILE}: {states})"


def _label(groups: list[Group]) -> None:
    """Unique labels within each scenario: the variant (and backend); where one name was measured more
    than once, the engine options those runs differ in (runs made apart, ``--set engine.tp=2``) and a time
    stamp; on runs made apart under names of their own, the engine options they differ in; "(incomplete)"
    on incomplete runs; "#k" for what is left."""
    names = {}
    for g in groups:
        backend = g.meta.get("backend") or "engine"
        names[id(g)] = (
            g.variant if backend == "engine" or "backend=" in g.variant else f"{g.variant} ({backend})"
        )
    for g in groups:
        same = [h for h in groups if h.scenario == g.scenario and names[id(h)] == names[id(g)]]
        stamped = len({h.ablation for h in same}) > 1
        differs = _differing_options(same).get(id(g), "") if stamped else ""
        if not differs and g.recorded_ablation is None:  # runs made apart under names of their own
            alone = [h for h in groups if h.scenario == g.scenario and h.recorded_ablation is None]
            differs = _differing_options(alone).get(id(g), "") if len(alone) > 1 else ""
        g.label = (
            names[id(g)]
            + (f" [{differs}]" if differs else "")
            + (f" @ {_stamp(g)}" if stamped else "")
            + ("" if g.complete else " (incomplete)")
        )
    for g in groups:
        twins = [h for h in groups if h.scenario == g.scenario and h.label == g.label]
        if len(twins) > 1:
            for k, h in enumerate(twins[1:], start=2):
                h.label = f"{h.label} #{k}"


def _differing_options(groups: list[Group]) -> dict[int, str]:
    """Per group, the engine options as written that not all of ``groups`` share (``tp=2``), or none."""

    def flat(options: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in options.items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    options = {id(g): flat(g.meta.get("engine_options") or {}) for g in groups}
    keys = sorted({k for o in options.values() for k in o})
    differ = [k for k in keys if len({repr(o.get(k, "default")) for o in options.values()}) > 1]
    return {i: ", ".join(f"{k}={o.get(k, 'default')}" for k in differ) for i, o in options.items() if differ}


def _stamp(g: Group) -> str:
    """An ablation's folder name, or a standalone run folder's <date>-<time>."""
    return g.recorded_ablation or "-".join(g.runs[0].path.name.split("-")[:2])


def _comparable(meta: dict[str, Any]) -> str:
    """The name runs are compared under: the scenario, plus the profile that resized it (a `cpu` profile
    swaps the model and the load, so its runs never share a table with the same scenario on a GPU)."""
    profile = (meta.get("profile") or {}).get("name")
    return f"{meta['scenario_name']} ({profile} profile)" if profile else meta["scenario_name"]


def tidy(groups: list[Group], metrics: list[str] | None = None) -> pd.DataFrame:
    rows = []
    for g in groups:
        for point in g.points:
            flags = "; ".join(g.flags(point))
            for metric in metrics or list(METRICS):
                est = g.estimate(point, metric)
                info = METRICS[metric]
                rows.append(
                    {
                        "scenario": g.scenario,
                        "ablation": g.ablation,
                        "variant": g.variant,
                        "label": g.label,
                        "status": g.status,
                        "point": point,
                        "metric": metric,
                        "value": est["value"],
                        "ci_low": est["ci_low"],
                        "ci_high": est["ci_high"],
                        "ci": est["ci"],
                        "n": est["n"],
                        "unit": info.unit,
                        "better": info.better,
                        "warnings": flags,
                    }
                )
    return pd.DataFrame(rows, columns=list(TIDY_COLUMNS))
