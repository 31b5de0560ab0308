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
