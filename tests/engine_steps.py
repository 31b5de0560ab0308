"""Driving an engine step by step in tests: requests added at given steps, the stats of the steps that ran."""

from __future__ import annotations

from typing import Any


def run_steps(engine: Any, arrivals: dict[int, list[tuple[str, list[int]]]], params: Any) -> list:
    """Run until done, adding ``arrivals[k]`` (request id, prompt) before step k; the stats of the steps
    that ran (idle ones left out)."""
    stats, k = [], 0
    while k <= max(arrivals) or engine.has_unfinished():
        for rid, prompt in arrivals.get(k, []):
            engine.add_request(rid, prompt, params)
        stats.append(engine.step().stats)
        k += 1
    return [s for s in stats if s.kind != "idle"]
