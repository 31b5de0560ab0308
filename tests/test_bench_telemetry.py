"""Telemetry: host figures sampled on any machine; GPU figures NaN ("unavailable") without NVML, never 0."""

from __future__ import annotations

import math
import time

import pytest

from llmbench.bench.telemetry import TelemetrySampler, window_summary


def test_sampler_without_gpu_records_host_figures_and_nan_gpu_columns():
    s = TelemetrySampler(period_s=0.01, cuda_indices=None)
    s.start()
    t0, cpu0 = time.perf_counter(), time.process_time()
    x = 0
    # Keep a core busy so CPU % is above 0, until the sampler has five samples however loaded the machine.
    while time.perf_counter() - t0 < 0.25 or len(s.rows()) < 5:
        x += 1
    busy = 100 * (time.process_time() - cpu0) / (time.perf_counter() - t0)  # this process's CPU %, measured
    s.stop()
    rows = s.rows()
    assert len(rows) >= 5
    assert not s.nvml_available and s.nvml_reason
    assert all(r["gpu"] == -1 and math.isnan(r["gpu_util"]) and math.isnan(r["energy"]) for r in rows)
    assert all(r["rss"] > 0 for r in rows)
    summary = window_summary(rows, rows[0]["time"], rows[-1]["time"])
    assert summary["cpu_util_mean"] > 0.5 * busy > 0
    for key in ("gpu_util_mean", "power_mean", "energy", "gpu_memory_max"):
        assert math.isnan(summary[key]), key


def gpu_row(t: float, gpu: int, power: float, energy: float, mem: float) -> dict:
    return {
        "time": t, "gpu": gpu, "gpu_util": 50.0 + gpu, "memory_used": mem, "power": power, "energy": energy,
        "sm_clock": 1980.0, "throttle_reasons": 0.0, "torch_allocated": 1.0, "torch_reserved": 2.0,
        "cpu_percent": 100.0, "rss": 3.0,
    }  # fmt: skip


def test_window_summary_sums_gpus_and_takes_energy_counter_differences():
    rows = [
        gpu_row(t, g, 100.0 + 10 * g, 1000.0 + 100 * t * (g + 1), 5.0)
        for t in (0.0, 1.0, 2.0, 3.0)
        for g in (0, 1)
    ]
    s = window_summary(rows, 1.0, 3.0)
    assert s["energy"] == pytest.approx(2 * 100 + 2 * 200)  # counter deltas of both GPUs over [1, 3]
    assert s["power_mean"] == pytest.approx(100 + 110)  # the group's power
    assert s["gpu_memory_max"] == pytest.approx(10.0)  # the group's: both GPUs at their fullest sample
    assert s["gpu_memory_device_max"] == pytest.approx(5.0)  # the fullest one GPU held
    assert s["gpu_util_mean"] == pytest.approx(50.5)
    assert s["torch_reserved_max"] == 2.0


def test_empty_window_is_all_nan():
    assert all(math.isnan(v) for v in window_summary([], 0.0, 1.0).values())


def test_gpu_telemetry_stays_available_after_sampling_stops():
    """The summary is written after the sampler stops: closing NVML must not turn its columns 'unavailable'."""
    from llmbench.bench.nvml import Nvml

    class FakeLib:
        def nvmlShutdown(self):
            return None

    nvml = Nvml(FakeLib(), handles=["gpu0"], indices=[0], reason="")
    assert nvml.available
    nvml.close()
    assert nvml.available


def test_each_sample_records_how_long_taking_it_took():
    ticks = iter([10.0, 10.25, 11.0, 11.5])  # each sample reads the clock when it begins and when it ends
    s = TelemetrySampler(period_s=1.0, cuda_indices=None, clock=lambda: next(ticks))
    s.mark()
    s.mark()
    assert [r["sample_time"] for r in s.rows()] == [0.25, 0.5]
    assert s.sample_intervals() == [(10.0, 10.25), (11.0, 11.5)]


def test_the_energy_counter_is_read_once_a_period_and_the_other_readings_every_sample():
    # Reading the counter takes milliseconds: a sample reads it only when the last reading is a period old.
    from llmbench.bench.nvml import GpuSample
    from llmbench.bench.telemetry import ENERGY_PERIOD_S

    asked = []

    class FakeNvml:
        available, indices, handles, reason = True, [0], ["h"], ""

        def sample(self, handle, energy=True):
            asked.append(energy)
            return GpuSample(50.0, 1.0, 100.0, 7.0 if energy else math.nan, 1980.0, 0.0)

        def close(self):
            pass

    times = [0.0, 0.5, 1.0, 1.6, 2.0, 2.1]
    ticks = iter(t * ENERGY_PERIOD_S for t in times for _ in (0, 1))  # each mark reads the clock twice
    s = TelemetrySampler(period_s=1.0, cuda_indices=None, clock=lambda: next(ticks))
    s._nvml = FakeNvml()
    for _ in times:
        s.mark()
    assert asked == [True, False, True, False, True, False]
    assert [math.isnan(r["energy"]) for r in s.rows()] == [not a for a in asked]
    assert all(r["power"] == 100.0 for r in s.rows())


def test_window_energy_is_the_counter_between_readings_and_mean_power_beyond_them():
    rows = [gpu_row(t, 0, 100.0, math.nan, 5.0) for t in (0.6, 1.5, 2.5, 3.4)]
    rows += [gpu_row(1.0, 0, 100.0, 1000.0, 5.0), gpu_row(3.0, 0, 100.0, 1150.0, 5.0)]
    rows.sort(key=lambda r: r["time"])
    # 150 J counted from 1 s to 3 s; 100 W over the 0.5 s before and the 0.5 s after
    assert window_summary(rows, 0.5, 3.5)["energy"] == pytest.approx(150 + 100 * 1.0)
    # one reading inside [0.55, 2.9]: mean power times the window
    assert window_summary(rows, 0.55, 2.9)["energy"] == pytest.approx(100 * 2.35)


def test_more_torch_threads_than_cores_is_a_run_warning(monkeypatch):
    import os

    from llmbench.bench.hardware import oversubscribed_warning

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert oversubscribed_warning(1000) == (
        "cpu_threads=1000 on 2 cores: the threads take turns on the cores and timings suffer"
    )
    assert oversubscribed_warning(2) is None and oversubscribed_warning(None) is None
    # tensor-parallel ranks on the CPU: each process has its threads
    assert oversubscribed_warning(1, ranks=2) is None
    assert oversubscribed_warning(None, ranks=4) == (
        "tp=4 runs 4 processes with torch's default of 2 threads each, 8 threads on 2 cores: they take turns "
        "on the cores and timings suffer"
    )
    assert oversubscribed_warning(2, ranks=2).startswith("tp=2 runs 2 processes with cpu_threads=2 each")


def test_a_machine_kept_busy_by_other_work_is_flagged_as_the_run_starts():
    import multiprocessing as mp
    import os

    from llmbench.bench.hardware import busy_warning
    from llmbench.bench.report.warning_flags import flag

    stop = mp.Event()
    burners = [mp.Process(target=_burn, args=(stop,)) for _ in range(os.cpu_count() or 1)]
    for p in burners:
        p.start()
    try:
        text = busy_warning(2, sample_s=0.5)
    finally:
        stop.set()
        for p in burners:
            p.join()
    assert text is not None and flag(text) == "busy" and "threads of other processes ready to run" in text
    assert "cpu_threads=1" in text  # two threads may fight the others for the cores


def test_the_load_a_finished_run_left_in_the_load_average_is_not_a_busy_machine(monkeypatch):
    import os

    # An ablation's previous variant kept the cores busy for a minute and is over: the 1-minute load
    # average still says so, the CPUs' use now does not.
    from llmbench.bench import hardware
    from llmbench.bench.hardware import busy_warning

    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0), raising=False)
    if hardware.runnable_others() is None:
        pytest.skip("no /proc/stat: the load average is all there is")
    monkeypatch.setattr(hardware, "runnable_others", lambda sample_s=0: 0.0)
    assert busy_warning(2) is None


def _burn(stop) -> None:
    while not stop.is_set():
        pass
