"""The quality rows of an ablation (``quality.json``, written by ``ablate --quality``) as a report view.

One row per variant against the baseline: mean KL with its 95% interval over prompts, p99 KL, top-1
agreement, how many greedy outputs stayed identical and where the first of the others left the
baseline's, and perplexity on the text given, when one was. A record that cannot be read, or a figure of
the wrong type in it, is shown as such (–), and ``quality_problems`` says what is wrong for the warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmbench.bench.errors import error_headline
from llmbench.bench.report.format import DASH
from llmbench.bench.report.frame import Group
from llmbench.bench.report.kept import is_int, is_number, is_text, number, read_object, show
from llmbench.bench.report.views import View

QUALITY_FILE = "quality.json"
QUALITY_WORK = "quality"  # the folder ``ablate --quality`` works in, made before anything is measured
_FIGURES = {  # an ok variant's figures and their types (null: not measured)
    "kl_mean": is_number, "kl_p99": is_number, "top1_agreement": is_number, "greedy_prompts": is_int,
    "greedy_identical": is_int, "first_divergence_min": is_number, "first_divergence_median": is_number,
    "perplexity": is_number, "perplexity_baseline": is_number,
}  # fmt: skip


def quality_record(groups: list[Group]) -> dict[str, Any] | None:
    """The quality.json of the ablation folder holding these groups' runs, if there is one; a record with
    status "unrecorded" where quality was asked for but stopped before it wrote one, "unreadable" (with
    ``why``) where the file cannot be used."""
    for folder in {run.path.parent for g in groups for run in g.runs}:
        path = Path(folder) / QUALITY_FILE
        record, why = read_object(path)
        if why is not None:
            return {"status": "unreadable", "why": why, "variants": []}
        if record is not None:
            return record
        if (Path(folder) / QUALITY_WORK).is_dir():
            return {"status": "unrecorded", "variants": []}
    return None


def quality_problems(record: dict[str, Any]) -> list[str]:
    """What is of the wrong type in a quality record (shown as – or left out of the view)."""
    variants = record.get("variants")
    if not isinstance(variants, list):
        return [f"'variants' is {show(variants)}, not a list: no rows"]
    out = [
        f"'{k}' is {show(record.get(k))}, not a text"
        for k in ("baseline", "method")
        if not is_text(record.get(k))
    ]
    if not isinstance(record.get("settings"), dict):
        out.append(f"'settings' is {show(record.get('settings'))}, not an object")
    for k, entry in enumerate(variants):
        if not isinstance(entry, dict):
            out.append(f"variants[{k}] is {show(entry)}, not an object")
            continue
        if entry.get("status") != "ok":
            continue
        name = entry.get("name") if is_text(entry.get("name")) else f"variants[{k}]"
        bad = [
            f"{f} is {show(entry[f])}"
            for f, ok in _FIGURES.items()
            if entry.get(f) is not None and not ok(entry[f])
        ]
        ci = entry.get("kl_mean_ci")
        if ci is not None and _pair(ci) is None:
            bad.append(f"kl_mean_ci is {show(ci)}")
        if bad:
            out.append(f"{name}: {', '.join(bad)}, not a number")
    return out


def _pair(value: Any) -> tuple[float, float] | None:
    if isinstance(value, list) and len(value) == 2 and all(map(is_number, value)):
        return float(value[0]), float(value[1])
    return None


def _num(value: Any, digits: int = 3) -> str:
    v = number(value)
    if v is None:
        return DASH
    return f"{v:.{digits}g}" if v else "0"


def _pct(value: Any) -> str:
    v = number(value)
    return DASH if v is None else f"{v * 100:.1f}%"


def _divergence(entry: dict[str, Any]) -> str:
    n, same = entry.get("greedy_prompts"), entry.get("greedy_identical")
    if not (is_int(n) and is_int(same)):
        return DASH
    if same == n:
        return f"{n}/{n} identical"
    return (
        f"{same}/{n} identical; first at {_num(entry.get('first_divergence_min'), 6)}, median "
        f"{_num(entry.get('first_divergence_median'), 6)}"
    )


def _text(value: Any, default: str = "?") -> str:
    return value if is_text(value) else default


def quality_views(scenario: str, groups: list[Group]) -> list[View]:
    record = quality_record(groups)
    if record is None:
        return []
    headers = ["variant", "KL mean", "95% CI", "KL p99", "top-1 agreement", "greedy outputs", "perplexity"]
    title = f"{scenario}: outputs against the baseline (--quality)"
    if record.get("status") == "unrecorded":
        row = ["–", "not recorded: the quality run stopped before its first variant's rows"] + [""] * 5
        return [View(title, headers, [row], [False] * 7)]
    if record.get("status") == "unreadable":
        row = ["–", f"{QUALITY_FILE} unreadable: {record['why']}"] + [""] * 5
        return [View(title, headers, [row], [False] * 7)]
    rows = []
    variants = record.get("variants")
    for entry in variants if isinstance(variants, list) else []:
        if not isinstance(entry, dict):
            continue
        name = _text(entry.get("name"))
        if entry.get("status") == "interrupted":
            rows.append([name, "not measured: the quality run was stopped first", "", "", "", "", ""])
            continue
        if entry.get("status") != "ok":
            error = entry.get("error")
            rows.append(
                [name, f"failed: {error_headline(error) if is_text(error) else 'failed'}", "", "", "", "", ""]
            )
            continue
        low, high = _pair(entry.get("kl_mean_ci")) or (None, None)
        ppl = DASH
        if number(entry.get("perplexity")) is not None:
            ppl = f"{_num(entry.get('perplexity_baseline'), 5)} -> {_num(entry['perplexity'], 5)}"
        rows.append([
            name, _num(entry.get("kl_mean")), f"{_num(low)} … {_num(high)}" if low is not None else DASH,
            _num(entry.get("kl_p99")), _pct(entry.get("top1_agreement")), _divergence(entry), ppl,
        ])  # fmt: skip
    settings = record.get("settings") if isinstance(record.get("settings"), dict) else {}
    prompts = f"{_text_or_num(settings.get('prompts'))} prompts"
    entries = variants if isinstance(variants, list) else []
    used = [e["greedy_prompts"] for e in entries if isinstance(e, dict) and is_int(e.get("greedy_prompts"))]
    if used and is_int(settings.get("prompts")) and max(used) < settings["prompts"]:
        prompts = f"{max(used)} prompts ({settings['prompts']} asked; the workload has no more)"
    title = (
        f"{scenario}: outputs against {_text(record.get('baseline'))} ({prompts} x "
        f"{_text_or_num(settings.get('tokens'))} tokens, {_text(record.get('method'))})"
    )
    if record.get("status") == "interrupted":
        title += ". Interrupted: the rows it reached"
    if record.get("note") and is_text(record.get("note")):
        title += f". Note: {record['note']}"
    return [View(title, headers, rows, [False, True, True, True, True, False, True])]


def _text_or_num(value: Any) -> str:
    return str(value) if is_int(value) else "?"
