"""What an ablation's own record says of how it went, as lines under its tables.

``ablation.json`` (bench/ablation/execute.py) keeps what the runs cannot: a variant that failed before it
wrote a run (it has no column to carry a mark), one stopped at ``--timeout`` (its run says only that it
was interrupted), and an ablation stopped before its last repeat (its runs look like a shorter plan that
finished). ``ablation_notes`` says each, for the ablation folders holding the runs of a table. A record
that cannot be read, or fields of the wrong type, give no line here: side_file_problems names the file.
"""

from __future__ import annotations

from typing import Any

from llmbench.bench.report.frame import ABLATION_FILE, Group
from llmbench.bench.report.kept import is_int, is_text, read_object

TIMED_OUT = "timed out"  # how execute.py's error for a variant stopped at --timeout begins


def ablation_notes(groups: list[Group]) -> list[str]:
    """One line per failed or timed-out variant and per interrupted ablation among the ablation folders
    holding these groups' runs, led by the folder's name when the runs come from several."""
    folders = sorted({run.path.parent for g in groups for run in g.runs if g.recorded_ablation is not None})
    records = [(f, record) for f in folders if (record := read_object(f / ABLATION_FILE)[0]) is not None]
    lead = len(records) > 1
    return [f"ablation {f.name}: {line}" if lead else line for f, record in records for line in _said(record)]


def _variants(record: dict[str, Any]) -> list[dict[str, Any]]:
    variants = record.get("variants")
    return [v for v in variants if isinstance(v, dict)] if isinstance(variants, list) else []


def _said(record: dict[str, Any]) -> list[str]:
    lines = []
    for v in _variants(record):
        if v.get("status") != "failed":
            continue
        name = v.get("name") if is_text(v.get("name")) else "?"
        error = _last_error(v.get("error"))
        if error.startswith(TIMED_OUT):
            lines.append(f"variant {name} {error}")
        else:
            lines.append(f"variant {name} failed: {error or 'no error was recorded'}")
    if record.get("status") == "interrupted":
        lines.append(f"{_planned(record)}, ran {_ran(record)} (interrupted); what was measured is shown")
    return lines


def _last_error(error: Any) -> str:
    """The line of a failed variant's recorded stderr that says what went wrong: its last ``error:`` line
    (llmbench's own message), else its last line (a Python exception's)."""
    if not is_text(error):
        return ""
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("error:")]
    return (said or lines or [""])[-1].removeprefix("error:").strip()


def _planned(record: dict[str, Any]) -> str:
    repeats, until = record.get("repeats"), record.get("until_ci")
    most = until.get("max_repeats") if isinstance(until, dict) else None
    if not is_int(repeats):
        return "planned an unknown number of repeats"
    if is_int(most) and most > repeats:
        return f"planned {repeats} to {most} repeats (--until-ci)"
    return f"planned {repeats} repeat{'s' if repeats != 1 else ''}"


def _ran(record: dict[str, Any]) -> str:
    """The repeats in which some variant started (a repeat left with every variant failed ran nothing); in
    a record of an older llmbench, which kept no order, the most run folders a variant lists."""
    order = record.get("order")
    if isinstance(order, list):
        return str(sum(1 for started in order if started))
    ran = record.get("repeats_run")
    if is_int(ran):
        return str(ran)
    runs = [len(v["runs"]) for v in _variants(record) if isinstance(v.get("runs"), list)]
    return str(max(runs)) if runs else "an unknown number"
