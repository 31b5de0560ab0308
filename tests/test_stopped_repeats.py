"""A repeat that an interrupt or a failure stopped part-way is a part of a workload, no measurement of it:
kept in summary.json with its status, left out of the point's figures (the run's own table, and every
report) wherever a repeat of the point ran to its end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.runner import RunRequest, execute_run
from llmbench.bench.scenario import load_scenario
from llmbench.bench.summary import whole_repeats
from llmbench.cli.app import app


def test_whole_repeats_leave_out_the_stopped_ones_unless_none_ran_to_its_end():
    whole, stopped, cut = {"status": "complete"}, {"status": "interrupted"}, {"status": "timeout"}
    assert whole_repeats([whole, stopped, {"status": "failed"}]) == [whole]
    assert whole_repeats([cut, stopped]) == [cut]  # a time limit is the scenario's own bound: kept
    assert whole_repeats([stopped]) == [stopped]  # all the point has (the run is marked incomplete)
    assert whole_repeats([{}]) == [{}]  # runs written before repeats recorded a status


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    path = root / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "stop", "model": "qwen3-tiny", "engine": {"device": "cpu"}, "repeats": 2, "warmup": 0,
        "workload": {"num_requests": 3, "input_len": 8, "output_len": 3}, "arrival": {"kind": "offline"},
    }))  # fmt: skip
    return execute_run(RunRequest(load_scenario(path), root / "runs", "default")).run_dir


def test_a_report_leaves_a_stopped_repeat_out_of_the_figures_and_says_so(run, tmp_path):
    copy = tmp_path / "r" / "stop" / run.name
    shutil.copytree(run, copy)
    summary = json.loads((copy / "summary.json").read_text())
    repeats = summary["points"][0]["repeats"]
    whole = repeats[0]["metrics"]["output_throughput"]
    repeats[1]["status"] = "interrupted"
    repeats[1]["metrics"]["output_throughput"] = whole / 100  # what a repeat stopped early would show
    (copy / "summary.json").write_text(json.dumps(summary))
    res = CliRunner().invoke(app, ["report", str(copy), "-m", "output_throughput", "-f", "csv"])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    row = next(line for line in res.stdout.splitlines() if ",output_throughput," in line).split(",")
    assert float(row[7]) == pytest.approx(whole) and row[11] == "1"  # the whole repeat's, not a mean of both
    res = CliRunner().invoke(app, ["report", str(copy), "-m", "output_throughput"], env={"COLUMNS": "200"})
    said = " ".join(res.output.split())
    assert "1 repeat(s) an interrupt or a failure stopped part-way are left out of the figures" in said
