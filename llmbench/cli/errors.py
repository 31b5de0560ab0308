"""Turning exceptions into a message on stderr and an exit status, never a traceback.

Exit status: 2 for bad input (scenario, options, files, engine options, a model folder or checkpoint
that cannot be used), 1 for a run that failed, 130 after Ctrl-C and 143 after SIGTERM (``llmbench.interrupts``). ``LLMBENCH_DEBUG=1`` lets unexpected
exceptions through with their traceback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from llmbench.bench.errors import BenchError, RunFailed
from llmbench.cli.console import error
from llmbench.interrupts import interrupted_exit
from llmbench.models.errors import ModelError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_UNJUDGED = 3  # ``compare``: the data cannot support a verdict


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
        except RunFailed as exc:
            error(str(exc))
            raise typer.Exit(EXIT_FAILED) from None
        except (BenchError, ModelError) as exc:
            error(str(exc))
            raise typer.Exit(EXIT_INPUT) from None
        except KeyboardInterrupt:
            error("interrupted")
            raise typer.Exit(interrupted_exit()) from None
        except Exception as exc:
            if _is_config_error(exc):
                error(f"engine options: {exc}")
                raise typer.Exit(EXIT_INPUT) from None
            if os.environ.get("LLMBENCH_DEBUG"):
                raise
            error(f"unexpected {type(exc).__name__}: {exc} (set LLMBENCH_DEBUG=1 to see the traceback)")
            raise typer.Exit(EXIT_FAILED) from None

    return wrapper  # type: ignore[return-value]
