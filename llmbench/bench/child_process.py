"""A child process that measures (a variant of an ablation or a profile, a repeat of a run), run to its end.

The child is ``python -m llmbench ...`` with ``lifeline.child_env`` (it ends with its parent). Its stderr
goes to a temporary file, not a pipe, so that a child that says much (a compiler's warnings) never blocks
on a pipe no one reads while the parent is busy showing its progress (``while_running``, called every
tenth of a second). On Ctrl-C the child (same process group) gets it too and is given time to write what it
measured before the interrupt goes on; past ``timeout_s`` it is interrupted the same way, then killed if it
does not end within the grace period (a child stuck inside a native call never sees the interrupt); a
further interrupt meanwhile is held until then.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from llmbench.interrupts import held_interrupts
from llmbench.lifeline import child_env

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # so children import this same llmbench
CHILD_GRACE_S = 60.0  # after Ctrl-C, how long a child may take to write what it measured
POLL_S = 0.1


def package_env() -> dict[str, str]:
    """This process's environment with this llmbench first on the path: a child runs the same code."""
    path = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


class ChildTimeout(NamedTuple):
    seconds: float
    stderr: str


def _wait(proc: subprocess.Popen[bytes], until: float | None, while_running: Callable[[], None]) -> bool:
    """Whether the child ended before ``until`` (a monotonic time; None: whenever it ends)."""
    while proc.poll() is None:
        if until is not None and time.monotonic() >= until:
            return False
        while_running()
        time.sleep(POLL_S)
    while_running()
    return True


def run_child(
    cmd: list[str],
    env: dict[str, str],
    timeout_s: float | None = None,
    while_running: Callable[[], None] = lambda: None,
) -> tuple[int, str] | ChildTimeout:
    """Exit status and stderr of one child (see the module docstring)."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=child_env(env))

        def said() -> str:
            err.seek(0)
            return err.read().decode(errors="replace")

        try:
            until = None if timeout_s is None else time.monotonic() + timeout_s
            if not _wait(proc, until, while_running):
                proc.send_signal(signal.SIGINT)
                grace = min(CHILD_GRACE_S, max(5.0, 0.25 * (timeout_s or 0)))
                if not _wait(proc, time.monotonic() + grace, while_running):
                    proc.kill()
                    proc.wait()
                return ChildTimeout(timeout_s or 0.0, said())
        except KeyboardInterrupt:
            # A second Ctrl-C waits for the child to write what it measured (it holds one itself while it
            # writes): cut short here, the child would be killed mid-write or its folder read half-written.
            with held_interrupts():
                try:  # a Ctrl-C reached the child too; a SIGTERM sent to this process alone did not
                    proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGINT)
                if not _wait(proc, time.monotonic() + CHILD_GRACE_S, while_running):
                    proc.kill()
                    proc.wait()
            raise
        return proc.returncode, said()


_NATIVE_FRAME = re.compile(r"^\s*frame #\d+: ")  # a C++ backtrace's lines (c10::Error, an abort)


def child_error(text: str, lines: int = 6) -> str:
    """What a failed child said last: its last lines, a native backtrace's frames left out (a crash in
    torch's C++ ends with dozens of them after the message that says what went wrong)."""
    kept = [ln for ln in text.strip().splitlines() if ln.strip() and not _NATIVE_FRAME.match(ln)]
    return "\n".join(kept[-lines:]) or "(no output)"
