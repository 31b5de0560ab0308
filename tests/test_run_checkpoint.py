"""A run whose process is killed outright (SIGKILL, the out-of-memory killer, a crash) keeps the repeats it
finished: they are checkpointed after each repeat and read back as an incomplete run (stop reason
"died"), with the same figures a finished run of those repeats would have."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.store import find_runs
from llmbench.cli.app import app

SCENARIO = {
    "name": "killed",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu", "num_kv_blocks": 64},
    "workload": {"num_requests": 3, "input_len": 8, "output_len": 4},
    "arrival": {"kind": "offline"},
    "repeats": 3,
    "telemetry": {"enabled": False},
}

# Runs the scenario and kills its own process, hard, as the third repeat begins.
KILLER = """
import os, signal, sys
from llmbench.bench.runner import RunRequest, execute_run
from llmbench.bench.scenario import load_scenario

class KillAtThird:
    repeat_traced = False
    def observe(self, engine):
        return engine
    def end_of_run(self, engine):
        pass
    def begin_repeat(self, point, repeat, last):
        if repeat == 2:
            os.kill(os.getpid(), signal.SIGKILL)

execute_run(RunRequest(load_scenario(sys.argv[1]), sys.argv[2], step_observer=KillAtThird()))
"""


def test_a_killed_run_keeps_the_repeats_it_finished(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLER), str(scenario), str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == -9, done.stderr[-2000:]
    runs, problems = find_runs([tmp_path / "r"])
    assert problems == [] and len(runs) == 1
    run = runs[0]
    assert run.path.name.startswith(".tmp-") and run.meta["status"] == "incomplete"
    assert (run.summary["stop_reason"], run.meta["stop_reason"]) == ("died", "died")
    assert "killed, out of memory or crashed" in run.meta["error"]
    (point,) = run.summary["points"]
    assert [r["repeat"] for r in point["repeats"]] == [0, 1]
    assert point["metrics"]["num_completed"]["value"] == 3
    assert sorted(run.table("requests")["repeat"].unique()) == [0, 1]
    # the report shows it, marked, next to nothing else
    res = CliRunner().invoke(app, ["report", str(tmp_path / "r")], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "incomplete (died)" in res.stdout


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "where",
    ["llmbench.bench.runner.busy_warning", "llmbench.bench.telemetry.TelemetrySampler.start",
     "llmbench.bench.backends.engine.EngineBackend.start"],
)  # fmt: skip
def test_an_interrupt_before_anything_was_measured_leaves_no_folder(
    tmp_path: Path, monkeypatch, where
) -> None:
    # Ctrl-C while the machine is sampled, the telemetry starts or the backend starts: nothing was measured,
    # so nothing is kept, not even the run's working folder (which readers would show as a run that died).
    from llmbench.bench.runner import RunRequest, execute_run
    from llmbench.bench.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"model": "qwen3-tiny", "engine": {"device": "cpu"},
                                    "workload": {"num_requests": 2, "input_len": 8, "output_len": 2}}))  # fmt: skip
    monkeypatch.setattr(where, _interrupt)
    with pytest.raises(KeyboardInterrupt):
        execute_run(RunRequest(load_scenario(path, []), tmp_path / "r", "v"))
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*")), list(
        (tmp_path / "r").rglob("*")
    )
