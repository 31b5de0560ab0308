"""Every toggle's on and off paths are both taken: a probe per toggle runs the engine both ways and checks
something only the path asked for can show (the steps' shapes, the pool's allocator, the kernels called).

Greedy parity (test_parity.py) cannot show this for a toggle that changes no numerics: an engine that
ignored it would still match transformers. A toggle added to ``TOGGLES`` without a probe here fails
``test_every_toggle_has_a_probe``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_steps import run_steps

from llmbench import LLM, SamplingParams
from llmbench.engine.config import TOGGLES, ConfigError

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
BLOCK = 8


def _engine(**options):
    options = {"max_model_len": 128, "num_kv_blocks": 64, "block_size": BLOCK, "device": "cpu", **options}
    return LLM("qwen3-tiny", **options).engine


def _steps(engine, arrivals: dict[int, list[tuple[str, list[int]]]], params=GREEDY) -> list:
    return run_steps(engine, arrivals, params)


def _prompt(n: int, start: int = 1) -> list[int]:
    return [start + i % 50 for i in range(n)]


def probe_paged_kv(value: bool) -> None:
    # One short sequence: the paged pool gives it the blocks its tokens need, the slab a whole max_model_len.
    engine = _engine(paged_kv=value, prefix_cache=False)
    used = max(s.kv_blocks_used for s in _steps(engine, {0: [("a", _prompt(5))]}))
    assert used == (2 if value else 128 // BLOCK), used


def probe_prefix_cache(value: bool) -> None:
    shared = _prompt(4 * BLOCK)
    engine = _engine(prefix_cache=value)
    steps = _steps(engine, {0: [("a", [*shared, 90, 91])], 12: [("b", [*shared, 92, 93])]})
    hits = sum(s.prefix_cache_hit_tokens for s in steps)
    assert (hits >= 3 * BLOCK) if value else hits == 0, hits


def probe_continuous_batching(value: bool) -> None:
    # "b" arrives while "a" decodes: it joins at once, or waits until "a" is done.
    engine = _engine(continuous_batching=value, async_scheduling=False)
    steps = _steps(engine, {0: [("a", _prompt(6))], 2: [("b", _prompt(6, 7))]}, GREEDY)
    joined = [i for i, s in enumerate(steps) if i > 0 and s.num_prefill_tokens > 0]
    a_done = GREEDY.max_tokens  # "a": its prompt step, then a decode step per token after the first
    assert (joined[0] < a_done) if value else (joined[0] >= a_done), (joined, [s.kind for s in steps])
    assert any(s.batch_limit == "static_batch" for s in steps) is not value


def probe_chunked_prefill(value: bool) -> None:
    # A 40-token prompt under a 16-token budget while another sequence decodes.
    engine = _engine(chunked_prefill=value, max_num_batched_tokens=16, async_scheduling=False)
    steps = _steps(engine, {0: [("a", _prompt(6))], 2: [("b", _prompt(40, 3))]})
    kinds = {s.kind for s in steps}
    most = max(s.num_prefill_tokens for s in steps)
    assert ("mixed" in kinds and most <= 16) if value else ("mixed" not in kinds and most == 40), (
        kinds,
        most,
    )


def probe_attention_backend(value: bool) -> None:
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    backend = "sdpa" if value else "torch"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
        engine = _engine(attention_backend=backend)
        _steps(engine, {0: [("a", _prompt(6))]})
    assert bool(calls) is value, (backend, len(calls))


def probe_triton_kernels(value: bool) -> None:
    from llmbench.kernels import rmsnorm

    called = {"triton": 0, "torch": 0}
    with pytest.MonkeyPatch.context() as mp:
        for name, key in (("rms_norm", "triton"), ("rms_norm_ref", "torch")):
            real = getattr(rmsnorm, name)
            mp.setattr(
                rmsnorm,
                name,
                lambda *a, real=real, key=key, **k: called.__setitem__(key, called[key] + 1) or real(*a, **k),
            )
        # Triton runs on a GPU, or on the CPU under its interpreter (where there is no GPU: conftest.py)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        engine = _engine(triton_kernels=value, attention_backend="torch", device=device)
        _steps(
            engine, {0: [("a", _prompt(6))]}, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        )
    assert (called["triton"] > 0 and called["torch"] == 0) if value else (called["triton"] == 0), called


def probe_torch_compile(value: bool) -> None:
    compiled = []

    def recorded(fn=None, **kwargs):  # the compile asked for, without inductor's minutes on a CPU
        compiled.append(fn)
        return fn

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "compile", recorded)
        engine = _engine(torch_compile=value)
        _steps(
            engine, {0: [("a", _prompt(6))]}, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        )
    assert bool(compiled) is value, compiled


def probe_cuda_graph(value: bool) -> None:
    if not torch.cuda.is_available():  # asked for on a CPU it says why it cannot run, never ignored
        if value:
            with pytest.raises(ConfigError, match="cuda_graph=True needs a CUDA device"):
                _engine(cuda_graph=True)
        else:
            assert _engine(cuda_graph=False).config.cuda_graph is False
        return
    engine = _engine(cuda_graph=value, device="cuda")
    steps = _steps(engine, {0: [("a", _prompt(6))]})
    buckets = [s.graph_bucket for s in steps if s.kind == "decode"]
    assert all(b is not None for b in buckets) if value else all(b is None for b in buckets), buckets


def probe_async_scheduling(value: bool) -> None:
    # With it, a step is launched before the ids of the one before are read: the first call launches and
    # returns an idle step, and the engine holds a step in flight between calls.
    engine = _engine(async_scheduling=value)
    engine.add_request("a", _prompt(6), GREEDY)
    first = engine.step().stats
    assert (first.kind == "idle" and engine._inflight is not None) if value else first.kind == "prefill"
    while engine.has_unfinished():
        engine.step()


def probe_tp(value: bool) -> None:
    engine = _engine(tp=2 if value else 1)
    try:
        assert (engine.workers is not None) is value
        assert engine.config.tp == (2 if value else 1)
        steps = _steps(engine, {0: [("a", _prompt(6))]})
        assert len(steps) >= GREEDY.max_tokens
    finally:
        engine.shutdown()


def probe_kv_cache_dtype(value: bool) -> None:
    engine = _engine(kv_cache_dtype="fp8_e4m3" if value else "auto", attention_backend="torch")
    pool = engine.runner.kv_pool.dtype
    assert (pool == torch.float8_e4m3fn) if value else (pool == torch.float32), pool
    _steps(engine, {0: [("a", _prompt(6))]}, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))


PROBES = {name: globals()[f"probe_{name}"] for name in TOGGLES if f"probe_{name}" in globals()}


def test_every_toggle_has_a_probe():
    assert set(PROBES) == set(TOGGLES), f"toggles without a probe: {sorted(set(TOGGLES) - set(PROBES))}"


@pytest.mark.parametrize("value", [True, False], ids=["on", "off"])
@pytest.mark.parametrize("toggle", TOGGLES)
def test_both_paths_of_each_toggle_are_taken(toggle, value):
    if toggle == "tp" and value:
        pytest.importorskip("torch.distributed")
    PROBES[toggle](value)


def test_the_config_the_engine_runs_carries_every_option_a_user_can_set():
    # An option accepted (EngineConfig, its check) but missing from what resolve() returns would be
    # accepted and then ignored: the engine reads only the resolved config.
    from llmbench.engine.config import EngineConfig, Tuning
    from llmbench.engine.option_checks import ENGINE_CHECKS, TUNING_CHECKS
    from llmbench.engine.resolve import ResolvedConfig
    from llmbench.engine.resolve_tuning import ResolvedTuning

    def names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert names(EngineConfig) - names(ResolvedConfig) == set()
    assert names(Tuning) - names(ResolvedTuning) == set()
    assert set(ENGINE_CHECKS) == names(EngineConfig) - {"model", "tuning"}
    assert set(TUNING_CHECKS) == names(Tuning)


def test_the_readme_toggle_table_lists_the_toggles():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("| toggle | on | off | default |", 1)[1].split("\n\n", 1)[0]
    listed = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    assert listed == list(TOGGLES)
