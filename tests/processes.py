"""Starting a Python child the way a terminal would, for tests that interrupt it.

A process started with SIGINT ignored keeps it ignored, and so does everything it starts: a shell script
that runs the tests as a background job starts them so. A test that sends SIGINT to a child, as Ctrl-C
would, starts it through ``interruptible`` so that the child hears it wherever the tests run.
"""

from __future__ import annotations

import sys

_BOOT = """
import runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
target, sys.argv = sys.argv[1], sys.argv[1:]
if target == "-m":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(target, run_name="__main__")
"""


def interruptible(*args: str) -> list[str]:
    """``[python, *args]`` (``-m module ...`` or ``script ...``) with SIGINT turned into KeyboardInterrupt."""
    return [sys.executable, "-c", _BOOT, *args]
