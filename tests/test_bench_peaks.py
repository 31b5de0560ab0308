"""Which peak a run divides by (bench/peaks.py): this device's calibration, else the datasheet, else none;
the calibration file's key, location and failures; the labels that name the peak."""

from __future__ import annotations

import json

import pytest
import torch

from llmbench.bench import peaks
from llmbench.bench.peaks import (
    CalibrationError,
    calibration_path,
    check_writable,
    choose_peak,
    derived_labels,
    device_key,
    peak_for,
    peak_meta,
    read_calibrations,
    store_calibration,
)

H200_KEY = {"device": "NVIDIA H200", "driver": "570.1", "torch": "2.13.0", "cuda": "12.8"}


def entry(key: dict, bandwidth: float = 4.25e12, flops: float = 685e12, dtype: str = "bfloat16") -> dict:
    return {
        "key": key,
        "mem_bandwidth": bandwidth,
        "matmul_flops": flops,
        "matmul_dtype": dtype,
        "measured_at": "2025-06-01T12:00:00+0000",
    }


@pytest.fixture
def fake_h200(monkeypatch):
    """choose_peak on "cuda" as it sees an H200 with this driver and torch."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(peaks, "device_key", lambda device: dict(H200_KEY))


def test_a_gpu_without_a_calibration_uses_the_datasheet_and_says_so(tmp_path, fake_h200):
    choice = choose_peak("cuda", tmp_path / "none.json")
    assert choice.peak.source == "datasheet" and choice.peak.mem_bandwidth == 4.8e12
    assert choice.peak.matmul_flops == 989e12 and choice.why_none is None
    labels = derived_labels(choice.peak)
    assert labels["decode_bw_util_mean"] == "decode bandwidth util per GPU (% of datasheet 4.8 TB/s)"
    assert labels["prefill_flop_util_mean"] == "prefill FLOP util per GPU (% of datasheet 989 TFLOP/s bf16)"
    meta = peak_meta(choice)
    assert meta["source"] == "datasheet" and meta["datasheet"]["name"] == "H200"


def test_a_gpu_with_its_calibration_uses_the_measured_peaks_with_the_datasheet_beside(tmp_path, fake_h200):
    path = tmp_path / "cal.json"
    store_calibration(path, entry(H200_KEY))
    choice = choose_peak("cuda:0", path)
    assert choice.peak.source == "measured" and choice.peak.mem_bandwidth == 4.25e12
    labels = derived_labels(choice.peak)
    assert labels["decode_bw_util_mean"] == "decode bandwidth util per GPU (% of measured 4.25 TB/s)"
    assert labels["prefill_flop_util_mean"] == "prefill FLOP util per GPU (% of measured 685 TFLOP/s bf16)"
    meta = peak_meta(choice)
    assert meta["measured_at"] == "2025-06-01T12:00:00+0000" and meta["calibration_file"] == str(path)
    assert meta["datasheet"]["mem_bandwidth"] == 4.8e12


@pytest.mark.parametrize("field", ["driver", "torch", "cuda", "device"])
def test_a_calibration_keyed_to_another_driver_torch_or_gpu_is_ignored(tmp_path, fake_h200, field):
    path = tmp_path / "cal.json"
    store_calibration(path, entry({**H200_KEY, field: "something else"}))
    assert choose_peak("cuda", path).peak.source == "datasheet"


def test_the_cpu_without_a_calibration_has_no_peak_and_says_how_to_get_one(tmp_path):
    path = tmp_path / "cal.json"
    store_calibration(path, entry(H200_KEY))  # another device's entry only
    choice = choose_peak("cpu", path)
    assert choice.peak is None and "llmbench calibrate" in choice.why_none and str(path) in choice.why_none
    assert peak_meta(choice)["source"] is None and derived_labels(None) == {}


def test_the_cpu_with_its_calibration_has_measured_float32_peaks(tmp_path):
    path = tmp_path / "cal.json"
    store_calibration(path, entry(device_key("cpu"), 20e9, 150e9, "float32"))
    choice = choose_peak("cpu", path)
    assert choice.peak.source == "measured" and choice.peak.datasheet is None
    assert derived_labels(choice.peak)["prefill_flop_util_mean"] == (
        "prefill FLOP util per GPU (% of measured 150 GFLOP/s fp32)"
    )


def test_a_new_calibration_replaces_the_same_key_and_keeps_the_others(tmp_path):
    path = tmp_path / "cal.json"
    store_calibration(path, entry(H200_KEY, 4.0e12))
    store_calibration(path, entry(device_key("cpu"), 1e10))
    store_calibration(path, entry(H200_KEY, 4.2e12))
    entries = read_calibrations(path)
    assert len(entries) == 2 and [e["mem_bandwidth"] for e in entries if e["key"] == H200_KEY] == [4.2e12]


def test_an_unreadable_calibration_file_warns_and_falls_back_to_the_datasheet(tmp_path, fake_h200):
    path = tmp_path / "cal.json"
    path.write_text("{not json")
    choice = choose_peak("cuda", path)
    assert choice.peak.source == "datasheet" and "cannot read the calibration file" in choice.warning
    path.write_text(json.dumps({"something": "else"}))
    assert "is not a calibration file" in choose_peak("cuda", path).warning
    with pytest.raises(CalibrationError, match="not a calibration file"):
        check_writable(path)  # calibrate does not overwrite someone else's file


def test_the_calibration_file_is_found_by_option_then_environment_then_cache_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMBENCH_CALIBRATION", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert calibration_path() == tmp_path / "xdg" / "llmbench" / "calibration.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert calibration_path() == tmp_path / "home" / ".cache" / "llmbench" / "calibration.json"
    monkeypatch.setenv("LLMBENCH_CALIBRATION", str(tmp_path / "env.json"))
    assert calibration_path() == tmp_path / "env.json"
    assert calibration_path(tmp_path / "opt.json") == tmp_path / "opt.json"


def test_a_remote_server_has_no_peak():
    assert choose_peak("remote").peak is None


@pytest.mark.parametrize(
    ("name", "bandwidth"),
    [
        ("NVIDIA H200", 4.8e12),
        ("NVIDIA H100 80GB HBM3", 3.35e12),
        ("NVIDIA H100 PCIe", 2.0e12),
        ("NVIDIA GH200 480GB", 4.0e12),
        ("NVIDIA A100-SXM4-80GB", 2.039e12),
        ("NVIDIA A100-SXM4-40GB", 1.555e12),
        ("NVIDIA L4", 0.3e12),
    ],
)
def test_datasheet_table_matches_gpu_names(name, bandwidth):
    assert peak_for(name).mem_bandwidth == bandwidth


def test_unknown_device_has_no_datasheet_peak():
    assert peak_for("Some Future GPU") is None and peak_for(None) is None
