"""Generated tokens of a variant compared with the baseline's, request by request (greedy runs).

Requests are matched by (repeat, request id): the same prompt in the same repeat. For each variant and
sweep point: how many requests were compared, how many produced exactly the same token ids, and, over the
requests that differ, the mean position of the first token that differs (1 = the first generated token),
and the fraction of all generated tokens that agree up to each request's first divergence. In bf16 a
variant that reorders a reduction diverges late and keeps most tokens; a wrong kernel diverges at once.

An ablation writes these figures to ``comparison.json`` in its folder, so that a report still has them
when the request tables are not kept (result folders kept for the docs hold summaries only). A request
table that lacks the columns this needs (``COMPARED``: slimmed by hand, or a foreign file) counts, for the
comparison, as one that cannot be read: ``table_gaps`` names it, and the outputs are compared from
``comparison.json``, or not at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from llmbench.bench.report.compare import workload_differences
from llmbench.bench.report.frame import Group
from llmbench.bench.report.kept import finite, is_int, read_object, show
from llmbench.bench.store import Problem

COMPARISON_FILE = "comparison.json"
COMPARED = ("point", "repeat", "request_id", "token_ids")  # the request table's columns compared here


class OutputComparison(NamedTuple):
    compared: int  # requests present in both
    identical: int  # exactly the same token ids
    mean_first_divergence: float  # 1-based position of the first differing token, mean over those differing
    agreement: float  # tokens equal before each request's first divergence / all tokens generated
    cut_short: int = 0  # requests in both left out: on one side or both they did not finish (an interrupt)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """0-based index of the first position where the two differ (a shorter one ends there), or None."""
    x, y = np.asarray(a), np.asarray(b)
    n = min(x.size, y.size)
    differ = np.flatnonzero(x[:n] != y[:n])
    if differ.size:
        return int(differ[0])
    return None if x.size == y.size else n


def compare_tokens(base: list[Sequence[int]], new: list[Sequence[int]]) -> OutputComparison:
    """Per-request token lists, ``base[i]`` against ``new[i]``."""
    agree = total = 0
    firsts = []
    for a, b in zip(base, new, strict=True):
        length = max(len(a), len(b))
        first = first_divergence(a, b)
        total += length
        if first is None:
            agree += length
        else:
            agree += first
            firsts.append(first + 1)
    return OutputComparison(
        len(base),
        len(base) - len(firsts),
        float(np.mean(firsts)) if firsts else math.nan,
        agree / total if total else math.nan,
    )


def describe(c: OutputComparison) -> str:
    """``895/900 identical · first divergence at token 38 (mean of 5) · 99.2% of tokens agree before it``."""
    text = f"{c.identical}/{c.compared} identical"
    differ = c.compared - c.identical
    if differ:
        text += (
            f" · first divergence at token {c.mean_first_divergence:.0f} (mean of {differ}) · "
            f"{c.agreement * 100:.1f}% of tokens agree before it"
        )
    if c.cut_short:
        text += f" · {c.cut_short} unfinished on a side, not compared"
    return text


def _greedy(group: Group) -> bool:
    """Temperature 0; a temperature not recorded (null: it was not finite) is not greedy."""
    sampling = (group.meta.get("scenario") or {}).get("sampling") or {}
    return sampling.get("temperature", 1.0) == 0.0


def compare_frames(a: pd.DataFrame, b: pd.DataFrame, point: str) -> OutputComparison | str:
    """Two request tables at one point, or why they cannot be compared."""
    if a.empty or b.empty or any(c not in side for c in COMPARED for side in (a, b)):
        return "n/a (requests.parquet not kept)"
    if not all(isinstance(t, Sequence | np.ndarray) for side in (a, b) for t in side["token_ids"]):
        return "n/a (token ids missing from a request table)"  # tables of other columns, pooled
    for side in (a, b):  # a server that streams text only leaves the ids empty: nothing to compare
        if "output_len" in side and any(
            len(t) == 0 and n > 0 for t, n in zip(side["token_ids"], side["output_len"], strict=True)
        ):
            return "n/a (token ids not returned)"
    keys = ["repeat", "request_id"]
    ta, tb = (side[side["point"] == point].set_index(keys) for side in (a, b))
    ta, tb = (t[~t.index.duplicated()] for t in (ta, tb))  # a request twice (a run copied, then edited)
    common = ta.index.intersection(tb.index)
    if len(common) == 0:
        return "n/a (no common requests)"
    # A request an interrupt (or a failure) cut short has fewer tokens than its twin: no divergence.
    done = [k for k in common if _finished(ta, k) and _finished(tb, k)]
    if not done:
        return "n/a (no request finished on both sides)"
    c = compare_tokens([list(ta["token_ids"][k]) for k in done], [list(tb["token_ids"][k]) for k in done])
    return c._replace(cut_short=len(common) - len(done))


def _finished(table: pd.DataFrame, key: Any) -> bool:
    """Whether the request ran to its end (its length or a stop token); tables without the column: yes."""
    return "finish_reason" not in table or table["finish_reason"][key] in ("length", "stop")


def compare_outputs(base: Group, new: Group, point: str) -> OutputComparison | str:
    """The variant's outputs against the baseline's: measured from the request tables when they are kept,
    else as its ablation recorded them; a reason when there is nothing to compare."""
    if not (_greedy(base) and _greedy(new)):
        return "n/a (sampling)"
    if not base.paired_with(new) and (diffs := workload_differences(base, new)):
        return f"n/a (the runs served different workloads: {diffs[0]}{' …' if len(diffs) > 1 else ''})"
    gap = next((f"{path} lacks {_columns(missing)}" for g in (base, new) for path, missing in _gaps(g)), None)
    measured = gap or compare_frames(base.requests(), new.requests(), point)
    if isinstance(measured, OutputComparison):
        return measured
    stored = stored_comparison(base, new, point)
    if stored is not None:
        return stored
    damaged = gap or base.unreadable("requests") or new.unreadable("requests")
    return f"n/a (not compared: {damaged})" if damaged else measured


def _gaps(group: Group) -> list[tuple[Path, list[str]]]:
    """The group's request tables that lack columns the comparison needs, with those columns (read from
    their footers; a table not kept, or that cannot be read at all, is not one: ``Group.unreadable``)."""
    import pyarrow.parquet as pq

    out = []
    for path in (r.path / "requests.parquet" for r in group.runs):
        try:
            names = pq.read_schema(path).names
        except Exception:  # not kept, or damaged (named by ``damaged_tables``)
            continue
        if missing := [c for c in COMPARED if c not in names]:
            out.append((path, missing))
    return out


def _columns(names: list[str]) -> str:
    return f"the column{'s' if len(names) > 1 else ''} {', '.join(names)}"


def table_gaps(groups: list[Group]) -> list[Problem]:
    """The request tables of greedy runs that lack columns the output comparison needs, each named once."""
    return [
        Problem(path, f"lacks {_columns(missing)} that the output comparison needs: outputs are compared "
                "from comparison.json, or not at all")
        for g in groups if _greedy(g) for path, missing in _gaps(g)
    ]  # fmt: skip


def missed(base: Group, new: Group) -> bool:
    """Whether the two greedy runs' outputs were to be compared but were not: one side kept its request
    table and the other lost it, or a table is unreadable or lacks the columns compared (results kept with
    summaries only, on both sides, were never meant to be compared)."""
    if not (_greedy(base) and _greedy(new)):
        return False
    kept = [(r.path / "requests.parquet").exists() for g in (base, new) for r in g.runs]
    lost = base.unreadable("requests") or new.unreadable("requests") or _gaps(base) or _gaps(new)
    return bool(lost) or (any(kept) and not all(kept))


def _folder(group: Group) -> Path | None:
    parents = {r.path.parent for r in group.runs}
    return parents.pop() if len(parents) == 1 else None


def stored_comparison(base: Group, new: Group, point: str) -> OutputComparison | None:
    """What the ablation holding both groups recorded for this pair, if it did."""
    folder = _folder(base)
    if folder is None or folder != _folder(new) or not base.paired_with(new):
        return None
    record, _ = read_object(folder / COMPARISON_FILE)  # unreadable: named by comparison_problems
    if record is None or record.get("baseline") != base.variant:
        return None
    for row in _rows(record):
        if row.get("variant") == new.variant and row.get("point") == point:
            if not (is_int(row.get("compared")) and is_int(row.get("identical"))):
                return None  # a row of the wrong shape, or a note ("n/a ..."): nothing stored
            return OutputComparison(
                row["compared"],
                row["identical"],
                finite(row.get("mean_first_divergence")),
                finite(row.get("agreement")),
                row["cut_short"] if is_int(row.get("cut_short")) else 0,
            )
    return None


def _rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    rows = record.get("comparisons")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def comparison_problems(record: dict[str, Any]) -> list[str]:
    """What is of the wrong type in a comparison.json (those rows are not used)."""
    rows = record.get("comparisons")
    if not isinstance(rows, list):
        return [f"'comparisons' is {show(rows)}, not a list"]
    out = []
    for k, row in enumerate(rows):
        if not isinstance(row, dict):
            out.append(f"comparisons[{k}] is {show(row)}, not an object")
        elif "note" not in row and not (is_int(row.get("compared")) and is_int(row.get("identical"))):
            out.append(f"comparisons[{k}]: compared/identical are not integers")
    return out


def ablation_comparisons(baseline: Group, others: list[Group]) -> dict[str, Any]:
    """What ``comparison.json`` holds: every variant's outputs against the baseline, per point."""
    rows = []
    for g in others:
        for point in baseline.points:
            if point not in g.points:
                continue
            c = compare_outputs(baseline, g, point)
            row: dict[str, Any] = {"variant": g.variant, "point": point}
            row.update(c._asdict() if isinstance(c, OutputComparison) else {"note": c})
            rows.append(row)
    return {"baseline": baseline.variant, "greedy": _greedy(baseline), "comparisons": rows}
