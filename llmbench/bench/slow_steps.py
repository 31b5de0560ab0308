"""Slow steps: engine steps far slower than the median of their kind, and what each one was.

A step is slow when its duration exceeds ``factor`` (default 5) times the median duration of the steps of
the same kind (prefill, decode, mixed) in the same repeat; kinds with fewer than ``MIN_STEPS_OF_KIND``
steps have no median worth comparing against. Its causes are read from what the engine counted during
the step (engine/step_counters.py) and from its size:

- "Triton compile": a Triton kernel variant was compiled (or loaded from Triton's cache) in the step;
- "CUDA Graph capture", "torch.compile recompile": likewise;
- "allocator growth": device memory in use (CUDA) or the resident set (CPU) grew by at least
  ``GROWTH_BYTES`` (new memory from the driver or the OS; smaller changes are the allocator's noise);
- "garbage collection": Python's collector ran for at least half of the step's excess over the median;
- "preemption": the scheduler preempted a sequence for KV blocks in the step;
- "large step": it carried more than ``LARGE_FACTOR`` times the median number of tokens of its kind, and
  took no more times the median time than it carried times the median tokens (a step 400x slower with
  twice the tokens is not explained by its size);
- "telemetry sample": the run's telemetry thread was taking a sample (NVML queries, psutil) while the
  step ran, and the step was shorter than the time between samples (a longer one meets a sample whatever
  held it up): a GPU query can hold up the engine's own calls into the driver, and the sampling thread
  takes the interpreter's lock from the engine's (scenario ``telemetry.period_ms`` sets how often);
- "trace start" (``llmbench profile --slow-steps`` only): the first step after the profiler started
  recording a chunk, which pays for the profiler's start (seen at 0.3-0.95 s against 5 ms);
- "unexplained" when none of these holds.
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from llmbench.bench.records import StepRecord

SLOW_FACTOR = 5.0
SLOW_COLUMNS = "steps.parquet: slow, slow_causes"  # where a run's slow-step warning points
SLOW_LINE = re.compile(r"^\d+ slow steps? \(>")  # how ``causes_warning``'s lines begin
MIN_STEPS_OF_KIND = 5
GROWTH_BYTES = 8 * 2**20  # a caching-allocator segment is 2 MiB; host RSS moves by a few MiB on its own
LARGE_FACTOR = 2.0
CAUSES = (
    "Triton compile",
    "CUDA Graph capture",
    "torch.compile recompile",
    "allocator growth",
    "garbage collection",
    "preemption",
    "large step",
    "telemetry sample",
    "trace start",
    "unexplained",
)


class SlowStep(NamedTuple):
    index: int  # position in the list of steps given
    ratio: float  # duration / median duration of its kind
    causes: tuple[str, ...]


def causes_of(
    step: StepRecord,
    median_duration: float,
    median_tokens: float,
    samples: Sequence[tuple[float, float]] = (),
    period: float = math.inf,
) -> tuple[str, ...]:
    """What explains a slow step; ``samples`` are the (start, end) times of the telemetry samples taken
    during the run, sorted, on the steps' clock, ``period`` the typical time between their starts."""
    causes = []
    if step.triton_compiles:
        causes.append("Triton compile")
    if step.graph_captures:
        causes.append("CUDA Graph capture")
    if step.recompiles:
        causes.append("torch.compile recompile")
    if step.memory_growth >= GROWTH_BYTES:
        causes.append("allocator growth")
    if step.gc_time > 0 and step.gc_time >= 0.5 * (step.duration - median_duration):
        causes.append("garbage collection")
    if step.num_preemptions:
        causes.append("preemption")
    tokens = step.num_prefill_tokens + step.num_decode_tokens
    if tokens > LARGE_FACTOR * median_tokens and step.duration * median_tokens <= tokens * median_duration:
        causes.append("large step")
    if samples and step.end - step.start < period and _overlaps(samples, step.start, step.end):
        causes.append("telemetry sample")
    return tuple(causes) or ("unexplained",)


def _overlaps(intervals: Sequence[tuple[float, float]], start: float, end: float) -> bool:
    # The samples come one after another from one thread: of those that began before the step ended, only
    # the last can still be running when the step began.
    i = bisect.bisect_left(intervals, (end, -math.inf))
    return i > 0 and intervals[i - 1][1] > start


def find_slow_steps(
    steps: list[StepRecord], factor: float = SLOW_FACTOR, samples: Sequence[tuple[float, float]] = ()
) -> list[SlowStep]:
    """The slow steps among ``steps`` (one repeat's), in order; ``samples`` as for ``causes_of``."""
    starts = [a for a, _ in samples]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    period = statistics.median(gaps) if gaps else math.inf
    by_kind: dict[str, list[StepRecord]] = {}
    for s in steps:
        by_kind.setdefault(s.kind, []).append(s)
    medians = {
        kind: (
            statistics.median(s.duration for s in members),
            statistics.median(s.num_prefill_tokens + s.num_decode_tokens for s in members),
        )
        for kind, members in by_kind.items()
        if len(members) >= MIN_STEPS_OF_KIND
    }
    slow = []
    for i, s in enumerate(steps):
        if s.kind not in medians:
            continue
        duration, tokens = medians[s.kind]
        if duration > 0 and s.duration > factor * duration:
            slow.append(SlowStep(i, s.duration / duration, causes_of(s, duration, tokens, samples, period)))
    return slow


def _plural(cause: str, n: int) -> str:
    if n == 1 or cause in ("allocator growth", "garbage collection", "trace start", "unexplained"):
        return f"{n} {cause}"
    return f"{n} {cause}s"


def slow_step_warning(slow: Sequence[SlowStep], factor: float = SLOW_FACTOR) -> str | None:
    """One line naming how many steps were slow and why, e.g. "3 slow steps (>5x the median of their
    kind): 2 Triton compiles, 1 allocator growth"; None when there were none."""
    return causes_warning([s.causes for s in slow], factor)


def causes_warning(causes: Sequence[Sequence[str]], factor: float = SLOW_FACTOR) -> str | None:
    """``slow_step_warning`` of slow steps known by their causes alone (one list per step: a stored
    steps table's ``slow_causes``)."""
    if not causes:
        return None
    counts = Counter(c for step in causes for c in step)
    listed = ", ".join(_plural(c, counts[c]) for c in CAUSES if counts[c])
    noun = "step" if len(causes) == 1 else "steps"
    return f"{len(causes)} slow {noun} (>{factor:g}x the median of their kind): {listed}"
