"""The quality rows of an ablation (``quality.json``, written by ``ablate --quality``) as a report view.

One row per variant against the baseline: mean KL with its 95% interval over prompts, p99 KL, top-1
agreement, how many greedy outputs stayed identical and where the first of the others left the
baseline's, and perplexity on the text given, when one was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmbench.bench.report.format import DASH
from llmbench.bench.report.frame import Group
from llmbench.bench.report.views import View

QUALITY_FILE = "quality.json"
QUALITY_WORK = "quality"  # the folder ``ablate --quality`` works in, made before anything is measured


def quality_record(groups: list[Group]) -> dict[str, Any] | None:
    """The quality.json of the ablation folder holding these groups' runs, if there is one; a record with
    status "unrecorded" where quality was asked for but stopped before it wrote one."""
    for folder in {run.path.parent for g in groups for run in g.runs}:
        path = Path(folder) / QUALITY_FILE
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError):
                return None
        if (Path(folder) / QUALITY_WORK).is_dir():
            return {"status": "unrecorded", "variants": []}
    return None


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return DASH
    v = float(value)
    return f"{v:.{digits}g}" if v else "0"


def _pct(value: Any) -> str:
    return DASH if value is None else f"{float(value) * 100:.1f}%"


def _divergence(entry: dict[str, Any]) -> str:
    n, same = entry["greedy_prompts"], entry["greedy_identical"]
    if same == n:
        return f"{n}/{n} identical"
    return f"{same}/{n} identical; first at {entry['first_divergence_min']}, median {entry['first_divergence_median']:g}"


def quality_views(scenario: str, groups: list[Group]) -> list[View]:
    record = quality_record(groups)
    if record is None:
        return []
    headers = ["variant", "KL mean", "95% CI", "KL p99", "top-1 agreement", "greedy outputs", "perplexity"]
    if record.get("status") == "unrecorded":
        row = ["–", "not recorded: the quality run stopped before its first variant's rows"] + [""] * 5
        return [View(f"{scenario}: outputs against the baseline (--quality)", headers, [row], [False] * 7)]
    rows = []
    for entry in record["variants"]:
        if entry["status"] == "interrupted":
            rows.append(
                [entry["name"], "not measured: the quality run was stopped first", "", "", "", "", ""]
            )
            continue
        if entry["status"] != "ok":
            first = (entry.get("error") or "failed").splitlines()[0]
            rows.append([entry["name"], f"failed: {first}", "", "", "", "", ""])
            continue
        low, high = entry["kl_mean_ci"]
        ppl = DASH
        if entry.get("perplexity") is not None:
            ppl = f"{_num(entry['perplexity_baseline'], 5)} -> {_num(entry['perplexity'], 5)}"
        rows.append([
            entry["name"], _num(entry["kl_mean"]), f"{_num(low)} … {_num(high)}", _num(entry["kl_p99"]),
            _pct(entry["top1_agreement"]), _divergence(entry), ppl,
        ])  # fmt: skip
    settings = record["settings"]
    title = (
        f"{scenario}: outputs against {record['baseline']} ({settings['prompts']} prompts x {settings['tokens']} "
        f"tokens, {record['method']})"
    )
    if record.get("status") == "interrupted":
        title += ". Interrupted: the rows it reached"
    if record.get("note"):
        title += f". Note: {record['note']}"
    return [View(title, headers, rows, [False, True, True, True, True, False, True])]
