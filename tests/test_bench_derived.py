"""Decode bandwidth and prefill FLOP utilisation from hand-built steps, and the peak table."""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest

from llmbench.bench.derived import step_summary, step_utilisation
from llmbench.bench.hardware import Peak, peak_for
from llmbench.bench.records import StepRecord


class Info(NamedTuple):
    weight_bytes: int
    kv_bytes_per_token: int
    num_params: int


def step(
    kind: str, dur: float, prefill: int = 0, context: int = 0, used: int = 3, free: int = 1
) -> StepRecord:
    return StepRecord(1, kind, 2, prefill, 0, None, 0, used, free, 0, 0, 10.0, 10.0 + dur, context)


def test_decode_bandwidth_counts_weights_plus_kv_read():
    info = Info(weight_bytes=1_000_000, kv_bytes_per_token=1000, num_params=500_000)
    peak = Peak("X", mem_bandwidth=1e9, bf16_flops=1e12)
    steps = [
        step("decode", 0.002, context=1000),
        step("prefill", 0.5, prefill=100),
        step("mixed", 0.1, prefill=5),
    ]
    u = step_utilisation(steps, info, peak, tp=1)
    assert u.decode_bw[0] == pytest.approx((1e6 + 1000 * 1000) / 0.002 / 1e9)  # = 1.0
    assert u.prefill_flops[1] == pytest.approx(2 * 500_000 * 100 / 0.5 / 1e12)
    assert math.isnan(u.decode_bw[1]) and math.isnan(u.prefill_flops[0])
    assert math.isnan(u.decode_bw[2]) and math.isnan(u.prefill_flops[2])  # mixed steps are neither
    half = step_utilisation(steps, info, peak, tp=2)
    assert half.decode_bw[0] == pytest.approx(u.decode_bw[0] / 2)
    s = step_summary(steps, u)
    assert s["decode_bw_util_mean"] == pytest.approx(1.0) and s["kv_usage_max"] == pytest.approx(0.75)
    assert s["decode_step_mean"] == pytest.approx(0.002)


def test_a_mapping_of_model_info_reads_the_same_and_a_peer_without_kv_sizes_gets_nan():
    # Peer backends report model_info as a dict, without the engine's KV sizes (and without steps).
    peak = Peak("X", mem_bandwidth=1e9, bf16_flops=1e12)
    steps = [step("decode", 0.002, context=1000)]
    info = Info(weight_bytes=1_000_000, kv_bytes_per_token=1000, num_params=500_000)
    as_dict = step_utilisation(steps, info._asdict(), peak)
    assert as_dict.decode_bw[0] == pytest.approx(step_utilisation(steps, info, peak).decode_bw[0])
    peer = step_utilisation(steps, {"weight_bytes": 10, "num_params": 5}, peak)
    assert math.isnan(peer.decode_bw[0])
    assert len(step_utilisation([], {"weight_bytes": 10}, peak).decode_bw) == 0


def test_without_a_peak_everything_is_nan():
    u = step_utilisation([step("decode", 0.01, context=5)], Info(1, 1, 1), None)
    assert math.isnan(u.decode_bw[0])
    assert math.isnan(step_summary([step("decode", 0.01)], u)["decode_bw_util_mean"])


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
def test_peak_table_matches_gpu_names(name, bandwidth):
    assert peak_for(name).mem_bandwidth == bandwidth


def test_unknown_device_has_no_peak():
    assert peak_for("Some Future GPU") is None and peak_for(None) is None
