"""Whether the process that wrote a "running" record (a run's checkpoint, ablation.json, profile.json) is
still at work, or its process id now names some other process.

A killed run's id is soon given to another process (after a reboot, or in a container, a small one very
likely is), and ``kill(pid, 0)`` alone would read that one as the writer, hiding what the run kept. Where
``/proc`` tells of the process, it is taken for the writer only when it is a Python or llmbench process
that started no later than the record was last written: a process given the id after the writer died
started after its last write. Where ``/proc`` is missing (macOS), or does not answer, a live id is trusted.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
# /proc's boot time is whole seconds and a process's start is in clock ticks: allow for both roundings.
START_SLACK_S = 2.0


def still_writing(pid: int, record: Path | None = None) -> bool:
    """Whether process ``pid`` on this machine is alive and may be the one that wrote ``record``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it may be the writer
        pass
    except (OverflowError, ValueError):  # not a process id at all (a hand-edited record)
        return False
    if not _llmbench_like(pid):
        return False
    started = _start_time(pid)
    if started is None or record is None:
        return True
    try:
        written = record.stat().st_mtime
    except OSError:
        return True
    return started <= written + START_SLACK_S


def _llmbench_like(pid: int) -> bool:
    """Whether the command line of ``pid`` is Python's or llmbench's (True when it cannot be read)."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    names = [Path(a.decode(errors="replace")).name.lower() for a in argv if a]
    if not names:  # a kernel thread or a zombie: no command line to judge by
        return True
    return any("python" in n or "llmbench" in n for n in names)


def _start_time(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the epoch, from /proc (None where it cannot be read)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in (PROC / "stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        # Field 22 is the start in clock ticks after boot; the name before it, in (), may hold spaces.
        ticks = float(stat.rsplit(")", 1)[1].split()[19])
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None
