"""The one pair of Rich consoles every command prints through: results to stdout, messages to stderr.

Both resolve ``sys.stdout``/``sys.stderr`` when they write, so tests that capture those see the output.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.markup import escape


def _width() -> int | None:
    """Rich's own choice on a terminal; piped into a file or a log it would assume 80 columns and cut
    numbers short ("11,8…"), so tables get room there instead (COLUMNS still decides when set)."""
    return None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200


console = Console(width=_width())
err_console = Console(stderr=True)


def error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)


def warning(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True, highlight=False)


def note(message: str) -> None:
    err_console.print(f"[dim]{escape(message)}[/]", soft_wrap=True, highlight=False)
