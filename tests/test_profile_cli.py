"""``llmbench profile``: bad input fails cleanly before anything runs; a profile of two variants writes
traces, summaries and their comparison, which ``llmbench report`` shows; Ctrl-C keeps what was recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from processes import interruptible
from typer.testing import CliRunner

from llmbench.bench.report import build_report
from llmbench.bench.report.profile_views import profile_bars
from llmbench.bench.store import load_run
from llmbench.cli.app import app

from tiny_models import PROFILED

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def scenario(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "prof.yaml"
    path.write_text(yaml.safe_dump({**PROFILED, **changes}))
    return path


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert "Traceback" not in res.output, res.output
    return res


def test_zero_steps_is_refused(tmp_path):
    res = invoke("profile", scenario(tmp_path), "--steps", "0", "--out", tmp_path / "r")
    assert res.exit_code == 2 and "--steps" in res.output
    assert not (tmp_path / "r").exists()


def test_a_scenario_with_no_steady_state_is_refused(tmp_path):
    path = scenario(tmp_path, workload={**PROFILED["workload"], "num_requests": 1, "output_len": 4})
    res = invoke("profile", path, "--steps", "20", "--out", tmp_path / "r")
    assert res.exit_code == 2
    assert (
        "no steady state to profile: the scenario's 1 request(s) of at most 4 output tokens make at most 4"
        in res.stderr
    )
    assert not (tmp_path / "r").exists()


def test_a_toggle_that_cannot_apply_names_the_reason(tmp_path):
    res = invoke("profile", scenario(tmp_path), "--toggle", "cuda_graph", "--out", tmp_path / "r")
    assert res.exit_code == 2
    assert "variant cuda_graph=on cannot run here: cuda_graph=True needs a CUDA device" in res.stderr
    assert "Toggles this scenario can flip here: paged_kv, prefix_cache" in res.stderr
    assert not (tmp_path / "r").exists()
    res = invoke("profile", scenario(tmp_path), "--toggle", "warp_speed", "--out", tmp_path / "r")
    assert res.exit_code == 2 and "Unknown toggle: 'warp_speed'" in res.stderr


def test_an_out_folder_that_cannot_be_written_is_refused(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = invoke("profile", scenario(tmp_path), "--out", blocker / "r")
    assert res.exit_code == 2 and "cannot write a profile there" in res.stderr


def test_a_peer_backend_cannot_be_profiled(tmp_path):
    path = scenario(tmp_path, backend="transformers")
    res = invoke("profile", path, "--out", tmp_path / "r")
    assert res.exit_code == 2 and "profile records the built-in engine" in res.stderr


@pytest.mark.slow
def test_two_variants_are_profiled_compared_and_reported(tmp_path):
    res = invoke("profile", scenario(tmp_path), "--toggle", "attention_backend=torch", "--steps", "4",
                 "--out", tmp_path / "r")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "baseline: where a step's time goes" in res.stdout
    assert "median, untraced" in res.stdout  # each variant's first repeat ran untraced, for reference
    assert "host waiting on the device" not in res.stdout  # a GPU's wait: on a CPU the device is the host
    assert "attention_backend=torch against baseline: mean per step" in res.stdout
    (folder,) = list((tmp_path / "r" / "prof").iterdir())
    top = json.loads((folder / "profile.json").read_text())
    assert top["status"] == "complete" and [v["status"] for v in top["variants"]] == ["ok", "ok"]
    (diff,) = top["diffs"]
    assert diff["variant"] == "attention_backend=torch"
    attention = [r for r in diff["rows"] if r["kind"] == "decode" and r["figure"].strip() == "attention"]
    assert attention and attention[0]["baseline"] > 0 and attention[0]["variant"] > 0
    for name in ("baseline", "attention_backend-torch"):
        variant = json.loads((folder / name / "profile.json").read_text())
        assert variant["status"] == "complete" and variant["kinds"]["decode"]["steps"] >= 4
        assert variant["torch_compile"] is False  # what a comparison across torch.compile must know
        assert variant["traces"] and all((folder / name / t).stat().st_size > 0 for t in variant["traces"])
        assert load_run(folder / name / "run").complete
    rep = invoke("report", folder)
    assert rep.exit_code == 0
    assert "attention_backend=torch: where a step's time goes" in rep.stdout
    assert "attention_backend=torch against baseline: mean per step" in rep.stdout
    (section,) = build_report([folder]).sections
    assert profile_bars(section.groups).startswith("<img")
    # the run figures are the untraced repeat's alone, and the overview says so
    assert [sum(len(r) for r in g.points.values()) for g in section.groups] == [1, 1]
    assert "the repeat the profiler recorded is left out" in rep.stdout


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_recorded_marked_incomplete(tmp_path):
    long = {**PROFILED["workload"], "num_requests": 400, "output_len": 64}
    path = scenario(tmp_path, workload=long)
    out = tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        interruptible("-m", "llmbench", "profile", str(path), "--steps", "2", "--slow-steps", "--out", str(out)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not list(out.glob("prof/*/baseline/trace-*.json.gz")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    (folder,) = list((out / "prof").iterdir())
    assert json.loads((folder / "profile.json").read_text())["status"] == "interrupted"
    variant = json.loads((folder / "baseline" / "profile.json").read_text())
    assert variant["status"] == "incomplete" and variant["kinds"] and variant["traces"]
    run = load_run(folder / "baseline" / "run")
    assert run.meta["status"] == "incomplete" and run.meta["stop_reason"] == "interrupted"


def test_a_variant_that_cannot_start_shows_its_own_error(tmp_path, monkeypatch):
    # A variant's process whose engine fails as it is built (after every check made before any cost has
    # passed), before any step: the profile must show that error (as run and ablate do), not one of writing
    # a profile of steps that were never recorded. The failure is put into the variants' processes alone:
    # a sitecustomize module on their path.
    from child_hooks import in_child_processes

    in_child_processes(
        tmp_path,
        monkeypatch,
        """
        from llmbench.engine import llm_engine
        from llmbench.models.errors import ModelError
        def broken(self, *args, **kwargs):
            raise ModelError('the weights cannot serve this model (a failure only its start-up finds)')
        llm_engine.LLMEngine.__init__ = broken
        """,
    )
    res = invoke("profile", scenario(tmp_path), "--steps", "4", "--out", tmp_path / "r")
    said = " ".join(res.output.split())
    assert res.exit_code == 1, res.output
    assert "a failure only its start-up finds" in said and "profile.json" not in said, said
