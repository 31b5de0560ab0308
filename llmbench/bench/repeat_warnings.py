"""What a repeat's records say went wrong, as warning lines for the run's summary (and, through their
flags, for every report: bench/report/warning_flags.py): a schedule that was not kept, failed requests,
outputs whose length is not what was asked.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from llmbench.bench.driver import DriveResult

LAG_WARNING_S = (
    0.010  # a p99 hand-over lag above this (and above the p99 step) means the schedule was not kept
)


def repeat_warnings(where: str, result: DriveResult, point: dict[str, Any], open_loop: bool) -> list[str]:
    """A schedule that was not kept; failed requests; outputs whose length is not what was asked."""
    out = []
    lags = [x.arrival_lag for x in result.requests]
    # A request due during an engine step is handed over when the step ends: a wait up to the usual steps'
    # length (their p99) is the engine's granularity, counted in its latencies, not a schedule missed.
    steps = [s.duration for s in result.steps]
    allowed = max(LAG_WARNING_S, float(np.percentile(steps, 99))) if steps else LAG_WARNING_S
    if point["kind"] != "offline" and open_loop and lags and np.percentile(lags, 99) > allowed:
        longest = max((s.duration for s in result.steps), default=math.nan)
        why = (
            f"requests enter between engine steps; the longest step took {longest * 1e3:.1f} ms"
            if result.steps
            else "the backend's client could not keep up"
        )
        out.append(
            f"{where}: the driver fell behind the arrival schedule: hand-over lag p99 "
            f"{np.percentile(lags, 99) * 1e3:.1f} ms, max {max(lags) * 1e3:.1f} ms ({why}). Latencies count "
            "from the scheduled arrival, so they include this lag."
        )
    failed = [x for x in result.requests if x.finish_reason == "failed"]
    if failed:
        kinds: dict[str, int] = {}
        for x in failed:
            key = (x.error or "unknown error").split(":")[0]
            kinds[key] = kinds.get(key, 0) + 1
        listed = ", ".join(f"{k} ({n})" for k, n in kinds.items())
        out.append(
            f"{where}: {len(failed)} of {len(result.requests)} requests failed: {listed}; first: "
            f"{failed[0].request_id}: {failed[0].error}. They are counted apart, not in the latencies."
        )
    odd = [x for x in result.requests if x.output_check is not None]
    if odd:
        out.append(
            f"{where}: {len(odd)} of {len(result.requests)} requests' outputs are not the length asked for "
            f"(e.g. {odd[0].request_id}: {odd[0].output_check}); throughputs count the tokens served."
        )
    return out
