"""The profile window under asynchronous scheduling, where a ``step()`` call launches one step and
delivers the one before: every call a chunk keeps is described by the step it launched, the last one too
(the trace stays open for the call that delivers it)."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import yaml

from llmbench.bench.profile.summary import write_profile
from llmbench.bench.profile.window import ProfileWindow
from llmbench.bench.records import StepRecord
from llmbench.bench.runner import RunRequest, execute_run
from llmbench.bench.scenario.loader import load_scenario

from tiny_models import PROFILED

STEP_KINDS = ("prefill", "decode", "mixed")


def _stats(step: int, kind: str = "decode") -> StepRecord:
    tokens = 0 if kind == "idle" else 4
    return StepRecord(step, kind, 1, 0, tokens, None, 0, 1, 1, 0, 0, 0.0, 0.01, 0)


class _AsyncEngine:
    """The engine as the window sees it under asynchronous scheduling: call i launches step i and returns
    step i - 1 (the first call, with nothing to deliver yet, an idle step)."""

    config = SimpleNamespace(async_scheduling=True)

    def __init__(self, calls: int) -> None:
        self.left = calls
        self.call = 0
        self.recording: list[int] | None = None
        self.written: list[list[int]] = []  # the calls each written trace holds

    def start_trace(self) -> None:
        self.recording = []

    def stop_trace(self, path: str | None) -> None:
        if path is not None:
            self.written.append(self.recording)
        self.recording = None

    def has_unfinished(self) -> bool:
        return self.left > 0

    def step(self) -> SimpleNamespace:
        if self.recording is not None:
            self.recording.append(self.call)
        out = SimpleNamespace(stats=_stats(-1, "idle") if self.call == 0 else _stats(self.call - 1))
        self.call += 1
        self.left -= 1
        return out


def test_a_chunks_last_call_is_described_by_the_step_it_launched(tmp_path):
    window = ProfileWindow(tmp_path, steps_per_kind=100, slow_steps=True, chunk=4)  # every chunk kept
    engine = _AsyncEngine(calls=15)
    observed = window.observe(engine)
    while engine.has_unfinished():
        observed.step()
    window.end_of_run(engine)
    record = window.record()
    chunks = [[record["calls"][i] for i in c["calls"]] for c in record["chunks"]]
    assert [[c["step"] for c in chunk] for chunk in chunks] == [[0, 1, 2, 3], [5, 6, 7, 8], [10, 11, 12, 13]]
    assert all(c["kind"] == "decode" for chunk in chunks for c in chunk)
    # each trace went on for the call that delivered its last step: a range no chunk holds
    assert engine.written == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]]
    assert [c["file"] for c in record["chunks"]][0] == "trace-steps0-3-rank{rank}.json.gz"


def test_the_runs_last_call_launched_no_step(tmp_path):
    window = ProfileWindow(tmp_path, steps_per_kind=100, slow_steps=True, chunk=4)
    engine = _AsyncEngine(calls=7)  # a chunk of 4 with its tail, then 2 calls: the run ends after the 7th
    observed = window.observe(engine)
    while engine.has_unfinished():
        observed.step()
    window.end_of_run(engine)
    calls = window.record()["calls"]
    assert [(c["step"], c["kind"]) for c in calls[-2:]] == [(5, "decode"), (None, "idle")]


def test_every_call_of_the_chunks_of_an_asynchronous_run_is_described(tmp_path):
    path = tmp_path / "prof.yaml"
    scenario = {**PROFILED, "engine": {**PROFILED["engine"], "async_scheduling": True}}
    path.write_text(yaml.safe_dump(scenario))
    window = ProfileWindow(tmp_path / "p", steps_per_kind=8, slow_steps=True, chunk=4)
    outcome = execute_run(
        RunRequest(load_scenario(path, [], "none"), tmp_path / "r", "v", step_observer=window)
    )
    profile = json.loads(
        write_profile(window.folder, window.record(), "v", "cpu", outcome.status).read_text()
    )
    assert outcome.status == "complete"
    calls, chunks = window.record()["calls"], window.record()["chunks"]
    assert len(chunks) >= 3, chunks
    for k, chunk in enumerate(chunks):
        members = [calls[i] for i in chunk["calls"]]
        last_of_run = k == len(chunks) - 1
        described = members[:-1] if last_of_run else members  # the run's last call launched no step
        assert all(c["kind"] in STEP_KINDS for c in described), [c["kind"] for c in members]
        steps = [c["step"] for c in described]
        assert steps == list(range(steps[0], steps[0] + len(steps)))
        if last_of_run and len(described) < len(members):
            assert members[-1]["kind"] == "idle"
        # the trace holds one range more than the chunk (the call that delivered its last step, when the
        # run went on), and the chunk's ranges are named after their steps
        with gzip.open(tmp_path / "p" / chunk["file"].format(rank=0), "rt") as f:
            events = json.load(f)["traceEvents"]
        ranges = sorted(
            (e["ts"], e["name"])
            for e in events
            if e.get("cat") == "user_annotation" and e["name"].startswith("llmbench.step")
        )
        assert len(ranges) == len(members) + (0 if last_of_run else 1)
        assert [n for _, n in ranges[: len(described)]] == [
            f"llmbench.step {c['step']} ({c['kind']})" for c in described
        ]
    assert not [s for s in profile["steps"] if s["kind"] == "unrecorded"]
