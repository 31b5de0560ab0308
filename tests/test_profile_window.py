"""The profile window with a fake engine: a trace written while Ctrl-C comes is kept in the record, and
slow steps are judged against traced steps, so the profiler's own cost never makes a kind slow."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmbench.bench.profile.window import ProfileWindow
from llmbench.bench.records import StepRecord


def _decode(step: int, duration: float) -> StepRecord:
    return StepRecord(step, "decode", 4, 0, 4, None, 0, 1, 1, 0, 0, 0.0, duration, 0)


class _Engine:
    """What the window calls of an engine: each written trace leaves a file behind."""

    config = SimpleNamespace(async_scheduling=False)

    def __init__(self, interrupt_on_write: bool = False) -> None:
        self.interrupt_on_write = interrupt_on_write

    def start_trace(self) -> None:
        pass

    def stop_trace(self, path: str | None) -> None:
        if path is not None:
            Path(path.format(rank=0)).write_text("{}")
            if self.interrupt_on_write:  # Ctrl-C while the trace is written out
                os.kill(os.getpid(), signal.SIGINT)

    def has_unfinished(self) -> bool:
        return False


def _steps(window: ProfileWindow, engine: _Engine, durations: list[float], first: int = 0) -> None:
    for i, d in enumerate(durations, start=first):
        window.before_step(engine)
        window.after_step(engine, _decode(i, d), d)


def test_ctrl_c_while_a_chunk_is_written_keeps_the_chunk_in_the_record(tmp_path):
    window = ProfileWindow(tmp_path, steps_per_kind=2)
    with pytest.raises(KeyboardInterrupt):
        _steps(window, _Engine(interrupt_on_write=True), [0.01] * 10)
    (written,) = [p.name for p in tmp_path.iterdir()]
    (chunk,) = window.record()["chunks"]  # the interrupt came after the chunk was recorded
    assert chunk["file"].format(rank=0) == written
    assert len(chunk["calls"]) == len(window.calls) == 4


def test_traced_steps_are_judged_slow_against_traced_steps_not_the_untraced_reference(tmp_path):
    # Tracing doubles every decode step: against the untraced repeat's median each would be slow at 1.5x,
    # and the kind would vanish from the breakdown. Only the step slow among traced ones is.
    window = ProfileWindow(tmp_path, steps_per_kind=8, factor=1.5, reference_repeat=True)
    engine = _Engine()
    window.begin_repeat(0, 0, last=False)
    _steps(window, engine, [0.01] * 12)  # the untraced reference repeat
    window.begin_repeat(0, 1, last=True)
    traced = [0.02] * 6 + [0.1] + [0.02] * 3
    _steps(window, engine, traced, first=12)
    window.end_of_run(engine)
    record = window.record()
    assert record["reference"]["decode"] == [0.01] * 12
    slow = [c["step"] for c in record["calls"] if c["slow"]]
    assert slow == [18]  # the 0.1 s step, 5x the traced median
    (flagged,) = [c for c in record["calls"] if c["slow"]]
    assert flagged["ratio"] == pytest.approx(5.0)
