"""A run whose repeats each run in a process of their own: ``llmbench run``'s way with two or more repeats.

Why: the repeats of one process share its load, its compile and graph capture, its allocator and its
stretch of time, so their spread leaves out what differs from one process to the next (a GPU holding
another clock, memory placed otherwise). Intervals over such repeats are too narrow for a verdict on two
runs; over repeats in processes of their own they hold that difference too, as an ablation's do.

How: this process checks the scenario against its backend before any cost (as a run in one process does:
a bad value is the same error, at once) and opens the run's working folder. It writes the scenario as it
resolved it (overrides and profile applied, paths absolute) there, and for each repeat r starts ``python -m
llmbench run <working folder>/parts/scenario.yaml --profile none --repeat-index r --run-dir <working
folder>/parts/r<r>``: every repeat runs that one scenario, whatever happens to the user's files meanwhile.
It shows the child's progress and warnings as they come (``event_lines.py``), and then writes every repeat
measured so far as the run's checkpoint (``repeat_parts.py`` merges them). A repeat whose process ran other
code, libraries or model than the first's (files changed under the run) is left out and stops the run.
Each repeat runs every sweep point in turn, a sweep's rates from that repeat's own throughput point (as in
an ablation). A Ctrl-C reaches the child too: it keeps what it measured and the run is written, marked
incomplete. A child that fails: with no repeat measured its error is the run's, with its exit status;
otherwise the run keeps the repeats measured, marked failed, and says which repeat failed and why (a
process killed by a signal names it).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from llmbench.bench.backends import make_backend
from llmbench.bench.child_process import ChildTimeout, child_error, package_env, run_child
from llmbench.bench.errors import RunFailed
from llmbench.bench.event_lines import LineReader
from llmbench.bench.hardware import command_line
from llmbench.bench.repeat_parts import Part, merge_parts, read_part
from llmbench.bench.run_record import DIED, DIED_ERROR
from llmbench.bench.scenario.loader import scenario_settings
from llmbench.bench.store import RunWriter
from llmbench.interrupts import held_interrupts, is_interrupted_exit

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
    scenario_file: Path, variant: str, slow_factor: float, repeat: int, run_dir: Path, events: Path
) -> list[str]:
    """A repeat's process: the scenario as this process resolved it (overrides and profile applied), so
    that every repeat runs the same scenario whatever happens to its files meanwhile."""
    return [
        sys.executable, "-m", "llmbench", "run", str(scenario_file), "--quiet", "--profile", "none",
        "--variant", variant, "--slow-step-factor", repr(slow_factor), "--run-dir", str(run_dir),
        "--repeat-index", str(repeat), "--events-file", str(events),
    ]  # fmt: skip


def _other_code(part: Part, first: Part) -> str | None:
    """How a repeat's process differed from the first's in what it ran (llmbench's code, the libraries,
    the model), which no repeats of one run may; None when alike."""
    for key, what in (("git", "llmbench's code"), ("versions", "the libraries"), ("model_info", "the model")):
        if part.meta.get(key) != first.meta.get(key):
            return (
                f"it ran other {what} than repeat {first.meta.get('repeat_index', 0) + 1} ({key} in meta.json: "
                f"{part.meta.get(key)!r}, not {first.meta.get(key)!r}): files changed while the run went on"
            )
    return None


def _died(code: int, stderr: str) -> str:
    """Why a repeat's process ended without a word of its own: the signal that killed it."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = f"its process was killed by {name} (signal {-code})"
        if -code == signal.SIGKILL:
            why += ": out of memory, or killed by hand"
        return why
    return _said(stderr) if stderr.strip() else f"its process ended with exit status {code} and said nothing"


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
    scenario_file = parts_dir / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump(scenario_settings(scenario), sort_keys=False))
    env = package_env()
    own = {
        "command_line": command_line(),
        "pid": os.getpid(),
        "scenario_path": str(resolved.path),
        "overrides": list(resolved.overrides),
        "profile": resolved.profile._asdict(),
    }
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
            cmd = child_command(scenario_file, req.variant, req.slow_factor, r, run_dir, log)
            try:
                result = run_child(cmd, env, while_running=lambda reader=reader: reader.forward(said))
            finally:
                if (part := read_part(run_dir)) is not None:
                    parts.append(part)
            code, stderr = (1, result.stderr) if isinstance(result, ChildTimeout) else result
            if part is not None and (other := _other_code(part, parts[0])):
                parts.pop()  # not a repeat of this run's: left out, and the run stops
                stop_reason, error = "failed", f"repeat {r + 1} of {scenario.repeats}: {other}"
                break
            if part is not None and part.meta.get("status") == "complete":
                if r < scenario.repeats - 1:
                    writer.checkpoint(*merge_parts(parts, DIED, DIED_ERROR, own, req.slow_factor))
                continue
            if is_interrupted_exit(code) or (
                part is not None and part.meta.get("stop_reason") == "interrupted"
            ):
                raise KeyboardInterrupt
            stop_reason = "failed"
            said_error = (part.meta.get("error") if part is not None else None) or _died(code, stderr)
            error = f"repeat {r + 1} of {scenario.repeats}: {said_error}"
            break
    except KeyboardInterrupt:
        stop_reason, error = "interrupted", None
    interrupted = stop_reason == "interrupted"
    whole = [p for p in parts if p.meta.get("status") == "complete"]
    if interrupted and len(whole) == scenario.repeats:  # it came as the last repeat ended: the run is whole
        stop_reason = None
    if not parts:
        writer.discard()
        if stop_reason == "interrupted":
            raise KeyboardInterrupt
        raise RepeatFailed(_died(code, stderr), code if code > 0 else 1)  # < 0: the child died of a signal
    with held_interrupts():  # what was measured is written whole, an interrupt meanwhile held till then
        meta, summary, tables = merge_parts(parts, stop_reason, error, own, req.slow_factor)
        # merged: every repeat's figures and tables are in the run
        shutil.rmtree(parts_dir, ignore_errors=True)
        run_dir = writer.finish(meta, summary, tables)
    if stop_reason == "failed":
        last = (error or "").strip().splitlines() or ["(no message)"]
        raise RunFailed(f"the run failed; what was measured is kept in {run_dir}:\n{last[-1]}", str(run_dir))
    if interrupted and stop_reason is None:  # written whole, but the command was interrupted: it says so
        raise KeyboardInterrupt
    return RunOutcome(run_dir, meta["status"], stop_reason, meta, summary, frozenset(said.told))
