"""A clock for serving-loop tests that stands still while the server works and moves only when the loop
sleeps: what max_duration does then cannot depend on how fast this machine is."""

from __future__ import annotations


class StillClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
