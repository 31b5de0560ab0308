"""``llmbench calibrate`` on the CPU (small sizes), and the runs that follow it: they divide their derived
figures by the measured peaks and say so; without a calibration of this device they say "unavailable"."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from llmbench.bench.peaks import device_key
from llmbench.bench.store import find_runs
from llmbench.cli.app import app

runner = CliRunner()
SMALL = ("--copy-mib", "1", "--matmul-size", "64", "--repeats", "2")
TINY = {
    "name": "tiny",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 2, "input_len": 12, "output_len": 4},
    "arrival": {"kind": "offline"},
    "warmup": 0,
    "telemetry": {"enabled": False},
}


def invoke(*args, env: dict | None = None):
    result = runner.invoke(app, [str(a) for a in args], env=env)
    assert "Traceback" not in result.output, result.output
    return result


def run_tiny(tmp_path: Path, calibration: Path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "results"
    res = invoke("run", scenario, "--out", out, env={"LLMBENCH_CALIBRATION": str(calibration)})
    assert res.exit_code == 0, res.output
    runs, _ = find_runs([out])
    return res, runs[0]


def test_calibrate_writes_this_device_entry_and_the_next_run_divides_by_it(tmp_path):
    path = tmp_path / "cal" / "calibration.json"
    res = invoke("calibrate", "--device", "cpu", "--file", path, *SMALL)
    assert res.exit_code == 0, res.output
    assert "device copy, read + write" in res.stdout and str(path) in res.stdout.replace("\n", "")
    (cal,) = json.loads(path.read_text())["calibrations"]
    assert cal["key"] == device_key("cpu") and cal["matmul_dtype"] == "float32"
    assert cal["copy_bytes"] == 1 << 20 and cal["matmul_size"] == 64 and len(cal["copy_seconds"]) == 2
    # the stored figures are the medians of the stored timings: read + written bytes, 2 n^3 FLOPs
    assert cal["mem_bandwidth"] == pytest.approx(2 * (1 << 20) / np.median(cal["copy_seconds"]))
    assert cal["matmul_flops"] == pytest.approx(2 * 64**3 / np.median(cal["matmul_seconds"]))

    res, run = run_tiny(tmp_path, path)
    peak = run.meta["peak"]
    assert peak["source"] == "measured" and peak["measured_at"] == cal["measured_at"]
    assert peak["mem_bandwidth"] == cal["mem_bandwidth"] and peak["datasheet"] is None
    assert "decode bandwidth util per GPU (% of measured" in res.stdout
    assert "decode_bw_util_mean" not in run.summary["unavailable"]
    assert run.summary["points"][0]["metrics"]["decode_bw_util_mean"]["value"] is not None
    steps = run.table("steps")
    decode = steps[steps["kind"] == "decode"]
    assert len(decode) > 0 and (decode["decode_bytes_per_gpu"] > 0).all()
    # the stored utilisation is the step's bytes per GPU over its time and the measured bandwidth
    expected = decode["decode_bytes_per_gpu"] / decode["duration"] / cal["mem_bandwidth"]
    assert np.allclose(decode["decode_bw_util"], expected)


def test_a_run_without_a_calibration_of_this_device_says_unavailable_and_why(tmp_path):
    path = tmp_path / "calibration.json"
    other = {"device": "NVIDIA H200", "driver": "570.1", "torch": torch.__version__, "cuda": "12.8"}
    path.write_text(
        json.dumps(
            {
                "format": 1,
                "calibrations": [
                    {
                        "key": other,
                        "mem_bandwidth": 4.25e12,
                        "matmul_flops": 6.85e14,
                        "matmul_dtype": "bfloat16",
                    }
                ],
            }
        )
    )
    res, run = run_tiny(tmp_path, path)
    why = run.summary["unavailable"]["decode_bw_util_mean"]
    assert "no calibration" in why and "llmbench calibrate" in why
    assert run.meta["peak"]["source"] is None
    assert run.summary["points"][0]["metrics"]["decode_bw_util_mean"]["value"] is None
    steps = run.table("steps")  # the counts are there all the same
    assert (steps.loc[steps["kind"] == "decode", "decode_bytes_per_gpu"] > 0).all()


def test_an_unwritable_calibration_file_is_a_clear_error_before_measuring(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = invoke("calibrate", "--device", "cpu", "--file", blocker / "cal.json", *SMALL)
    assert res.exit_code == 2 and "cannot write the calibration file" in res.stderr
    assert "device copy" not in res.stdout  # nothing was measured


@pytest.mark.parametrize(
    ("device", "message"),
    [("tpu", "Unsupported device: 'tpu'. Supported: cpu, cuda, cuda:N"), ("cuda:99", "cuda:99")],
)
def test_a_device_that_does_not_exist_is_a_clear_error(tmp_path, device, message):
    res = invoke("calibrate", "--device", device, "--file", tmp_path / "cal.json", *SMALL)
    assert res.exit_code == 2 and message in res.stderr
    assert not (tmp_path / "cal.json").exists()


def test_calibrating_a_busy_cpu_says_its_peaks_will_read_low(tmp_path, monkeypatch):
    from llmbench.bench import hardware

    monkeypatch.setattr(hardware, "runnable_others", lambda sample_s=0: 64.0)  # other work on every core
    res = invoke("calibrate", "--device", "cpu", "--file", tmp_path / "cal.json", *SMALL)
    assert res.exit_code == 0, res.output
    said = " ".join(res.stderr.split())
    assert "the machine was busy when calibration started" in said and "calibrate on an idle machine" in said
    monkeypatch.setattr(hardware, "runnable_others", lambda sample_s=0: 0.0)
    res = invoke("calibrate", "--device", "cpu", "--file", tmp_path / "cal.json", *SMALL)
    assert res.exit_code == 0 and "busy" not in res.stderr, res.output
