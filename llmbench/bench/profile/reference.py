"""How many untraced steps stand behind each kind's untraced median in a variant's ``profile.json``.

The window (window.py) keeps the engine step times of the reference repeat's untraced steps; summary.py
turns them into each kind's untraced median, leaving out the slow ones (over the profile's slow-step
factor times the median) as it does in the window, and none for a kind with fewer than
``MIN_STEPS_OF_KIND`` steps. ``add_untraced_steps`` writes beside it, per kind, how many steps that median
is over (``untraced_steps``; for a kind with too few, how many there were), so that the views can say
what the median stands on: ``n`` beside it in a comparison, and why a kind has none.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from llmbench.bench.slow_steps import MIN_STEPS_OF_KIND
from llmbench.bench.store import write_json


def untraced_steps(record: dict[str, Any]) -> dict[str, int]:
    """Per kind, the untraced steps its untraced median is over (all of them when too few for one)."""
    out = {}
    for kind, durations in (record.get("reference") or {}).items():
        if len(durations) < MIN_STEPS_OF_KIND:
            out[kind] = len(durations)
            continue
        median = statistics.median(durations)
        out[kind] = sum(d <= record["slow_factor"] * median for d in durations)
    return out


def add_untraced_steps(path: Path, record: dict[str, Any]) -> None:
    """Write the counts into the profile.json at ``path``: on each kind of its breakdown, and for every
    kind of the reference repeat (one the window held none of included) under ``untraced_steps``; a
    profile without a reference repeat is left as it is."""
    if not record.get("reference"):  # no reference repeat (or it made no step): nothing to count
        return
    profile = json.loads(Path(path).read_text())
    counts = untraced_steps(record)
    for kind, column in profile.get("kinds", {}).items():
        column["untraced_steps"] = counts.get(kind, 0)
    profile["untraced_steps"] = counts
    write_json(Path(path), profile)
