"""Scenario values that would make a run meaningless, refused with the field's path: rate arrivals that
would take hours, a telemetry sampler that eats a CPU, sweep fractions that are typos, shared prefixes
that no two requests share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from llmbench.bench.arrivals import arrival_offsets
from llmbench.bench.errors import ScenarioError
from llmbench.bench.scenario import load_scenario
from llmbench.bench.workload.spec import RequestSpec

WORKLOAD = {"num_requests": 4, "input_len": 16, "output_len": 4}


def error_of(tmp_path: Path, **patch) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"model": "qwen3-tiny", "workload": WORKLOAD, **patch}))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return str(info.value)


def loads(tmp_path: Path, **patch) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"model": "qwen3-tiny", "workload": WORKLOAD, **patch}))
    load_scenario(path)


@pytest.mark.parametrize("kind", [{"kind": "poisson"}, {"kind": "gamma", "cv": 2}])
def test_a_rate_whose_requests_would_arrive_over_hours_is_refused(tmp_path, kind):
    msg = error_of(tmp_path, arrival={**kind, "rate": [5, 0.0001]})
    assert (
        "arrival.rate: 4 requests at 0.0001 requests/s arrive over about 11.1 hours (num_requests / rate), "
        "past the limit of 6 hours; a rate is requests per second"
    ) in msg
    loads(tmp_path, arrival={**kind, "rate": 0.001})  # 4,000 s: slow, but a plan


def test_a_file_workload_is_checked_when_its_record_count_is_known():
    # without workload.num_requests the file's records set the count: arrival_offsets checks it
    requests = [RequestSpec(str(i), [1], 1) for i in range(100)]
    with pytest.raises(
        ScenarioError, match=r"^rate=0\.001: 100 requests at 0\.001 requests/s arrive over about 27\.8 hours"
    ):
        arrival_offsets({"kind": "poisson", "rate": 0.001}, requests, np.random.default_rng(0))
    assert len(arrival_offsets({"kind": "poisson", "rate": 1.0}, requests, np.random.default_rng(0))) == 100


def test_telemetry_period_has_a_floor(tmp_path):
    msg = error_of(tmp_path, telemetry={"period_ms": 0.001})
    assert (
        "telemetry.period_ms: must be at least 10 ms (a faster sampler takes a CPU from the run it measures"
        in msg
    )
    loads(tmp_path, telemetry={"period_ms": 10})


def test_sweep_fractions_above_4_are_taken_for_typos(tmp_path):
    msg = error_of(tmp_path, arrival={"kind": "sweep", "fractions": [0.25, 50]})
    assert "arrival.fractions: fractions of the measured capacity must be at most 4 (above 1 overloads" in msg
    assert msg.rstrip().endswith("got 50")
    loads(tmp_path, arrival={"kind": "sweep", "fractions": [0.5, 1.5, 4]})  # overload on purpose


def test_shared_prefixes_must_be_fewer_than_requests(tmp_path):
    shared = {"source": "shared_prefix", "prefix_len": 8, **WORKLOAD}
    msg = error_of(tmp_path, workload={**shared, "num_prefixes": 10})
    assert (
        "workload.num_prefixes: must be below num_requests (4): request i takes prefix i % num_prefixes, so "
        "with 10 prefixes no two requests would share one"
    ) in msg
    assert "workload.num_prefixes: must be below" in error_of(
        tmp_path, workload={**shared, "num_prefixes": 4}
    )
    loads(tmp_path, workload={**shared, "num_prefixes": 3})
