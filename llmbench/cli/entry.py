"""The ``llmbench`` command's entry point: its signals and its exit.

Ctrl-C and SIGTERM are an interrupt from the first moment, before the command line's modules load (about a
quarter of a second), so that an early one prints no traceback; once the command is over they are ignored,
so that one arriving while it leaves cannot either.
"""

from __future__ import annotations

import os
import signal
import stat
import sys

from llmbench.interrupts import handle_interrupts, interrupted_exit
from llmbench.lifeline import follow_parent


def main() -> None:
    # SIGTERM (a timeout, a batch scheduler, docker stop) is handled as Ctrl-C is: what was measured so far
    # is written and marked incomplete; the exit status names the signal (130 or 143)
    handle_interrupts()
    follow_parent()  # a variant's run under ``ablate`` or ``profile`` ends with them
    try:
        from llmbench.cli.app import app
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        raise SystemExit(interrupted_exit()) from None
    piped = _is_pipe()
    try:
        app()
    except SystemExit as done:
        # The command is over, its message written: a signal now (torchrun stopping the other ranks once
        # one has failed, a second Ctrl-C) must not turn its exit into a traceback.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if (code := _closed_pipe(done.code, piped)) is not None:
            raise SystemExit(code) from None
        if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
            # Under torchrun, once everything is written: leave without the interpreter's teardown, in
            # which torch.distributed's objects aborted the process about one time in ten (CPU, gloo,
            # torch 2.13), turning a finished run into a failure. Ranks > 0 never get here.
            sys.stdout.flush()
            sys.stderr.flush()
            code = done.code
            os._exit(code if isinstance(code, int) else (0 if code is None else 1))
        raise


def _is_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):  # a stdout replaced by an object with no file behind it
        return False


def _silenced() -> bool:
    """Whether stdout was pointed at the null device: Rich does that when its reader leaves, then exits 1."""
    try:
        here, null = os.fstat(sys.stdout.fileno()), os.stat(os.devnull)
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISCHR(here.st_mode) and here.st_rdev == null.st_rdev


def _closed_pipe(code: object, piped: bool) -> int | None:
    """The quiet exit of a command whose stdout's reader left (``llmbench ... | head``), or None. Where the
    command's own handler did not see it (its help, Click or Rich saw it first and exit 1) it is said
    here; what is still buffered is flushed now, so that the interpreter's own flush cannot fail with a
    message as it exits."""
    from click.utils import PacifyFlushWrapper

    from llmbench.cli.errors import EXIT_CLOSED_PIPE, quiet_exit, stdout_gone

    if code == 1 and piped and _silenced():
        return EXIT_CLOSED_PIPE
    if code == 1 and isinstance(sys.stdout, PacifyFlushWrapper) and stdout_gone():
        return quiet_exit()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        if stdout_gone():
            return quiet_exit()
        raise
    return None
