"""Each repeat of a point gets arrival times of its own, and every variant gets the same ones per repeat
(what lets an ablation pair its variants by repeat). A recording backend stands in for the engine."""

from __future__ import annotations

import yaml

from llmbench.bench.driver import DriveResult
from llmbench.bench.runner import QuietEvents, RunRequest, _measure, _Measuring
from llmbench.bench.scenario import load_scenario

SCENARIO = {
    "name": "arr",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 6, "input_len": 8, "output_len": 2},
    "arrival": {"kind": "poisson", "rate": 4.0},
    "warmup": 0,
    "repeats": 3,
}


class RecordingBackend:
    """Accepts every request at once and remembers the arrival offsets it was given, per tag."""

    name = "engine"
    tokenizer = None
    vocab_size = 1000
    max_model_len = 4096

    def __init__(self) -> None:
        self.offsets: dict[str, list[float]] = {}
        self.warnings: list[str] = []

    def run(self, specs, offsets, concurrency, tag, max_duration, on_progress):
        self.offsets[tag] = list(offsets)
        return DriveResult([], [], 0.0, 1.0, "complete", None, 0)

    def between_repeats(self) -> None:
        pass


def offsets_of(path, sets: list[str], repeat_index: int | None = None) -> dict[str, list[float]]:
    backend = RecordingBackend()
    req = RunRequest(load_scenario(path, sets), repeat_index=repeat_index)
    _measure(req, backend, QuietEvents(), _Measuring(QuietEvents()))
    return backend.offsets


def test_repeats_get_their_own_arrivals_shared_by_every_variant(tmp_path):
    path = tmp_path / "arr.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    base = offsets_of(path, [])
    assert sorted(base) == ["p0r0-", "p0r1-", "p0r2-"]
    schedules = [tuple(base[f"p0r{r}-"]) for r in range(3)]
    assert len(set(schedules)) == 3, "every repeat must sample the arrival process anew"
    assert all(s[0] == 0.0 and len(s) == 6 for s in schedules)
    other = offsets_of(path, ["engine.attention_backend=torch"])
    assert other == base  # another configuration, the same arrivals repeat by repeat
    # An ablation child runs one repeat alone: it gets that repeat's arrivals, not the first repeat's.
    assert offsets_of(path, ["engine.paged_kv=false"], repeat_index=2) == {"p0r2-": base["p0r2-"]}
