"""Reading kept result files tolerantly: a value of the wrong type counts as missing, never a crash.

Result folders outlive the code that wrote them and are sometimes edited by hand; a report over many must
not die on one odd value. ``sound_run`` returns a run whose meta.json and summary.json hold only values of
the types the report reads (the others removed, or null: shown as –) and says what it removed, so that the
run is named once in a warning. A metric's figure must also be possible (``impossible``): NaN, Infinity
or a negative latency, rate or count, written by hand or by a damaged copy, reads as missing the same way.
Null is not wrong: it is how the store writes a missing figure (NaN, inf).
The side files of an ablation or a profile (ablation.json, quality.json, comparison.json, profile.json)
are read with ``read_object``, and ``side_file_problems`` names those that cannot be used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmbench.bench.store import Problem, Run

MAX_LISTED = 3  # wrong values named in a run's warning; the rest are counted


def number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def is_number(value: Any) -> bool:
    return number(value) is not None


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_text(value: Any) -> bool:
    return isinstance(value, str)


def is_list(value: Any) -> bool:
    return isinstance(value, list)


def is_object(value: Any) -> bool:
    return isinstance(value, dict)


def show(value: Any) -> str:
    """A wrong value as a warning quotes it: short, JSON-like."""
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_object(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A JSON file holding an object: (it, None); (None, None) when there is no such file; (None, why)
    when it cannot be read or holds something else."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"not readable JSON ({exc})"
    if not isinstance(data, dict):
        return None, f"holds {_json_kind(data)}, not a JSON object"
    return data, None


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {list: "an array", str: "a string", int: "a number", float: "a number"}.get(type(value), "a value")


# Metrics a sound run can record below 0: the decode step model's fixed part is a fit's intercept, and an
# arrival lag is a send time less a scheduled one. Every other is a time, rate, count, share or amount.
SIGNED = frozenset({"decode_fixed", "arrival_lag_p99", "arrival_lag_max"})


def impossible(metric: str, value: Any) -> str | None:
    """Why a recorded figure of ``metric`` cannot be one (None when it can): it is not a number, not a
    finite one (JSON readers take NaN and Infinity), or below 0 where the metric never is."""
    v = number(value)
    if v is None:
        return "not a number"
    if not math.isfinite(v):
        return "not a finite number"
    if v < 0 and metric not in SIGNED:
        return "below 0, which this metric never is"
    return None


# meta.json's fields the report reads, dotted, with the type each must have.
_META_FIELDS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("ablation", is_text, "a text"),
    ("status", is_text, "a text"),
    ("stop_reason", is_text, "a text"),
    ("backend", is_text, "a text"),
    ("started_at", is_text, "a text"),
    ("profile.name", is_text, "a text"),
    ("scenario.model", is_text, "a text"),
    ("model_info.name", is_text, "a text"),
    ("scenario.sampling.temperature", is_number, "a number"),
    ("startup.engine_init_time", is_number, "a number"),
    ("startup.load_time", is_number, "a number"),
    ("startup.compile_time", is_number, "a number"),
    ("startup.graph_capture_time", is_number, "a number"),
    ("machine.cpu", is_text, "a text"),
    ("machine.gpus", is_list, "a list"),
    ("git.commit", is_text, "a text"),
    ("command_line", is_list, "a list"),
    ("engine_options", is_object, "an object"),
    ("engine_config", is_object, "an object"),
)
_BIN_FIELDS = ("min", "steps", "time", "device_wait")  # decode_batches: numbers every bin has


def _field(data: dict[str, Any], dotted: str, ok: Callable[[Any], bool], what: str, file: str) -> str | None:
    """Remove ``dotted`` from ``data`` where it (or an object on its way) has the wrong type; say what."""
    *parents, key = dotted.split(".")
    d = data
    for i, p in enumerate(parents):
        nxt = d.get(p)
        if not isinstance(nxt, dict):
            d[p] = {}  # readers go on with .get
            if nxt is not None:
                return f"{file} {'.'.join(parents[: i + 1])} is {show(nxt)}, not an object"
            return None
        d = nxt
    value = d.get(key)
    if value is not None and not ok(value):
        d[key] = None
        return f"{file} {dotted} is {show(value)}, not {what}"
    return None


def _bins_ok(bins: Any) -> bool:
    return isinstance(bins, list) and all(
        isinstance(b, dict)
        and all(is_number(b.get(k)) for k in _BIN_FIELDS)
        and (b.get("max") is None or is_number(b.get("max")))
        for b in bins
    )


def _sound_summary(summary: dict[str, Any], issues: list[str]) -> None:
    points = []
    for k, p in enumerate(summary["points"]):
        if not isinstance(p, dict):
            issues.append(f"summary.json points[{k}] is {show(p)}, not an object")
            continue
        if not is_text(p.get("label")):
            if p.get("label") is not None:
                issues.append(f"summary.json points[{k}].label is {show(p['label'])}, not a text")
            p["label"] = "?"
        where = p["label"]
        repeats = p.get("repeats")
        if not isinstance(repeats, list):
            if repeats is not None:
                issues.append(f"summary.json {where} repeats is {show(repeats)}, not a list")
            repeats = []
        entries = []
        for i, e in enumerate(repeats):
            if not isinstance(e, dict):
                issues.append(f"summary.json {where} repeat #{i} is {show(e)}, not an object")
                continue
            if "repeat" in e and not is_int(e["repeat"]):
                issues.append(
                    f"summary.json {where} repeat #{i} index is {show(e['repeat'])}, not an integer"
                )
                del e["repeat"]
            name = f"{where} repeat {e.get('repeat', f'#{i}')}"
            metrics = e.get("metrics")
            if not isinstance(metrics, dict):
                if metrics is not None:
                    issues.append(f"summary.json {name} metrics is {show(metrics)}, not an object")
                e["metrics"] = metrics = {}
            for m, v in metrics.items():
                if v is not None and (why := impossible(m, v)) is not None:
                    issues.append(f"summary.json {name} {m} is {show(v)}, {why}")
                    metrics[m] = None
            if e.get("decode_batches") is not None and not _bins_ok(e["decode_batches"]):
                issues.append(f"summary.json {name} decode_batches is not a list of bins")
                del e["decode_batches"]  # read as not recorded
            entries.append(e)
        p["repeats"] = entries
        points.append(p)
    summary["points"] = points
    warnings = summary.get("warnings")
    if warnings is not None and not (isinstance(warnings, list) and all(map(is_text, warnings))):
        issues.append("summary.json warnings is not a list of texts")
        summary["warnings"] = [w for w in warnings if is_text(w)] if isinstance(warnings, list) else []
    unavailable = summary.get("unavailable")
    if unavailable is not None and not isinstance(unavailable, dict):
        issues.append(f"summary.json unavailable is {show(unavailable)}, not an object")
        summary["unavailable"] = {}


def sound_run(run: Run) -> tuple[Run | None, Problem | None]:
    """The run with its wrong values removed, and a problem naming them (None when all is well). A run
    whose scenario or variant name is not a text cannot be grouped: (None, why)."""
    for key in ("scenario_name", "variant"):
        if not is_text(run.meta[key]):
            return None, Problem(run.path, f"meta.json '{key}' is {show(run.meta[key])}, not a text")
    issues = [why for f in _META_FIELDS if (why := _field(run.meta, *f, "meta.json")) is not None]
    _sound_summary(run.summary, issues)
    if not issues:
        return run, None
    listed = "; ".join(issues[:MAX_LISTED])
    more = f"; and {len(issues) - MAX_LISTED} more" if len(issues) > MAX_LISTED else ""
    return run, Problem(run.path, f"values of the wrong type read as missing (–): {listed}{more}")


def finite(value: Any) -> float:
    """A recorded number, NaN when it is missing or of the wrong type."""
    v = number(value)
    return math.nan if v is None else v
