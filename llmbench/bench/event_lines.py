"""A run's events passed from the process that measures to the one that shows them, as JSON lines in a file.

A repeat measured in a process of its own (``repeat_processes.py``) writes its ``RunEvents`` (messages,
phases, progress) to a file as it goes; the run's own process reads what is new every tenth of a second and
hands it to its own events, so the user sees one progress bar and each warning once, whichever process
measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from llmbench.bench.driver import Progress


class LineEvents:
    """``RunEvents`` that append each event to ``path`` as one JSON line, flushed at once."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115  (open for the run's life)

    def _write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event) + "\n")

    def message(self, level: str, text: str) -> None:
        self._write({"message": [level, text]})

    def phase(self, text: str) -> None:
        self._write({"phase": text})

    def progress(self, label: str, repeat: int, progress: Progress) -> None:
        self._write({"progress": [label, repeat, list(progress)]})

    def close(self) -> None:
        self._file.close()


class LineReader:
    """Reads the events a :class:`LineEvents` wrote since the last call and hands them on."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0

    def forward(self, events: Any) -> None:
        """Every whole line written since the last call, to ``events`` (a ``RunEvents``); a line still being
        written waits for the next call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        whole = data[: data.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.decode().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not one of ours: nothing to show
            if "message" in event:
                events.message(*event["message"])
            elif "phase" in event:
                events.phase(event["phase"])
            elif "progress" in event:
                label, repeat, fields = event["progress"]
                events.progress(label, repeat, Progress(*fields))
