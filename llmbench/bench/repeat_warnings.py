"""What a repeat's records say went wrong, as warning lines for the run's summary (and, through their
flags, for every report: bench/report/warning_flags.py): a schedule that was not kept, failed requests,
outputs whose length is not what was asked, and -- from a peer server -- output token counts in doubt
and prompts the server counted differently (three different problems, kept apart as the openai
backend's counting says: bench/backends/openai_counts.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from llmbench.bench.driver import DriveResult
from llmbench.bench.records import RequestRecord

LAG_WARNING_S = (
    0.010  # a p99 hand-over lag above this (and above the p99 step) means the schedule was not kept
)


def repeat_warnings(where: str, result: DriveResult, point: dict[str, Any], open_loop: bool) -> list[str]:
    """A schedule that was not kept; failed requests; outputs whose length is not what was asked; counts in
    doubt."""
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
    return out + count_warnings(where, result.requests)


def count_warnings(where: str, requests: list[RequestRecord]) -> list[str]:
    """A peer server's output counts in doubt, and prompts it counted differently."""
    out = []
    sources: dict[str, int] = {}
    for x in requests:
        if x.output_len_source is not None:
            sources[x.output_len_source] = sources.get(x.output_len_source, 0) + 1
    counted = ", ".join(f"{k} {n}" for k, n in sorted(sources.items(), key=lambda kv: -kv[1]))
    doubt = [x for x in requests if x.count_check is not None]
    if doubt:
        out.append(
            f"{where}: the stream and the server disagree on how many output tokens {len(doubt)} of "
            f"{len(requests)} requests had, or only the stream could count them (e.g. {doubt[0].request_id}: "
            f"{doubt[0].count_check}). Counted from: {counted}; TPOT, ITL and throughputs use these counts."
        )
    elif set(sources) - {"ids", "usage"}:
        out.append(
            f"{where}: the server sent neither usage nor token ids; output tokens were counted from: {counted}."
        )
    prompts = [x for x in requests if x.prompt_check is not None]
    if prompts:
        out.append(
            f"{where}: the server counted {len(prompts)} of {len(requests)} requests' prompts differently (e.g. "
            f"{prompts[0].request_id}: {prompts[0].prompt_check}): a different tokenizer or a chat template on "
            "the server; input figures count the workload's prompt lengths."
        )
    return out
