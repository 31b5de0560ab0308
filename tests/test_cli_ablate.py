"""``llmbench ablate``: variants in their own processes, interleaved repeats, failed variants recorded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.store import load_run
from llmbench.cli.app import app

runner = CliRunner()

TINY = {
    "name": "abl",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 4, "input_len": {"dist": "uniform", "min": 8, "max": 24}, "output_len": 4},
    "arrival": {"kind": "offline"},
    "telemetry": {"period_ms": 20},
}


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert "Traceback" not in res.output, res.output
    return res


def ablation_folder(out: Path) -> Path:
    (folder,) = list((out / "abl").iterdir())
    return folder


@pytest.mark.slow
def test_variants_run_in_their_own_processes_with_interleaved_repeats(tmp_path):
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    res = invoke(
        "ablate", path, "--toggle", "attention_backend=torch", "--repeats", "2", "--out", tmp_path / "r"
    )
    assert res.exit_code == 0, res.output
    assert "attention_backend=torch against baseline" in res.stdout and "outputs identical" in res.stdout
    folder = ablation_folder(tmp_path / "r")
    record = json.loads((folder / "ablation.json").read_text())
    assert record["status"] == "complete" and record["design"] == "flip"
    assert [v["name"] for v in record["variants"]] == ["baseline", "attention_backend=torch"]
    assert all(v["status"] == "ok" and len(v["runs"]) == 2 for v in record["variants"])
    runs = [
        load_run(folder / name)
        for name in ("baseline-r0", "attention_backend-torch-r0", "baseline-r1", "attention_backend-torch-r1")
    ]
    pids = [r.meta["pid"] for r in runs]
    assert len(set(pids)) == 4  # one process per variant and repeat
    started = [r.meta["started_at"] for r in runs]
    assert started == sorted(started)  # A B A B
    assert [r.meta["repeat_index"] for r in runs] == [0, 0, 1, 1]
    assert {r.meta["session"] for r in runs} == {folder.name}
    assert runs[1].meta["engine_config"]["attention_backend"] == "torch"
    assert runs[0].meta["engine_config"]["attention_backend"] == "sdpa"


@pytest.mark.slow
def test_default_scenario_cuda_graph_on_cpu_says_it_needs_a_gpu(tmp_path):
    # As written in the docs (default scenario chat), made small with --set so the test stays quick.
    res = invoke("ablate", "--toggle", "cuda_graph", "--out", tmp_path / "r",
                 "--set", "workload.num_requests=3", "--set", "warmup=0", "--set", "arrival={kind: offline}")  # fmt: skip
    assert res.exit_code == 1
    assert "cuda_graph=True needs a CUDA device: CUDA Graphs cannot run on the CPU" in res.stderr
    assert "variant cuda_graph=on failed" in res.stderr
    (folder,) = list((tmp_path / "r" / "chat").iterdir())
    record = json.loads((folder / "ablation.json").read_text())
    status = {v["name"]: v["status"] for v in record["variants"]}
    assert status == {"baseline": "ok", "cuda_graph=on": "failed"}
    assert load_run(folder / "baseline-r0").complete


def test_ablate_needs_a_toggle_and_a_known_one(tmp_path):
    res = invoke("ablate")
    assert res.exit_code == 2 and "--toggle" in res.output
    res = invoke("ablate", "--toggle", "warp_speed")
    assert res.exit_code == 2 and "Unknown toggle: 'warp_speed'. Toggles: paged_kv" in res.stderr


def test_a_baseline_the_engine_rejects_is_a_clean_error(tmp_path):
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump({**TINY, "engine": {"device": "cpu", "cuda_graph": True}}))
    res = invoke("ablate", path, "--toggle", "paged_kv", "--out", tmp_path / "r")
    assert res.exit_code == 2 and "CUDA Graphs cannot run on the CPU" in res.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_run_past_the_timeout_is_stopped_and_keeps_what_it_measured(tmp_path):
    path = tmp_path / "abl.yaml"
    # Far more work than fits in the limit: every run must be stopped.
    slow = {**TINY, "workload": {"num_requests": 2000, "input_len": 16, "output_len": 400}, "warmup": 0}
    path.write_text(yaml.safe_dump(slow))
    start = time.monotonic()
    res = invoke("ablate", path, "--toggle", "prefix_cache", "--timeout", "12", "--out", tmp_path / "r")
    took = time.monotonic() - start
    assert res.exit_code != 0
    assert "timed out after 12 s" in res.output
    assert took < 2 * (12 + 20), f"two stopped runs took {took:.0f} s"
    record = json.loads((ablation_folder(tmp_path / "r") / "ablation.json").read_text())
    assert [v["status"] for v in record["variants"]] == ["failed", "failed"]
    assert all("timed out" in v["error"] for v in record["variants"])
    kept = [load_run(Path(d)) for v in record["variants"] for d in v["runs"]]
    assert kept, "an interrupted run keeps what it measured"
    assert all(r.meta["status"] == "incomplete" for r in kept)


@pytest.mark.slow
def test_sigterm_stops_an_ablation_like_ctrl_c_and_records_it(tmp_path):
    # `timeout`, batch schedulers and `docker stop` send SIGTERM, to the parent alone.
    import os
    import signal
    import subprocess
    import sys

    path = tmp_path / "abl.yaml"
    slow = {**TINY, "workload": {"num_requests": 2000, "input_len": 16, "output_len": 400}, "warmup": 0}
    path.write_text(yaml.safe_dump(slow))
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "llmbench", "ablate", str(path), "--toggle", "prefix_cache"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path / "r")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    deadline = time.monotonic() + 60
    while not list((tmp_path / "r").glob("abl/*/.tmp-*/meta.json")):  # the first variant is measuring
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    record = json.loads((ablation_folder(tmp_path / "r") / "ablation.json").read_text())
    assert record["status"] == "interrupted"
    (kept,) = [d for v in record["variants"] for d in v["runs"]] or [None]
    assert kept is not None, "the interrupted variant keeps its partial run"
    assert load_run(Path(kept)).meta["status"] == "incomplete"


@pytest.mark.slow
def test_sampling_settings_are_compared_with_their_cost_per_decode_step(tmp_path):
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    res = invoke("ablate", path, "--toggle", "sampling.temperature=0.6", "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    assert "sampling.temperature=0.6 against baseline" in res.stdout
    table = res.stdout[res.stdout.index("sampling.temperature=0.6 against baseline") :]
    assert (
        "decode step mean" in table and "n/a (sampling)" in table
    )  # the step cost; outputs differ by design
    variant = load_run(ablation_folder(tmp_path / "r") / "sampling.temperature-0.6-r0")
    assert variant.meta["scenario"]["sampling"]["temperature"] == 0.6
