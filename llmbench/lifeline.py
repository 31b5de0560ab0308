"""A child process that ends with its parent, whatever killed the parent.

``llmbench ablate`` and ``profile`` run each variant in a child process, and the engine runs each
tensor-parallel rank in one. A parent killed outright (SIGKILL, the out-of-memory killer) tells its
children nothing: they would go on measuring, holding the GPU and writing results no one waits for. On
Linux a child asks the kernel for a signal when its parent goes (``PR_SET_PDEATHSIG``); elsewhere this
does nothing.
"""

from __future__ import annotations

import os
import signal
import sys

PARENT_ENV = "LLMBENCH_PARENT_PID"  # set by a parent in its child's environment: the parent's pid
_PR_SET_PDEATHSIG = 1


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child that should end with this process (``follow_parent`` in the child)."""
    return {**env, PARENT_ENV: str(os.getpid())}


def die_with_parent(signum: int, parent: int | None = None) -> None:
    """Have the kernel send ``signum`` to this process when its parent ends; sent at once when the parent
    (``parent``, if known) is gone already, having ended before the request took hold."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)


def follow_parent() -> None:
    """In a child started with ``child_env``: SIGTERM when the parent ends, which the command takes as an
    interrupt (what it measured is kept, marked incomplete). The variable is removed, so that this
    process's own children are tied to it, not to its parent."""
    raw = os.environ.pop(PARENT_ENV, None)
    if raw and raw.isdigit():
        die_with_parent(signal.SIGTERM, int(raw))
