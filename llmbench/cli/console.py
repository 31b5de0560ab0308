"""The one pair of Rich consoles every command prints through: results to stdout, messages to stderr.

Both resolve ``sys.stdout``/``sys.stderr`` when they write, so tests that capture those see the output.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

console = Console()
err_console = Console(stderr=True)


def error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)


def warning(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True, highlight=False)


def note(message: str) -> None:
    err_console.print(f"[dim]{escape(message)}[/]", soft_wrap=True, highlight=False)
