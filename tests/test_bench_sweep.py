"""The ``sweep`` arrival: sync, throughput, then Poisson points at fractions of the capacity it measured;
what a profile changed, said in one line; the lag warning that tells a missed schedule from step length."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.arrivals import at_measured_rate, capacity, point_label
from llmbench.bench.driver import DriveResult
from llmbench.bench.errors import ScenarioError
from llmbench.bench.records import RequestRecord, StepRecord
from llmbench.bench.repeat_warnings import repeat_warnings
from llmbench.bench.scenario import load_scenario
from llmbench.bench.scenario import loader as loader_mod
from llmbench.bench.store import find_runs
from llmbench.cli.app import app

MINIMAL = {"model": "qwen3-tiny", "workload": {"num_requests": 4, "input_len": 16, "output_len": 4}}


def write(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def record(rid: str, arrival: float, last: float | None, submitted: float | None = None) -> RequestRecord:
    times = [] if last is None else [last]
    reason = "length" if last is not None else "abort"
    return RequestRecord(
        rid, 4, 1, arrival, arrival if submitted is None else submitted, arrival, times, [], reason
    )


def drive(*requests: RequestRecord, steps: list[float] = ()) -> DriveResult:
    step_records = [
        StepRecord(i, "decode", 1, 0, 1, None, 0, 1, 1, 0, 0, 0.0, d, 0) for i, d in enumerate(steps)
    ]
    return DriveResult(list(requests), step_records, 0.0, 1.0, "complete", None, 0)


def test_a_sweep_is_sync_then_throughput_then_its_fractions(tmp_path):
    sc = load_scenario(
        write(tmp_path, {**MINIMAL, "arrival": {"kind": "sweep", "fractions": [0.5, 0.2]}})
    ).scenario
    assert sc.arrival.points == [
        {"kind": "concurrency", "concurrency": 1, "sweep": "sync"},
        {"kind": "offline", "sweep": "throughput"},
        {"kind": "poisson", "sweep": "fraction", "fraction": 0.5},
        {"kind": "poisson", "sweep": "fraction", "fraction": 0.2},
    ]
    assert [point_label(p) for p in sc.arrival.points] == [
        "sync",
        "throughput",
        "poisson@0.5x",
        "poisson@0.2x",
    ]
    assert sc.arrival.warmup_point == {"kind": "offline", "sweep": "throughput"}  # every batch shape
    default = load_scenario(write(tmp_path, {**MINIMAL, "arrival": {"kind": "sweep"}})).scenario
    assert [p.get("fraction") for p in default.arrival.points[2:]] == [0.25, 0.5, 0.75]


@pytest.mark.parametrize(
    ("arrival", "expected"),
    [
        ({"kind": "sweep", "fractions": []}, "arrival.fractions: needs at least one fraction"),
        (
            {"kind": "sweep", "fractions": [0.5, -1]},
            "arrival.fractions: fractions of the measured capacity must be > 0, got -1.0",
        ),
        (
            {"kind": "sweep", "fractions": [0.5, 0.25, 0.5]},
            "arrival.fractions: each fraction names one point of the sweep; 0.5 is given twice",
        ),
        (
            {"kind": "sweep", "rate": 3},
            "arrival.rate: does not apply to kind 'sweep' (it takes: fractions (optional))",
        ),
        (
            {"kind": "sweep", "concurrency": 2},
            "arrival.concurrency: does not apply to kind 'sweep' (it takes: fractions (optional))",
        ),
        (
            {"kind": "poisson", "rate": 3, "fractions": [0.5]},
            "arrival.fractions: does not apply to kind 'poisson' (it takes: rate, max_concurrency (optional))",
        ),
        (
            {"kind": "sweep", "fractions": "half"},
            "arrival.fractions: expected a number or a list of them (a sweep), got 'half'",
        ),
    ],
)
def test_bad_sweeps_name_the_field_and_what_is_allowed(tmp_path, arrival, expected):
    path = write(tmp_path, {**MINIMAL, "arrival": arrival})
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(info.value) == f"Invalid scenario {path}:\n  {expected}"


def test_capacity_is_finished_requests_per_second_of_the_throughput_point():
    # 4 finished between the first arrival (t=1) and the last token (t=3): 2 req/s; the aborted one is not.
    one = drive(record("a", 1.0, 2.0), record("b", 1.0, 3.0), record("c", 1.5, 2.5), record("d", 1.0, 2.9))
    other = drive(record("a", 0.0, 1.0), record("b", 0.0, 1.0), record("x", 0.0, None))  # 2 req/s
    assert capacity([one]) == pytest.approx(2.0) and capacity([one, other]) == pytest.approx(2.0)
    assert math.isnan(capacity([drive(record("x", 0.0, None))]))
    point = {"kind": "poisson", "sweep": "fraction", "fraction": 0.25}
    assert at_measured_rate(point, [one]) == {**point, "rate": 0.5, "capacity": 2.0}
    assert at_measured_rate({"kind": "offline"}, [one]) == {"kind": "offline"}  # only fractions change
    with pytest.raises(ValueError, match="the sweep's throughput point finished no request"):
        at_measured_rate(point, [drive(record("x", 0.0, None))])


def test_waiting_for_the_step_in_progress_is_not_a_missed_schedule():
    point = {"kind": "poisson", "rate": 1.0}
    # 30 ms steps: requests handed over up to 25 ms late waited for the step in progress, nothing more.
    usual = drive(*(record(str(i), i, i + 0.5, i + 0.025) for i in range(20)), steps=[0.03] * 50)
    assert repeat_warnings("p", usual, point, True) == []
    # one stalled step of 2 s among 1 ms ones: requests due meanwhile were late by far more than a step
    stall = drive(*(record(str(i), i, i + 0.5, i + (1.5 if i < 3 else 0.0)) for i in range(20)),
                  steps=[0.001] * 300 + [2.0])  # fmt: skip
    (warning,) = repeat_warnings("p", stall, point, True)
    assert warning.startswith(
        "p: the driver fell behind the arrival schedule: hand-over lag p99 1500.0 ms, max 1500.0 ms (requests "
        "enter between engine steps; the longest step took 2000.0 ms)."
    )
    # a backend without steps (a remote server) keeps the fixed 10 ms allowance
    late = drive(*(record(str(i), i, i + 0.5, i + 0.02) for i in range(5)))
    assert "the backend's client could not keep up" in repeat_warnings("p", late, point, True)[0]


PROFILED = {
    "name": "p",
    "model": "qwen3-0.6b",
    "workload": {"num_requests": 300, "input_len": 16, "output_len": 4},
    "arrival": {"kind": "poisson", "rate": 24},
    "warmup": 16,
    "profiles": {
        "cpu": {
            "when": "cpu",
            "overrides": {
                "model": "qwen3-tiny",
                "workload": {"num_requests": 64, "output_len": 8},
                "arrival": {"kind": "sweep", "rate": None, "fractions": [0.25, 0.5]},
                "warmup": 4,
            },
        }
    },
}


def test_the_profile_says_what_it_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: False)
    r = load_scenario(write(tmp_path, PROFILED))
    assert r.profile.changes == (
        "model qwen3-0.6b -> qwen3-tiny (random weights), 300 -> 64 requests, arrival poisson 24/s -> sweep "
        "0.25/0.5x; also warmup, workload.output_len"
    )
    # what --set already says is no change of the profile's
    r = load_scenario(write(tmp_path, PROFILED), ["workload.num_requests=64", "model=qwen3-tiny"])
    assert r.profile.changes == "arrival poisson 24/s -> sweep 0.25/0.5x; also warmup, workload.output_len"
    assert load_scenario(write(tmp_path, PROFILED), profile="none").profile.changes == ""


def test_run_prints_what_the_profile_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: False)
    res = CliRunner().invoke(app, ["run", str(write(tmp_path, PROFILED)), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert (
        "# profile: cpu — the run lands on the CPU (torch sees no CUDA device); it changes model qwen3-0.6b -> "
        "qwen3-tiny (random weights), 300 -> 64 requests, arrival poisson 24/s -> sweep 0.25/0.5x; also "
        "warmup, workload.output_len\n"
    ) in res.stdout


@pytest.mark.slow
def test_a_sweep_runs_its_fractions_at_the_rate_its_throughput_point_measured(tmp_path):
    data = {
        "name": "sw",
        "model": "qwen3-tiny",
        "engine": {"device": "cpu"},
        "workload": {
            "num_requests": 6,
            "input_len": {"dist": "uniform", "min": 8, "max": 24},
            "output_len": 4,
        },
        "arrival": {"kind": "sweep", "fractions": [0.5, 0.9]},
        "warmup": 2,
        "telemetry": {"enabled": False},
    }
    res = CliRunner().invoke(app, ["run", str(write(tmp_path, data)), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    (run,), _ = find_runs([tmp_path / "r"])
    points = run.summary["points"]
    assert [p["label"] for p in points] == ["sync", "throughput", "poisson@0.5x", "poisson@0.9x"]
    reached = points[1]["metrics"]["request_throughput"]["value"]  # the same figure the sweep measured
    for p, fraction in zip(points[2:], (0.5, 0.9), strict=True):
        assert p["arrival"] == {
            "kind": "poisson", "sweep": "fraction", "fraction": fraction, "rate": pytest.approx(fraction * reached),
            "capacity": pytest.approx(reached),
        }  # fmt: skip
        assert (
            f"{p['label']}: {fraction * reached:.3g} req/s, {fraction:g} x the {reached:.3g} req/s"
            in res.stderr
        )
    assert run.meta["points"] == [p["arrival"] for p in points]  # the rates chosen, in meta.json too
