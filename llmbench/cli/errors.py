"""Turning exceptions into a message on stderr and an exit status, never a traceback.

Exit status: 2 for bad input (scenario, options, files, engine options, a model folder or checkpoint
that cannot be used, a report of something the runs read do not hold), 1 for a run that failed, 130 after
Ctrl-C and 143 after SIGTERM (``llmbench.interrupts``), 141 with no message when stdout's reader left
(``llmbench report ... | head``). ``LLMBENCH_DEBUG=1`` lets unexpected exceptions through with their
traceback.
"""

from __future__ import annotations

import functools
import os
import select
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from llmbench.bench.errors import BenchError, RunFailed
from llmbench.cli.console import console, error
from llmbench.interrupts import interrupted_exit
from llmbench.models.errors import ModelError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_UNJUDGED = 3  # ``compare``: the data cannot support a verdict
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE  # 141: stdout's reader left (``| head``), as a shell reports it


def stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has left (a write to it fails: EPIPE)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor behind it (a test's capture)
        return False


def quiet_exit() -> int:
    """Stop writing to a stdout nobody reads: what is still buffered goes nowhere, with no message."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_PIPE


def _is_config_error(exc: BaseException) -> bool:
    from llmbench.engine.config import ConfigError

    return isinstance(exc, ConfigError)


def handle_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except SystemExit as exc:
            if exc.code == 1 and console.quiet:  # Rich's answer to a closed stdout: it is quiet from now on
                raise typer.Exit(EXIT_CLOSED_PIPE) from None
            raise
        except RunFailed as exc:
            error(str(exc))
            raise typer.Exit(getattr(exc, "exit_code", EXIT_FAILED)) from None  # a repeat's process's own
        except (BenchError, ModelError) as exc:
            error(str(exc))
            raise typer.Exit(EXIT_INPUT) from None
        except KeyboardInterrupt:
            error("interrupted")
            raise typer.Exit(interrupted_exit()) from None
        except Exception as exc:
            if isinstance(exc, BrokenPipeError) and stdout_gone():  # not a socket's: the reader left
                raise typer.Exit(quiet_exit()) from None
            if _is_config_error(exc):
                error(f"engine options: {exc}")
                raise typer.Exit(EXIT_INPUT) from None
            if os.environ.get("LLMBENCH_DEBUG"):
                raise
            error(f"unexpected {type(exc).__name__}: {exc} (set LLMBENCH_DEBUG=1 to see the traceback)")
            raise typer.Exit(EXIT_FAILED) from None

    return wrapper  # type: ignore[return-value]
