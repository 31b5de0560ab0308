"""A run profiled in-process on the CPU (qwen3-tiny): the window, the breakdown of every recorded step
against the engine's own step time, and slow steps flagged, explained and recorded around."""

from __future__ import annotations

import gzip
import json
import statistics
import time

import pytest
import yaml

from llmbench.bench.profile.summary import write_profile
from llmbench.bench.profile.trace import analyse
from llmbench.bench.profile.window import ProfileWindow
from llmbench.bench.records import StepRecord
from llmbench.bench.report.frame import load_groups
from llmbench.bench.runner import RunRequest, execute_run
from llmbench.bench.scenario.loader import load_scenario
from llmbench.bench.slow_steps import find_slow_steps, slow_step_warning
from llmbench.bench.store import load_run
from llmbench.engine import step_counters
from llmbench.engine.sampler import Sampler

from tiny_models import PROFILED


def profiled_run(tmp_path, window: ProfileWindow, repeats: int = 1, **workload):
    path = tmp_path / "prof.yaml"
    scenario = {**PROFILED, "repeats": repeats, "workload": {**PROFILED["workload"], **workload}}
    path.write_text(yaml.safe_dump(scenario))
    resolved = load_scenario(path, [], "none")
    outcome = execute_run(RunRequest(resolved, tmp_path / "r", "v", step_observer=window))
    profile_path = write_profile(window.folder, window.record(), "v", "cpu", outcome.status)
    return outcome, json.loads(profile_path.read_text())


@pytest.mark.slow
def test_every_recorded_step_adds_up_to_the_engine_step_time(tmp_path):
    window = ProfileWindow(tmp_path / "p", steps_per_kind=4)
    outcome, profile = profiled_run(tmp_path, window)
    assert outcome.status == "complete" and profile["status"] == "complete" and profile["mode"] == "cpu"
    steps = [s for s in profile["steps"] if s["kind"] != "idle"]
    assert steps and len(steps) == len(window.record()["calls"])
    for s in steps:
        busy, outside = sum(s["device"].values()), sum(s["waited_for"].values())
        assert busy + outside == pytest.approx(s["wall"], rel=1e-6)
        assert s["engine_time"] <= s["wall"]  # the engine's own step time ends with its tokens
    # the breakdown covers the step as timed around the engine's step(): the typical step to within 10%
    # (on a busy machine the odd step is stretched by host work outside its range)
    gaps = [abs(s["wall"] - s["call_time"]) / s["call_time"] for s in steps]
    assert statistics.median(gaps) <= 0.1, gaps
    decode = profile["kinds"]["decode"]
    assert decode["steps"] >= 4
    for category in ("GEMM", "attention", "norm", "sampling"):
        assert decode["device"][category] > 0, category
    assert {"schedule", "forward", "sample", "bookkeeping"} <= set(decode["phases"])
    assert profile["kernels"][0]["total"] >= profile["kernels"][-1]["total"]
    (trace,) = [tmp_path / "p" / name for name in profile["traces"]]
    with gzip.open(trace, "rt") as f:
        recorded = json.load(f)
    # each step's range is named after the step of the profile's tables it ran, for a trace viewer's search
    ranges = sorted(
        (e["ts"], e["name"])
        for e in recorded["traceEvents"]
        if e.get("cat") == "user_annotation" and e["name"].startswith("llmbench.step")
    )
    calls = window.record()["calls"]
    assert [name for _, name in ranges] == [
        f"llmbench.step {c['step']} ({c['kind']})" if c["kind"] != "idle" else "llmbench.step (idle)"
        for c in calls
    ]
    assert [s["wall"] for s in profile["steps"]] == [b.wall for b in analyse(recorded).steps]  # read alike
    # the 4 prompts are prefilled together: one prefill step, fewer than asked, and the profile says so
    assert any(n.startswith("prefill: 1 step(s) of the 4") for n in profile["notes"])


def test_the_window_stops_recording_once_each_kind_has_its_steps(tmp_path):
    window = ProfileWindow(tmp_path / "p", steps_per_kind=1)
    outcome, profile = profiled_run(tmp_path, window)
    run_steps = load_run(outcome.run_dir).table("steps")
    assert [c["kind"] for c in window.record()["calls"]] == ["prefill", "decode"]
    assert len(run_steps) > 2  # the run went on unrecorded
    assert set(profile["kinds"]) == {"prefill", "decode"} and profile["notes"] == []


def test_a_reference_repeat_runs_untraced_and_the_traced_steps_are_compared_with_it(tmp_path):
    window = ProfileWindow(tmp_path / "p", steps_per_kind=2, reference_repeat=True)
    outcome, profile = profiled_run(tmp_path, window, repeats=2)
    steps = load_run(outcome.run_dir).table("steps")
    traced = {c["step"] for c in window.record()["calls"]}
    assert traced and set(steps[steps["step"].isin(traced)]["repeat"]) == {1}  # only the last repeat
    first = steps[(steps["repeat"] == 0) & (steps["kind"] == "decode")]["duration"]
    assert window.reference["decode"] == pytest.approx(list(first), rel=1e-9)
    decode = profile["kinds"]["decode"]
    window_steps = [s for s in profile["steps"] if s["window"] and not s["slow"] and s["kind"] == "decode"]
    assert decode["traced_median"] == pytest.approx(statistics.median(s["engine_time"] for s in window_steps))
    slow_cut = profile["slow_factor"] * first.median()
    assert decode["untraced_median"] == pytest.approx(first[first <= slow_cut].median(), rel=1e-9)
    waits = steps[(steps["repeat"] == 0) & (steps["kind"] == "decode")]["device_wait"]
    assert window.reference_waits["decode"] == pytest.approx(list(waits), rel=1e-9)
    assert decode["untraced_wait"] == pytest.approx(waits[first <= slow_cut].median(), rel=1e-9)
    assert "prefill" not in window.reference or len(window.reference["prefill"]) == 1
    assert profile["kinds"]["prefill"]["untraced_median"] is None  # one prefill step: too few to compare
    # The traced repeat says so, and is no run's measurement: the run's figures and a report's are the
    # untraced repeat's alone.
    run = load_run(outcome.run_dir)
    (point,) = run.summary["points"]
    assert [bool(r.get("traced")) for r in point["repeats"]] == [False, True]
    untraced = point["repeats"][0]["metrics"]
    assert point["metrics"]["tpot_p50"]["value"] == pytest.approx(untraced["tpot_p50"])
    (group,) = load_groups([outcome.run_dir])[0]
    assert group.repeat_values(point["label"], "tpot_p50") == [pytest.approx(untraced["tpot_p50"])]


def test_a_profile_run_kept_before_repeats_said_they_were_traced_leaves_its_traced_repeat_out(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    repeats = [
        {"repeat": r, "status": "complete", "metrics": {"tpot_p50": v}} for r, v in ((0, 1.0), (1, 9.0))
    ]
    summary = {"status": "complete", "points": [{"label": "offline", "repeats": repeats, "metrics": {}}]}
    for name, trace in (("profiled", ["--trace-reference"]), ("plain", [])):
        folder = run_dir / name
        folder.mkdir()
        meta = {"status": "complete", "scenario_name": name, "variant": "v", "command_line": ["run", *trace]}
        (folder / "meta.json").write_text(json.dumps(meta))
        (folder / "summary.json").write_text(json.dumps(summary))
    groups = {g.scenario: g for g in load_groups([run_dir])[0]}
    assert groups["profiled"].repeat_values("offline", "tpot_p50") == [1.0]
    assert groups["plain"].repeat_values("offline", "tpot_p50") == [1.0, 9.0]


@pytest.fixture
def one_slow_step(monkeypatch):
    """The 8th sampling call once the measured requests are in takes 1.5 s and compiles a Triton kernel
    meanwhile (both faked: the interpreter compiles nothing)."""
    real_add, real_sample = Sampler.add, Sampler.sample
    calls = {"measured": False, "n": 0}

    def add(self, request_id, params):
        calls["measured"] |= request_id.startswith("p0r0-")  # a measured request (the warm-up's are "w-...")
        return real_add(self, request_id, params)

    def sample(self, logits, rows=None):
        calls["n"] += calls["measured"]
        if calls["n"] == 8 and not calls.get("done"):
            calls["done"] = True
            step_counters.note_triton_compile()
            time.sleep(1.5)
        return real_sample(self, logits, rows)

    monkeypatch.setattr(Sampler, "add", add)
    monkeypatch.setattr(Sampler, "sample", sample)


@pytest.mark.slow
def test_a_slow_step_is_flagged_with_its_cause_and_recorded_around(tmp_path, one_slow_step):
    window = ProfileWindow(tmp_path / "p", steps_per_kind=1, slow_steps=True, chunk=3)
    outcome, profile = profiled_run(tmp_path, window, output_len=24)
    steps = load_run(outcome.run_dir).table("steps")
    flagged = steps[steps["slow"]]
    compiled = flagged[flagged["triton_compiles"] > 0]
    assert len(compiled) == 1 and "Triton compile" in compiled["slow_causes"].iloc[0]
    assert (steps.loc[~steps["slow"], "slow_causes"] == "").all()
    (line,) = [w for w in outcome.summary["warnings"] if "slow step" in w]
    assert "(>5x the median of their kind)" in line and "1 Triton compile" in line
    # recorded around: the chunk holding it was written, chunks with neither window nor slow steps dropped
    (slow,) = [s for s in profile["slow_steps"] if "Triton compile" in s["causes"]]
    assert slow["step"] == compiled["step"].iloc[0] and slow["wall"] >= 1.5
    chunks = window.record()["chunks"]
    calls = window.record()["calls"]
    assert any(slow["call"] in c["calls"] for c in chunks)
    assert all(any(calls[i]["window"] or calls[i]["slow"] for i in c["calls"]) for c in chunks)
    assert sum(len(c["calls"]) for c in chunks) < len(steps)  # some chunks were dropped
    assert len(profile["traces"]) == len(chunks)


def test_slow_steps_left_out_of_a_kinds_means_are_counted_in_a_note(tmp_path):
    # A factor barely above 1 makes about half the window's decode steps "slow": each is left out of the
    # means, and the profile must say how many (a factor low enough empties a kind's column).
    window = ProfileWindow(tmp_path / "p", steps_per_kind=6, factor=1.0001)
    _, profile = profiled_run(tmp_path, window, output_len=24)
    in_window = [c for c in profile["steps"] if c["window"] and c["slow"]]
    assert in_window
    for kind in {c["kind"] for c in in_window}:
        n = sum(c["kind"] == kind for c in in_window)
        assert any(note.startswith(f"{kind}: {n} of the window's") for note in profile["notes"]), profile[
            "notes"
        ]


def _step(kind: str, duration: float, tokens: int = 4, **counts) -> StepRecord:
    return StepRecord(1, kind, tokens, 0, tokens, None, 0, 1, 1, 0, counts.pop("num_preemptions", 0), 0.0,
                      duration, 0, **counts)  # fmt: skip


def test_slow_steps_are_judged_against_the_median_of_their_kind():
    steps = [_step("decode", 0.01) for _ in range(9)] + [_step("prefill", 0.2) for _ in range(5)]
    steps += [
        _step("decode", 0.2, triton_compiles=1),
        _step("decode", 0.3, memory_growth=64 * 2**20),
        _step("decode", 0.3, gc_time=0.25),
        _step("decode", 0.06, tokens=40),  # 6x the median, and ten times the median batch
        _step("decode", 0.2, memory_growth=2**20),  # too little growth to explain it
        _step("prefill", 0.5),  # 2.5x its own kind's median: not slow
    ]
    slow = find_slow_steps(steps)
    assert [s.index for s in slow] == [14, 15, 16, 17, 18]
    assert [s.causes for s in slow] == [
        ("Triton compile",), ("allocator growth",), ("garbage collection",), ("large step",), ("unexplained",),
    ]  # fmt: skip
    assert slow[0].ratio == pytest.approx(20.0)
    assert slow_step_warning(slow) == (
        "5 slow steps (>5x the median of their kind): 1 Triton compile, 1 allocator growth, "
        "1 garbage collection, 1 large step, 1 unexplained"
    )
    assert find_slow_steps(steps, factor=25.0) == [slow[1], slow[2]]
    assert slow_step_warning([]) is None


def test_a_large_step_explains_only_as_much_slowness_as_its_size():
    steps = [_step("decode", 0.01, tokens=50) for _ in range(9)]
    steps += [
        _step("decode", 0.2, tokens=500),  # 20x the median time with 10x the tokens: not its size alone
        _step("decode", 0.08, tokens=500),  # 8x with 10x: its size
    ]
    assert [s.causes for s in find_slow_steps(steps)] == [("unexplained",), ("large step",)]


class _Tracer:
    def start_trace(self) -> None:
        pass

    def stop_trace(self, path) -> None:
        pass


def test_the_first_step_of_a_recorded_chunk_is_put_down_to_the_trace_start(tmp_path):
    window = ProfileWindow(tmp_path, steps_per_kind=1, slow_steps=True, chunk=4)
    engine = _Tracer()
    durations = [0.01] * 8 + [0.5, 0.01, 0.01, 0.01] + [0.5, 0.5]  # slow: the 9th, 13th and 14th steps
    for i, d in enumerate(durations):
        window.before_step(engine)
        window.after_step(engine, _step("decode", d)._replace(step=i, end=d), d)
    slow = {c["step"]: c["causes"] for c in window.record()["calls"] if c["slow"]}
    assert slow == {8: ["trace start"], 12: ["trace start"], 13: ["unexplained"]}


def test_kinds_with_too_few_steps_have_no_slow_steps():
    steps = [_step("mixed", 0.01) for _ in range(3)] + [_step("mixed", 1.0)]
    assert find_slow_steps(steps) == []


def _decode_at(start: float, duration: float) -> StepRecord:
    return _step("decode", duration)._replace(start=start, end=start + duration)


def test_a_slow_step_while_telemetry_was_sampling_is_put_down_to_the_sample():
    steps = [_decode_at(0.01 * i, 0.01) for i in range(9)]
    steps += [_decode_at(0.09, 0.06), _decode_at(0.15, 0.06), _decode_at(0.30, 0.06), _decode_at(0.40, 0.06)]
    steps.append(_decode_at(0.5, 0.3))  # longer than the time between samples: it meets one regardless
    samples = [
        (0.085, 0.0955),  # began before the 10th step and ran into it
        (0.16, 0.161),  # inside the 11th
        (0.25, 0.26),  # over before the 12th began
        (0.46, 0.47),  # began as the 13th ended
        (0.6, 0.61),  # inside the 14th
    ]  # a sample every 0.115 s (the median gap)
    slow = find_slow_steps(steps, samples=samples)
    assert [s.index for s in slow] == [9, 10, 11, 12, 13]
    assert [s.causes for s in slow] == [
        ("telemetry sample",),
        ("telemetry sample",),
        ("unexplained",),
        ("unexplained",),
        ("unexplained",),
    ]
    assert slow_step_warning(slow).endswith(": 2 telemetry samples, 3 unexplained")
    assert [s.causes for s in find_slow_steps(steps)] == [("unexplained",)] * 5


def test_slow_steps_are_summed_up_by_cause_with_the_trace_starts_read_from_the_chunks():
    from llmbench.bench.profile.views import slow_causes, slow_summary_view

    def slow(step: int, causes: list[str], ms: float, ratio: float) -> dict:
        return {"step": step, "kind": "decode", "causes": causes, "engine_time": ms / 1e3, "ratio": ratio,
                "wall": 0.001, "device": {}, "idle": 0.0, "prefill_tokens": 0, "decode_tokens": 8, "num_seqs": 8}  # fmt: skip

    profile = {
        "variant": "baseline",
        "slow_factor": 5.0,
        "slow_steps_recorded": True,
        "traces": ["trace-steps16-31-rank0.json.gz", "trace-steps48-63-rank0.json.gz"],
        "slow_steps": [
            slow(16, ["unexplained"], 900.0, 450.0),  # a chunk's first step
            slow(20, ["unexplained"], 30.0, 15.0),
            slow(48, ["large step"], 400.0, 200.0),  # a chunk's first step, and large
            slow(50, ["Triton compile"], 100.0, 50.0),
        ],
    }
    assert slow_causes(profile) == [
        ["trace start"],
        ["unexplained"],
        ["large step", "trace start"],
        ["Triton compile"],
    ]
    view = slow_summary_view(profile)
    assert [r[:2] for r in view.rows] == [
        ["trace start", "2"],
        ["unexplained", "1"],
        ["large step", "1"],
        ["Triton compile", "1"],
    ]
    assert view.rows[0][3:] == ["650.000", "325.0", "900.000"]  # median engine step ms, median ratio, longest
    assert slow_causes({**profile, "slow_steps_recorded": False})[0] == ["unexplained"]  # no chunks then
    assert slow_summary_view({**profile, "slow_steps": []}) is None


def test_under_asynchronous_scheduling_a_call_is_described_by_the_step_it_launched(tmp_path):
    # A step() call launches the next step while it delivers the one before: the prompt's forward runs in
    # the call before the one that returns its first token. Each traced call must carry the step it launched.
    path = tmp_path / "prof.yaml"
    scenario = {
        **PROFILED,
        "engine": {**PROFILED["engine"], "async_scheduling": True},
        "workload": {**PROFILED["workload"], "input_len": 400},  # a prompt step far costlier than a decode
    }
    path.write_text(yaml.safe_dump(scenario))
    window = ProfileWindow(tmp_path / "p", steps_per_kind=2)
    outcome = execute_run(
        RunRequest(load_scenario(path, [], "none"), tmp_path / "r", "v", step_observer=window)
    )
    profile = json.loads(
        write_profile(window.folder, window.record(), "v", "cpu", outcome.status).read_text()
    )
    calls = window.record()["calls"]
    assert calls[0]["kind"] == "prefill" and calls[0]["window"]  # the first call launched the prompts
    # the trace went on for the call that delivered the last call's step: every call is described
    assert all(c["kind"] in ("prefill", "decode", "mixed") for c in calls), [c["kind"] for c in calls]
    prefill, decode = profile["kinds"]["prefill"], profile["kinds"]["decode"]
    assert prefill["busy"] > 5 * decode["busy"], (prefill["busy"], decode["busy"])  # the prompts' forward
