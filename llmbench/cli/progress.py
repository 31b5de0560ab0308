"""Live feedback while a run is measured: a transient Rich progress bar on a terminal, phase lines elsewhere.

Implements the bench layer's ``RunEvents``; the driver calls ``progress`` at most every 0.1 s.
"""

from __future__ import annotations

import math
from types import TracebackType

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from llmbench.bench.driver import Progress as DriveProgress
from llmbench.cli.console import err_console, note, warning


class RichRunEvents:
    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.live = err_console.is_terminal and not quiet
        self._progress: Progress | None = None
        self._task: int | None = None
        self._key: tuple[str, int] | None = None

    def __enter__(self) -> RichRunEvents:
        if self.live:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                console=err_console,
                transient=True,
            )
            self._progress.start()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def message(self, level: str, text: str) -> None:
        if level == "warning":
            warning(text)
        elif not self.quiet:
            note(text)

    def phase(self, text: str) -> None:
        if self._progress is None:
            if not self.quiet:
                note(f"· {text}")
            return
        if self._task is not None:  # a new phase: the last one's bar is done with
            self._progress.remove_task(self._task)
            self._task = self._key = None
        self._progress.console.print(f"[dim]· {escape(text)}[/]", highlight=False)

    def progress(self, label: str, repeat: int, p: DriveProgress) -> None:
        if self._progress is None:
            return
        tok_s = p.output_tokens / p.elapsed if p.elapsed > 0 else 0.0
        kv = f", KV {p.kv_usage:.0%}" if not math.isnan(p.kv_usage) else ""
        fields = {"rate": f"{tok_s:,.0f} tok/s, {p.running} running{kv}"}
        key = (label, repeat)
        if key != self._key:
            if self._task is not None:
                self._progress.remove_task(self._task)
            self._task = self._progress.add_task(f"{label} r{repeat}", total=p.total, **fields)
            self._key = key
        self._progress.update(self._task, completed=p.done, **fields)
