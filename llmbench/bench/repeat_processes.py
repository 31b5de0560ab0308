"""A run whose repeats each run in a process of their own: ``llmbench run``'s way with two or more repeats.

Why: the repeats of one process share its load, its compile and graph capture, its allocator and its
stretch of time, so their spread leaves out what differs from one process to the next (a GPU holding
another clock, memory placed otherwise). Intervals over such repeats are too narrow for a verdict on two
runs; over repeats in processes of their own they hold that difference too, as an ablation's do.

How: this process checks the scenario against its backend before any cost (as a run in one process does:
a bad value is the same error, at once) and opens the run's working folder. For each repeat r it starts
``python -m llmbench run SCENARIO --repeat-index r --run-dir <working folder>/parts/r<r>`` with the run's
overrides, profile and variant, shows the child's progress and warnings as they come (``event_lines.py``),
and then writes every repeat measured so far as the run's checkpoint (``repeat_parts.py`` merges them).
Each repeat runs every sweep point in turn, a sweep's rates from that repeat's own throughput point (as in
an ablation). A Ctrl-C reaches the child too: it keeps what it measured and the run is written, marked
incomplete. A child that fails: with no repeat measured its error is the run's, with its exit status;
otherwise the run keeps the repeats measured, marked failed.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmbench.bench.backends import make_backend
from llmbench.bench.child_process import ChildTimeout, child_error, package_env, run_child
from llmbench.bench.errors import RunFailed
from llmbench.bench.event_lines import LineReader
from llmbench.bench.hardware import command_line
from llmbench.bench.repeat_parts import Part, merge_parts, read_part
from llmbench.bench.run_record import DIED, DIED_ERROR
from llmbench.bench.scenario.loader import ResolvedScenario
from llmbench.bench.store import RunWriter
from llmbench.interrupts import is_interrupted_exit

if TYPE_CHECKING:
    from llmbench.bench.runner import RunEvents, RunOutcome, RunRequest

PARTS = "parts"  # in the run's working folder: the repeats' own run folders until they are merged


class RepeatFailed(RunFailed):
    """A repeat's process failed before it measured anything, and no repeat before it was measured: its
    error is the run's, and so is its exit status (a bad value found at start-up is the user's)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def child_command(
    resolved: ResolvedScenario, variant: str, slow_factor: float, repeat: int, run_dir: Path, events: Path
) -> list[str]:
    cmd = [sys.executable, "-m", "llmbench", "run", str(resolved.path), "--quiet"]
    for s in resolved.overrides:
        cmd += ["--set", s]
    return cmd + [
        "--profile", resolved.profile.name or "none", "--variant", variant,
        "--slow-step-factor", repr(slow_factor), "--run-dir", str(run_dir), "--repeat-index", str(repeat),
        "--events-file", str(events),
    ]  # fmt: skip


class _SaidOnce:
    """The run's events, each message said once however many repeats' processes say it."""

    def __init__(self, events: RunEvents) -> None:
        self.events = events
        self.told: set[str] = set()

    def message(self, level: str, text: str) -> None:
        if text not in self.told:
            self.told.add(text)
            self.events.message(level, text)

    def phase(self, text: str) -> None:
        self.events.phase(text)

    def progress(self, label: str, repeat: int, progress: Any) -> None:
        self.events.progress(label, repeat, progress)


def _said(stderr: str) -> str:
    """What a child's stderr says went wrong, without the ``error:`` its own CLI put before it."""
    return "\n".join(line.removeprefix("error: ") for line in child_error(stderr, lines=12).splitlines())


def execute_in_processes(req: RunRequest, events: RunEvents) -> RunOutcome:
    """Measure and store one run (a ``runner.RunRequest``), each repeat in a process of its own (see the
    module docstring); returns a ``runner.RunOutcome`` as ``execute_run`` does."""
    from llmbench.bench.runner import RunOutcome, preflight

    resolved = req.resolved
    scenario = resolved.scenario
    preflight(resolved, make_backend(scenario))  # bad input is an error before any cost, as in one process
    writer = RunWriter(req.out_root, scenario.name, req.variant, req.run_dir)
    parts_dir = writer.tmp / PARTS
    parts_dir.mkdir()
    env = package_env()
    own = {"command_line": command_line(), "pid": os.getpid()}
    said = _SaidOnce(events)
    parts: list[Part] = []
    stop_reason: str | None = None
    error: str | None = None
    code, stderr = 0, ""
    try:
        for r in range(scenario.repeats):
            events.phase(f"repeat {r + 1}/{scenario.repeats}, in a process of its own")
            run_dir, log = parts_dir / f"r{r}", parts_dir / f"r{r}.events"
            reader = LineReader(log)
            cmd = child_command(resolved, req.variant, req.slow_factor, r, run_dir, log)
            try:
                result = run_child(cmd, env, while_running=lambda reader=reader: reader.forward(said))
            finally:
                if (part := read_part(run_dir)) is not None:
                    parts.append(part)
            code, stderr = (1, result.stderr) if isinstance(result, ChildTimeout) else result
            if part is not None and part.meta.get("status") == "complete":
                if r < scenario.repeats - 1:
                    writer.checkpoint(*merge_parts(parts, DIED, DIED_ERROR, own))
                continue
            if is_interrupted_exit(code) or (
                part is not None and part.meta.get("stop_reason") == "interrupted"
            ):
                raise KeyboardInterrupt
            stop_reason = "failed"
            error = (part.meta.get("error") if part is not None else None) or _said(stderr)
            break
    except KeyboardInterrupt:
        stop_reason, error = "interrupted", None
    whole = [p for p in parts if p.meta.get("status") == "complete"]
    if (
        stop_reason == "interrupted" and len(whole) == scenario.repeats
    ):  # the interrupt came as the last ended
        stop_reason = None
    if not parts:
        writer.discard()
        if stop_reason == "interrupted":
            raise KeyboardInterrupt
        raise RepeatFailed(_said(stderr), code if code > 0 else 1)  # < 0: the child died of a signal
    meta, summary, tables = merge_parts(parts, stop_reason, error, own)
    shutil.rmtree(parts_dir, ignore_errors=True)  # merged: every repeat's figures and tables are in the run
    run_dir = writer.finish(meta, summary, tables)
    if stop_reason == "failed":
        last = (error or "").strip().splitlines() or ["(no message)"]
        raise RunFailed(f"the run failed; what was measured is kept in {run_dir}:\n{last[-1]}", str(run_dir))
    return RunOutcome(run_dir, meta["status"], stop_reason, meta, summary, frozenset(said.told))
