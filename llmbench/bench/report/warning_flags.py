"""Run warnings as a report shows them: which sweep point each concerns, and a short flag for each.

A run's ``summary.json`` lists its warnings as sentences. Those about one repeat of one point begin with
``"<point> repeat <r>: "`` (a schedule not kept, failed requests, outputs of the wrong length, a stop at
max_duration_s); the others (a busy machine, a backend's own) concern the whole run. Flags are what tables
show beside the figures; the sentences go under the table. ``TIMING_FLAGS`` are the ones that make
timings doubtful, so a verdict on such runs says so.
"""

from __future__ import annotations

import re

# (words in the warning, flag shown); the first match wins.
_FLAGS = (
    ("machine was busy", "busy"),
    ("fell behind the arrival schedule", "lagging"),
    ("event loop was held up", "lagging"),
    ("requests failed", "failed requests"),
    ("not the length asked for", "output lengths"),
    ("disagree on how many output tokens", "output counts"),
    ("sent neither usage nor token ids", "output counts"),
    ("prompts differently", "prompt counts"),
    ("stopped after max_duration_s", "stopped early"),
)
TIMING_FLAGS = ("busy", "lagging")
_REPEAT_PREFIX = re.compile(r"^(?P<point>.+?) repeat \d+: ")


def flag(text: str) -> str:
    """The short flag of one warning sentence ("warning" when it is none of the known kinds)."""
    for words, name in _FLAGS:
        if words in text:
            return name
    return "warning"


def concerns(text: str, point: str, points: list[str]) -> bool:
    """Whether a warning concerns ``point`` (of a run whose points are ``points``)."""
    m = _REPEAT_PREFIX.match(text)
    if m is None or m["point"] not in points:
        return True  # about the whole run
    return m["point"] == point


def flags(texts: list[str]) -> list[str]:
    """Distinct flags of some warnings, in a fixed order."""
    found = {flag(t) for t in texts}
    order = dict.fromkeys([*(name for _, name in _FLAGS), "warning"])  # a flag several wordings share: once
    return [f for f in order if f in found]
