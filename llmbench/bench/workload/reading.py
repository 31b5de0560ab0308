"""Reading workload files: UTF-8 text, JSONL, and JSON records (JSONL or one array), and the seeded draw
of records that ``num_requests`` asks for. Each problem is a :class:`WorkloadError` naming the file and
the line (or record)."""

from __future__ import annotations

import codecs
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from llmbench.bench.errors import WorkloadError


def read_text(path: Path) -> str:
    """The whole file as UTF-8 text (a leading byte-order mark dropped: spreadsheets write one). A file
    that cannot be read, or is not UTF-8, is a WorkloadError naming it, the line and the offending byte."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        line = data.count(b"\n", 0, at) + 1
        raise WorkloadError(
            f"{path}:{line}: not a UTF-8 text file (byte 0x{data[at]:02x} at position {at}); "
            "workload files are read as UTF-8"
        ) from None


def read_jsonl(path: Path, text: str | None = None) -> list[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSONL file (``text``: its text, already read)."""
    records = []
    # newline=None: lines end at \n, \r\n or \r, as a file opened in text mode reads them
    for lineno, line in enumerate(io.StringIO(read_text(path) if text is None else text, newline=None), 1):
        if not line.strip():
            continue
        try:
            records.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return records


JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


def read_records(path: Path, kind: str) -> list[tuple[str, Any]]:
    """(where, record) of a prompt file or trace in JSON (``kind`` names which): JSONL, one record a line
    (where: file:line), or, in a ``.json`` file, also one JSON array of records (where: file: record N)."""
    text = read_text(path)
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":  # more than one value (JSONL) is read line by line below
                raise WorkloadError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        else:
            if isinstance(data, list):
                return [(f"{path}: record {i}", rec) for i, rec in enumerate(data, 1)]
            if len([line for line in text.splitlines() if line.strip()]) > 1:  # not JSONL either
                raise WorkloadError(
                    f"{path}: a .json {kind} file holds one JSON array of records, or JSONL (one record a "
                    f"line); got one {type(data).__name__}"
                )
    return [(f"{path}:{lineno}", rec) for lineno, rec in read_jsonl(path, text)]


def choose(available: int, wanted: int | None, rng: np.random.Generator) -> list[int]:
    """All records in order, or ``wanted`` of them at random: shuffled passes over all of them, as many as
    it takes (a record is drawn again only once every other one has been)."""
    if wanted is None:
        return list(range(available))
    reps = -(-wanted // available)
    order = np.concatenate([rng.permutation(available) for _ in range(reps)])
    return order[:wanted].tolist()
