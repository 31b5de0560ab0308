"""What the report's change tables say of changes that have no percentage, and of their own multiplicity.

A change from a baseline of 0 (no failed request) is a difference in the metric's unit with a verdict, never
``n/a``; a metric that can be below 0 (a fit's intercept) is shown as a difference whose estimate lies inside
its interval; a table of several verdicts says how many of them a change that does nothing would give.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.runner import RunRequest, execute_run
from llmbench.bench.scenario import load_scenario
from llmbench.cli.app import app

SCENARIO = {
    "name": "vrd",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 2, "input_len": 8, "output_len": 4},
    "arrival": {"kind": "offline"},
    "repeats": 1,
    "telemetry": {"period_ms": 20},
}
# Per variant, per repeat: the figures each of three repeats is given (the rest are the run's own).
FIGURES = {
    "baseline": {"num_failed": [0, 0, 0], "decode_fixed": [0.0010, 0.0011, -0.0001]},
    "attention_backend=torch": {"num_failed": [3, 5, 4], "decode_fixed": [-0.0010, -0.0011, -0.0012]},
}


@pytest.fixture(scope="module")
def ablation(tmp_path_factory) -> Path:
    """A baseline and a variant of one ablation, each with three repeats carrying ``FIGURES``."""
    root = tmp_path_factory.mktemp("results")
    path = root / "vrd.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    for variant, sets in (("baseline", []), ("attention_backend=torch", ["engine.attention_backend=torch"])):
        run_dir = execute_run(
            RunRequest(load_scenario(path, sets), root / "runs", variant, ablation="v1")
        ).run_dir
        summary = json.loads((run_dir / "summary.json").read_text())
        for point in summary["points"]:
            first = point["repeats"][0]
            figures = FIGURES[variant]
            point["repeats"] = [
                {
                    **first,
                    "repeat": i,
                    "metrics": {**first["metrics"], **{k: v[i] for k, v in figures.items()}},
                }
                for i in range(3)
            ]
        summary["warnings"] = []  # whatever the machine's load was when the fixture ran
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return root / "runs"


def report(ablation: Path, *args: str) -> str:
    res = CliRunner().invoke(app, ["report", str(ablation), "--format", "markdown", *args])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    return res.stdout


def test_failed_requests_rising_from_none_are_a_difference_judged_worse_not_na(ablation):
    said = report(ablation, "--view", "deltas", "-m", "num_failed")
    # differences 3, 5, 4: +4 with t(2) * 1 / sqrt(3) = 2.48 either side
    assert "| failed | 0 | 4 | +4 | +1.516 … +6.484 | worse |" in said, said
    assert "n/a" not in said


def test_a_signed_metric_crossing_zero_is_a_difference_inside_its_interval(ablation):
    said = report(ablation, "--view", "deltas", "-m", "decode_fixed")
    # was -265.0% [-100.0% … -46.7%]: the estimate outside its own interval
    assert "| 0.667 | -1.100 | -1.767 ms | -3.222 ms … -0.311 ms | better |" in said, said
    assert "a change in the metric's unit, not in %, is the difference of the means" in said


def test_a_table_of_several_verdicts_says_how_many_chance_would_give(ablation):
    said = report(ablation, "--view", "changes", "-m", "num_failed,decode_fixed,ttft_p50,tpot_p50")
    assert (
        "- 4 verdicts, each better or worse by chance in at most 5% of tables for a change that does nothing: "
        "up to 0.2 such verdicts expected here; read a lone one among many with that in mind\n"
    ) in said, said
    alone = report(ablation, "--view", "changes", "-m", "num_failed")
    assert "verdicts: a change that does nothing" not in alone  # one verdict: no line


def test_several_tables_of_verdicts_say_how_many_chance_would_give_across_them():
    from llmbench.bench.report.compare import Change, tables_chance_note

    judged = Change("ttft_p50", 1.0, 1.1, 0.1, 0.05, 0.15, 3, "paired")
    few = Change("ttft_p50", 1.0, 1.1, 0.1, 0.05, 0.15, 2, "paired")  # two repeats: no verdict to count
    tables = [[(judged, "worse")] * 9 for _ in range(5)]  # 5 sweep points x 9 metrics
    (line,) = tables_chance_note(tables)
    assert line.startswith("across the 5 tables of these comparisons: 45 verdicts, up to 2.3 of them")
    assert tables_chance_note([[(judged, "worse")] * 9, [(few, "inconclusive (n=2)")]]) == []  # one table's
