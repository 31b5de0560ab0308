"""The result store: one folder per run, written atomically, never overwritten.

Layout: ``<root>/<scenario>/<YYYYmmdd-HHMMSS>-<variant>/`` holding ``meta.json``, ``summary.json``,
``requests.parquet``, ``steps.parquet`` and ``telemetry.parquet``. A run is built in a hidden sibling
``.tmp-<name>-<pid>`` (with a ``meta.json`` saying "running" from the start) and renamed into place
when written; a name already taken gets a ``-2``, ``-3``... suffix. While a run is measured it may write
checkpoints there (``checkpoint``: the repeats so far, marked incomplete, stop reason "died"). A leftover
``.tmp-*`` folder is a process that died before it wrote its run: readers show its last checkpoint as an
incomplete run, or, with none, report it and move on; one whose process still runs on this machine is
being written (``writer_process``: not when its id now names another process).

Reading: :func:`find_runs` walks any set of paths (nested too) and returns the run folders plus a list of
problems (broken, unreadable, leftover); :func:`load_run` raises :class:`StoreError` with the reason.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

from llmbench.bench.errors import StoreError
from llmbench.bench.writer_process import still_writing

TABLES = ("requests", "steps", "telemetry")
REQUIRED = ("meta.json", "summary.json")
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def slug(text: str) -> str:
    """A folder-safe version of a variant name (``cuda_graph=off`` -> ``cuda_graph-off``)."""
    return _SLUG.sub("-", text).strip("-") or "run"


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return str(value)


def _clean(value: Any) -> Any:
    """NaN/inf become null: JSON has no NaN, and a missing figure must not read as a number."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(_clean(data), indent=2, default=_json_default, allow_nan=False) + "\n")
    os.replace(tmp, path)


def os_reason(exc: OSError, path: Path) -> str:
    """Why ``path`` (or a folder to be made on the way to it) could not be written, in words: a file where
    a folder must be says so (the system's "File exists" or "Not a directory" would not)."""
    for above in [Path(path), *Path(path).parents]:
        if above.is_file() and above != Path(path):
            return f"{above} is a file, not a folder"
        if above.exists():
            break
    return exc.strerror or str(exc)


class RunWriter:
    """Creates the hidden working folder now; :meth:`finish` writes the tables and renames it."""

    def __init__(self, root: Path, scenario: str, variant: str, exact: Path | None = None) -> None:
        if exact is not None:
            exact = Path(exact)
            if exact.exists():
                raise StoreError(f"{exact} already exists; results are never overwritten")
            self.parent, self.name = exact.parent, exact.name
        else:
            self.parent = Path(root) / scenario
            self.name = f"{time.strftime('%Y%m%d-%H%M%S')}-{slug(variant)}"
        self.exact = exact is not None
        self.made_parent = not self.parent.exists()  # discard() takes it away again when left empty
        try:
            self.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = self.parent / f".tmp-{self.name}-{os.getpid()}"
            self.tmp.mkdir()
        except OSError as exc:
            raise StoreError(
                f"cannot create a results folder under {self.parent}: {os_reason(exc, self.parent / 'x')}"
            ) from None
        here = {"status": "running", "pid": os.getpid(), "machine": {"hostname": platform.node()}}
        write_json(self.tmp / "meta.json", here)

    def checkpoint(self, meta: dict[str, Any], summary: dict[str, Any], tables: dict[str, Any]) -> None:
        """Write everything into the working folder, each file whole or not at all, meta.json last."""
        for name in TABLES:
            df = tables.get(name)
            if df is not None:
                part = self.tmp / f"{name}.parquet.part"
                df.to_parquet(part, index=False)
                os.replace(part, self.tmp / f"{name}.parquet")
        write_json(self.tmp / "summary.json", summary)
        write_json(self.tmp / "meta.json", meta)

    def finish(self, meta: dict[str, Any], summary: dict[str, Any], tables: dict[str, Any]) -> Path:
        """Write everything, then move the folder into place; returns its final path."""
        self.checkpoint(meta, summary, tables)
        return self._rename()

    def _rename(self) -> Path:
        for k in range(1, 1000):
            final = self.parent / (self.name if k == 1 else f"{self.name}-{k}")
            if final.exists():
                if self.exact:
                    raise StoreError(f"{final} appeared while the run was written; kept at {self.tmp}")
                continue
            try:
                os.rename(self.tmp, final)  # atomic; fails rather than replace a non-empty folder
                return final
            except OSError:
                if self.exact:
                    raise
        raise StoreError(f"no free run folder name under {self.parent} for {self.name}")

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.made_parent:
            with contextlib.suppress(OSError):  # another run's folder may be in it by now
                self.parent.rmdir()


class Problem(NamedTuple):
    path: Path
    reason: str


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise StoreError(f"{path.parent}: missing {path.name}") from None
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path.parent}: {path.name} is unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path.parent}: {path.name} does not hold a JSON object")
    return data


class Run(NamedTuple):
    path: Path
    meta: dict[str, Any]
    summary: dict[str, Any]

    @property
    def complete(self) -> bool:
        return self.meta.get("status") == "complete"

    def table(self, name: str) -> Any:
        """One of the run's tables as a DataFrame (empty with no columns when it is missing)."""
        import pandas as pd

        path = self.path / f"{name}.parquet"
        if not path.exists():
            return pd.DataFrame()
        try:
            return pd.read_parquet(path)
        except Exception as exc:
            raise StoreError(f"{self.path}: {name}.parquet is unreadable ({exc})") from exc


# The layout of a run's meta.json and summary.json; a reader refuses a newer one rather than misread it.
# Raise it when a field changes meaning or a reader would need to know of a new one. 2: ``peak_memory`` is
# what one device held (format 1 summed the GPUs of a tensor-parallel group).
RESULT_FORMAT = 2
# summary.json's ``repeat_processes`` when each repeat ran in a process of its own (``repeat_processes.py``);
# a run without it measured every repeat in its one process
OWN_PROCESS = "own"


def load_run(path: Path) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise StoreError(f"{path}: not a run folder (no such directory)")
    meta = _read_json(path / "meta.json")
    summary = _read_json(path / "summary.json")
    for name, record in (("meta.json", meta), ("summary.json", summary)):
        written = record.get("format", 1)  # runs written before the files said so are format 1
        if isinstance(written, float) and written.is_integer():  # 2.0, as a hand or another tool writes it
            written = int(written)
        if isinstance(written, bool) or not isinstance(written, int) or written < 1:
            raise StoreError(
                f"{path}: {name} is of format {written!r}, which no llmbench writes (formats are whole numbers "
                f"from 1; this one reads 1 to {RESULT_FORMAT})"
            )
        if written > RESULT_FORMAT:
            raise StoreError(
                f"{path}: {name} is of format {written!r}, written by a newer llmbench; this one reads format "
                f"{RESULT_FORMAT} and older (upgrade llmbench to read it)"
            )
    if meta.get("status") == "running":
        raise StoreError(f"{path}: the run never finished writing (status 'running')")
    for key in ("scenario_name", "variant"):
        if key not in meta:
            raise StoreError(f"{path}: meta.json lacks '{key}'")
    if not isinstance(summary.get("points"), list):
        raise StoreError(f"{path}: summary.json lacks its 'points' list")
    return Run(path, meta, _as_current(summary, meta))


def _as_current(summary: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """A format-1 summary read as the current format says: at tp > 1 its peak memory was the group's sum,
    which no figure it kept can turn into one device's, so it is unavailable (``gpu_memory_max`` keeps the
    sum, under its own name)."""
    config = meta.get("engine_config") if isinstance(meta.get("engine_config"), dict) else {}
    if summary.get("format", 1) >= 2 or not isinstance(config.get("tp"), int) or config["tp"] <= 1:
        return summary
    for point in summary["points"]:
        for holder in (point, *(point.get("repeats") or [])):
            if isinstance(holder, dict) and isinstance(holder.get("metrics"), dict):
                holder["metrics"].pop("peak_memory", None)
    unavailable = summary.setdefault("unavailable", {})
    unavailable["peak_memory"] = (
        "recorded by an older llmbench as the sum over the tensor-parallel GPUs, not one device's peak"
    )
    return summary


def _left_over(path: Path) -> Run | str:
    """A run's working folder found by a reader: its last checkpoint as an incomplete run when its process
    is gone, else why it is not shown."""
    try:
        meta = _read_json(path / "meta.json")
    except StoreError:
        meta = {}
    host, pid = (meta.get("machine") or {}).get("hostname"), meta.get("pid")
    if host == platform.node() and isinstance(pid, int) and still_writing(pid, path / "meta.json"):
        return f"being written by process {pid}, which is still running"
    if meta.get("status") in ("running", None):
        return "left over by a run that died before it measured a repeat"
    try:
        return load_run(path)
    except StoreError as exc:
        return f"left over by a run that died; its checkpoint is unreadable ({unled(exc, path)})"


def owner() -> dict[str, Any]:
    """Which process writes a record that says "running" (ablation.json, profile.json): a reader can
    then tell one still under way from one whose process died (``died``)."""
    return {"pid": os.getpid(), "host": platform.node()}


def died(record: dict[str, Any], path: Path | None = None) -> str | None:
    """Why a record that says it is running is not: its process, on this machine, is gone (or its id
    now names another process, one that started after ``path``, the record's file, was written)."""
    pid = record.get("pid")
    if record.get("status") != "running" or record.get("host") != platform.node() or not isinstance(pid, int):
        return None
    if still_writing(pid, path):
        return None
    return f"it says it is running, but its process ({pid}) is gone: it died before it ended"


def unled(exc: StoreError, path: Path) -> str:
    """An error about ``path`` without the path it begins with: a :class:`Problem` names its path."""
    return str(exc).removeprefix(f"{path}: ")


NO_RUN = "holds no run folder (none with meta.json)"  # a path given that holds nothing to read


def distinct(paths: list[Path]) -> list[Path]:
    """The paths given, each folder once: a repeat, or a folder inside another one given, is dropped (it
    would be read twice, or said to hold nothing since its runs were read already); a missing one stays,
    to be reported."""
    out: dict[Path, Path] = {}
    for path in map(Path, paths):
        out.setdefault(path.resolve(), path)
    return [p for key, p in out.items() if not (p.exists() and any(other in key.parents for other in out))]


def find_runs(paths: list[Path]) -> tuple[list[Run], list[Problem]]:
    """Every run folder at or below ``paths`` (sorted, each once), and what could not be read there."""
    runs: list[Run] = []
    problems: list[Problem] = []
    seen: set[Path] = set()

    def visit(p: Path) -> None:
        rp = p.resolve()
        if rp in seen:
            return
        seen.add(rp)
        if p.name.startswith(".tmp-"):
            left = _left_over(p)
            if isinstance(left, Run):
                runs.append(left)
            else:
                problems.append(Problem(p, left))
            return
        if (p / "meta.json").exists() or (p / "summary.json").exists():
            try:
                runs.append(load_run(p))
            except StoreError as exc:
                problems.append(Problem(p, unled(exc, p)))
            return
        children = sorted(c for c in p.iterdir() if c.is_dir())
        for c in children:
            visit(c)

    for path in distinct(paths):
        if not path.exists():
            problems.append(Problem(path, "no such file or directory"))
        elif not path.is_dir():
            problems.append(Problem(path, "not a directory"))
        else:
            before = len(runs) + len(problems)
            visit(path)
            if len(runs) + len(problems) == before:
                problems.append(Problem(path, NO_RUN))
    runs.sort(key=lambda r: str(r.path))
    return runs, problems
