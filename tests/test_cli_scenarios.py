"""Every shipped scenario runs on the CPU through its cpu profile and produces a complete result."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from llmbench.bench.scenario.loader import shipped_scenarios
from llmbench.bench.store import find_runs
from llmbench.cli.app import app

SLOW = {"chat", "long_context"}  # a sweep of five points, long prompts: minutes on 2 cores; the rest seconds


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p for p in shipped_scenarios()],
    ids=lambda p: p.stem,
)
def test_shipped_scenario_runs_on_the_cpu(tmp_path, path):
    res = CliRunner().invoke(app, ["run", str(path), "--profile", "cpu", "--out", str(tmp_path), "-q"])
    assert "Traceback" not in res.output, res.output
    assert res.exit_code == 0, res.output
    runs, problems = find_runs([tmp_path])
    assert not problems and len(runs) == 1
    run = runs[0]
    assert (
        run.complete
        and run.meta["profile"]["name"] == "cpu"
        and run.meta["model_info"]["name"] == "qwen3-tiny"
    )
    for point in run.summary["points"]:
        m = point["metrics"]
        assert m["num_completed"]["value"] == m["num_requests"]["value"] > 0
        assert m["output_throughput"]["value"] > 0
