"""A run's request, step and telemetry tables read for a report: a damaged one is named, never fatal.

Every figure a report shows comes from summary.json; the ``.parquet`` tables only feed a few parts of it
(``USES``). One that cannot be read (a partial copy, a full disk) takes away those parts alone: ``read``
gives an empty table and the reason, and ``probe`` finds such files before anything is rendered (it reads
their footers only), so that every format warns of them at once. A missing table is not damage: result
folders kept for the docs hold summaries only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from llmbench.bench.errors import StoreError
from llmbench.bench.store import TABLES, Run

# What a report draws from each table: what is marked unavailable when it cannot be read.
USES = {
    "requests": "the output comparison and the latency CDFs",
    "steps": "the decode-step plot",
    "telemetry": "the telemetry plot",
}
_SOURCE = re.compile(r"^Could not open Parquet input source '[^']*': ")  # pyarrow repeats the path


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return _SOURCE.sub("", text).split(". Either")[0]  # the cause, not pyarrow's guesses at it


def damage(path: Path, why: str) -> str:
    """A damaged table in a warning's words: what it is, why, and what is not shown for it."""
    name = path.name.removesuffix(".parquet")
    return f"unreadable ({why}); not shown for it: {USES.get(name, 'what it holds')}"


def read(run: Run, name: str) -> tuple[pd.DataFrame, str | None]:
    """One of the run's tables (empty when it is not kept), or an empty one and why it is unreadable."""
    try:
        return run.table(name), None
    except StoreError as exc:  # raised from pyarrow's own error, which says why
        return pd.DataFrame(), _why(exc.__cause__ or exc)


def probe(run: Run) -> dict[Path, str]:
    """The run's tables whose footer cannot be read (a truncated or foreign file), with why."""
    import pyarrow.parquet as pq

    out = {}
    for name in TABLES:
        path = run.path / f"{name}.parquet"
        if not path.exists():
            continue
        try:
            pq.read_metadata(path)
        except Exception as exc:
            out[path] = _why(exc)
    return out
