"""How late the client's own event loop runs while it serves a run point.

Every token is stamped when the client's loop gets round to reading it. A loop held up -- a busy or slow
client machine, a long garbage collection, a process stopped for a while, more streams than one core can
parse -- stamps the tokens that arrived meanwhile when it resumes, late by up to the hold-up, and sends
the requests that fell due meanwhile late. Latencies that count from the send leave the late send out,
but not the late stamps: the requests in flight during a hold-up have TTFT, TPOT and E2E inflated by up
to its length.

``LoopProbe`` is a ticker task on the client's loop for the whole point: it asks to wake every ``TICK_S``
and records how late it woke. ``held`` gives, for one request's life (sent -> last token stamped), how
long the loop was held up at once: a bound on how late any of its tokens was stamped, and so on how much
the client inflated its latencies.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

# A hold-up longer than a tick always delays one (and is seen short by at most a tick); 200 wakes a second
# cost about 1% of a core (500 cost 2%).
TICK_S = 0.005
STALL_S = 0.005  # a wake-up later than this is a hold-up whose span is kept (shorter ones are jitter)


class LoopLag(NamedTuple):
    """How late the loop woke over a point."""

    max: float  # seconds
    p99: float
    stalls: list[tuple[float, float]]  # (from, to) of each hold-up past STALL_S, clock seconds


class LoopProbe:
    def __init__(self, clock: Callable[[], float], tick: float = TICK_S) -> None:
        self.clock = clock
        self.tick = tick
        self.late = array("d")
        self.stalls: list[tuple[float, float]] = []

    async def run(self) -> None:
        """Tick until cancelled."""
        while True:
            due = self.clock() + self.tick
            await asyncio.sleep(self.tick)
            now = self.clock()
            late = max(now - due, 0.0)
            self.late.append(late)
            if late > STALL_S:
                self.stalls.append((due, now))

    def lag(self) -> LoopLag:
        if not self.late:
            return LoopLag(0.0, 0.0, [])
        late = np.frombuffer(self.late, dtype=float)
        return LoopLag(float(late.max()), float(np.percentile(late, 99)), list(self.stalls))


def held(stalls: list[tuple[float, float]], start: float, end: float) -> float:
    """The longest of ``stalls`` within [start, end]: how late a token of a request alive then may have been
    stamped (a latency is a difference of two stamps, each late by at most the hold-up it ended)."""
    return max((min(end, b) - max(start, a) for a, b in stalls if a < end and b > start), default=0.0)
