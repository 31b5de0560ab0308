"""Where an ablation's (or a profile's) runs lie, and the same runs found twice.

An ablation is known by its folder, not by its name: the name is a time stamp (``<YYYYmmdd-HHMMSS>-ablate``)
that two ablations started in the same second into different ``--out`` folders share, and that a copy of
an ablation (a backup, results synced from another machine) keeps. ``home`` is the folder holding an
ablation's runs: ``<ablation>/<variant>-r<k>/`` for ``llmbench ablate``, ``<profile>/<variant>/run/`` for
``llmbench profile``. ``Copies`` reads each run of an ablation once: a run whose meta.json and summary.json
hold what a run read before holds (a copied folder) is left out, and a problem names both folders (both
run folders, when one run was copied).
Standalone runs are never left out: each is a group of its own, so a copy of one pools nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from llmbench.bench.report.kept import is_text
from llmbench.bench.store import Problem, Run

PROFILE_RUN = "run"  # the name of the run folder inside each variant folder of a profile


def home(run: Run) -> Path:
    """The folder holding the runs of the ablation or profile ``run`` belongs to; its own for a standalone
    run."""
    if not is_text(run.meta.get("ablation")):
        return run.path
    return run.path.parent.parent if run.path.name == PROFILE_RUN else run.path.parent


def written_where_made(run: Run) -> bool:
    """Whether ``run`` lies where llmbench writes one: ``<scenario>/<ablation>/...`` (a copy renamed or put
    elsewhere does not), which tells the original of two copies from the other."""
    if not is_text(run.meta.get("ablation")):
        return True  # a standalone run: never a copy's original or its copy
    folder = home(run)
    return folder.name == run.meta.get("ablation") and folder.parent.name == run.meta.get("scenario_name")


class Copies:
    """The runs of ablations read so far, by their content."""

    def __init__(self) -> None:
        self._first: dict[str, Run] = {}
        self._found: dict[tuple[Path, Path], list[tuple[Run, Run]]] = {}  # (copy, first) homes -> runs

    def read_before(self, run: Run) -> bool:
        """Whether ``run`` (as found, before its values are checked) copies a run of an ablation read
        before; the first time a run is seen it is remembered."""
        ablation = run.meta.get("ablation")
        if not is_text(ablation):
            return False
        text = json.dumps([run.meta, run.summary], sort_keys=True, default=str)
        first = self._first.setdefault(hashlib.sha256(text.encode()).hexdigest(), run)
        if first is run:
            return False
        self._found.setdefault((home(run), home(first)), []).append((run, first))
        return True

    def problems(self) -> list[Problem]:
        """One per folder holding copies (per run folder, for a run copied alone): what it copies."""
        out = []
        for (copy, first), pairs in self._found.items():
            if len(pairs) == 1 or copy == first:  # a run folder copied alone, or inside its own ablation
                out += [_copied(r.path, f.path, "run", r) for r, f in pairs]
            else:
                out.append(_copied(copy, first, f"{len(pairs)} runs", pairs[0][0]))
        return out


def _copied(copy: Path, first: Path, what: str, run: Run) -> Problem:
    return Problem(
        copy, f"a copy of {first} (the same {what} of {run.meta['ablation']}): read once, from there"
    )
