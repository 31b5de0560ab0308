"""Faults put into the child processes a command starts (a repeat's, a variant's), not into the test's own:
a ``sitecustomize`` module on the path every Python started from then on imports first."""

from __future__ import annotations

import textwrap
from pathlib import Path

PREAMBLE = (  # REPEAT: the repeat a run's child measures (``--repeat-index``), None in any other process
    "import sys\n"
    "REPEAT = int(sys.argv[sys.argv.index('--repeat-index') + 1]) if '--repeat-index' in sys.argv else None\n"
)


def in_child_processes(tmp_path: Path, monkeypatch, code: str) -> None:
    """``code`` runs as every Python started from now on starts (this process, started already, is
    untouched); it can read ``REPEAT``."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PREAMBLE + textwrap.dedent(code))
    monkeypatch.setenv("PYTHONPATH", str(hook))
