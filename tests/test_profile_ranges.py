"""The engine's phase ranges: seen by torch.profiler in the order of a step, free when nothing records,
and the layer marks a trace adds taken off again afterwards."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from llmbench.engine import ranges
from llmbench.engine.config import EngineConfig
from llmbench.engine.llm_engine import LLMEngine
from llmbench.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)


@pytest.fixture(scope="module")
def engine():
    e = LLMEngine(EngineConfig.from_options("qwen3-tiny", device="cpu", max_model_len=512))
    yield e
    e.shutdown()


def _names(prof) -> list[str]:
    events = sorted(
        (e for e in prof.events() if e.name.startswith(ranges.PREFIX)), key=lambda e: e.time_range.start
    )
    return [e.name[len(ranges.PREFIX) :] for e in events]


def test_a_range_is_a_no_op_unless_a_profiler_records():
    assert ranges.phase("schedule") is ranges.OFF and ranges.step_range() is ranges.OFF
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert ranges.phase("schedule") is not ranges.OFF
        with ranges.phase("schedule"):
            pass
    assert _names(prof) == ["schedule"]
    assert ranges.phase("schedule") is ranges.OFF


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_step_shows_its_phases_in_order(engine, asynchronous):
    if asynchronous:
        engine = LLMEngine(EngineConfig.from_options("qwen3-tiny", device="cpu", max_model_len=512,
                                                     async_scheduling=True))  # fmt: skip
    for i in range(2):
        engine.add_request(f"ranges-{asynchronous}-{i}", [3 + i] * 12, GREEDY)
    engine.step()
    engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.step()
    for i in range(2):
        engine.abort(f"ranges-{asynchronous}-{i}")
    phases = [n for n in _names(prof) if not n.startswith("layer.")]
    assert phases[0] == "step"
    order = ["schedule", "build_inputs", "copy_to_device", "forward", "sample", "copy_to_host", "bookkeeping"]
    firsts = [phases.index(p) for p in order]
    if asynchronous:  # the launched step's phases, the wait for the previous step's ids, bookkeeping
        assert firsts == sorted(firsts) and phases.count("copy_to_host") == 2
        engine.shutdown()
    else:  # bookkeeping twice: the scheduler's accounting before sampling, the tokens' delivery after
        assert firsts[:-1] == sorted(firsts[:-1]) and phases[-1] == "bookkeeping"


def test_a_trace_marks_layers_and_unmarks_them_after(engine, tmp_path):
    model = engine.runner.model
    backend = model.model.layers[0].self_attn.backend
    engine.add_request("tagged", [5] * 12, GREEDY)
    engine.step()
    engine.start_trace()
    assert any(m._forward_pre_hooks for m in model.modules()) and "forward" in vars(backend)
    engine.step()
    engine.stop_trace(str(tmp_path / "t-rank{rank}.json.gz"))
    engine.abort("tagged")
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    assert "forward" not in vars(backend)
    text = (tmp_path / "t-rank0.json.gz").read_bytes()
    import gzip

    trace = gzip.decompress(text).decode()
    for tag in ("norm", "rotary", "activation", "attention", "embedding"):
        assert f'"llmbench.layer.{tag}"' in trace, tag


def test_ranges_cost_under_one_percent_of_a_decode_step_when_nothing_records(engine):
    """Each step opens about ten ranges (two per phase at most); with no profiler each is a flag read and
    a shared object's empty enter and exit. Measured against the tiny model's own decode step on the CPU,
    the smallest step the engine takes here."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.add_request("cost", [7] * 12, GREEDY)
        engine.step()
        engine.step()
    per_step = len([n for n in _names(prof) if not n.startswith("layer.")]) / 2
    times = []
    for _ in range(15):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    engine.abort("cost")
    step = statistics.median(times)
    n = 100_000
    t = time.perf_counter()
    for _ in range(n):
        with ranges.phase("schedule"):
            pass
    per_range = (time.perf_counter() - t) / n
    print(f"{per_step:.0f} ranges a step x {per_range * 1e9:.0f} ns = {per_step * per_range * 1e6:.2f} us "
          f"against a decode step of {step * 1e3:.3f} ms: {100 * per_step * per_range / step:.3f}%")  # fmt: skip
    assert 6 <= per_step <= 20
    assert per_step * per_range < 0.01 * step
    assert torch.autograd.profiler._is_profiler_enabled is False
