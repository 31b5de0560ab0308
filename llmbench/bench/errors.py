"""Errors the bench layer raises for bad input or a run that cannot go on.

Each carries a message written for the person at the terminal: what was wrong and what is allowed. The
CLI prints ``str(error)`` to stderr and exits non-zero, never a traceback.
"""

from __future__ import annotations


class BenchError(Exception):
    """Base class: a user-facing problem with a message that stands on its own."""


class ScenarioError(BenchError):
    """A scenario file (or a ``--set`` override) is unreadable or does not match the schema."""


class WorkloadError(BenchError):
    """A workload's input file is missing, malformed or holds no usable request."""


class StoreError(BenchError):
    """A result folder cannot be written, or one that is read is missing or broken."""


class RunFailed(BenchError):
    """A run stopped on an error; what it measured was kept and marked incomplete."""

    def __init__(self, message: str, run_dir: str | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


def error_headline(error: str) -> str:
    """One line of a child process's error (an ablation's or a profile's variant): its last ``error:`` line
    (what the command itself said went wrong; a warning said before it is not the error), else its last
    line (where an exception's message is)."""
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    said = [ln.removeprefix("error:").strip() for ln in lines if ln.startswith("error:")]
    return (said or lines or ["unknown error"])[-1]
