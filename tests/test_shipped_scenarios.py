"""Every shipped scenario runs to its end on this machine (on a CPU, under its cpu profile), shrunk to a
few requests: each of its points completes every request it was given. A dry run (test_cli_run.py) shows
a scenario resolves; this shows its workload, arrivals and engine options run together."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.scenario.loader import shipped_scenarios
from llmbench.bench.store import find_runs
from llmbench.cli.app import app

REQUESTS = 8  # enough for the shared-prefix scenario's groups


@pytest.mark.slow
@pytest.mark.parametrize("path", shipped_scenarios(recursive=True), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_scenario_runs_to_its_end(path, tmp_path):
    sets = [f"workload.num_requests={REQUESTS}", "warmup=0", "repeats=1"]
    backends = (yaml.safe_load(path.read_text()) or {}).get("backend")
    if isinstance(backends, list):  # a side-by-side scenario: `run` measures one of its backends
        sets.append(f"backend={backends[0]}")
    args = ["run", str(path), "--out", str(tmp_path), "-q", *(a for s in sets for a in ("--set", s))]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    runs, problems = find_runs([tmp_path])
    assert len(runs) == 1 and not problems, problems
    (run,) = runs
    assert run.meta["status"] == "complete"
    points = run.summary["points"]
    assert points and all(p["metrics"]["num_completed"]["value"] == REQUESTS for p in points), [
        (p["label"], p["metrics"]["num_completed"]["value"]) for p in points
    ]
