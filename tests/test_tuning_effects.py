"""Every tuning knob reaches the code it tunes: a probe per knob sets it and checks something only the knob
can change (the argument a kernel is launched with, the kernels a linear layer calls, the graphs captured,
the communicator built).

A knob changes how the work is cut, not what is computed: an engine that resolved one and then ignored it
would still give transformers' tokens, so parity (test_parity.py) cannot show it. A knob added to
``TUNING_CHECKS`` without a probe here fails ``test_every_knob_has_a_probe``.

The knobs in ``CUDA_ONLY`` act only on a CUDA device (CUDA Graphs, programmatic dependent launch, the
all-reduces between GPUs): on the CPU their probe checks what setting them there does (an error naming
what they need; off where left to the engine), and a probe marked gpu checks their effect on a GPU.
``decode_longest_first`` and ``decode_uniform_tiling`` act on the decode CUDA Graphs too: a gpu probe each
checks that part.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from engine_steps import run_steps

from llmbench import LLM, SamplingParams
from llmbench.engine.config import ConfigError, EngineConfig
from llmbench.engine.facts import triton_usable
from llmbench.engine.option_checks import TUNING_CHECKS
from llmbench.engine.resolve import resolve_here
from llmbench.engine.resolve_tuning import ResolvedTuning
from llmbench.layers import linear
from llmbench.layers.attention import backends
from llmbench.models import fused_decode

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
# The knobs that act only on a CUDA device: each has a gpu probe besides its CPU one.
CUDA_ONLY = (
    "cuda_graph_buckets",
    "graph_sampling",
    "prefill_graphs",
    "prefill_graph_tokens",
    "programmatic_launch_rows",
    "tp_all_reduce",
    "tp_fuse_norm",
    "tp_fuse_matmul",
)


def _llm(**options) -> LLM:
    """qwen3-tiny on DEVICE in float32, eager and synchronous unless ``options`` say otherwise."""
    options = {
        "max_model_len": 128,
        "num_kv_blocks": 64,
        "block_size": BLOCK,
        "device": DEVICE,
        "dtype": "float32",
        "cuda_graph": False,
        "async_scheduling": False,
        **options,
    }
    return LLM("qwen3-tiny", **options)


def _prompt(n: int, start: int = 1) -> list[int]:
    return [start + i % 50 for i in range(n)]


def _generate(llm: LLM, prompts: list[list[int]], max_tokens: int) -> None:
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))


def _steps(engine, arrivals: dict[int, list[tuple[str, list[int]]]]) -> list:
    return run_steps(engine, arrivals, GREEDY)


def _spy(monkeypatch: pytest.MonkeyPatch, module, name: str, keyword: str, default=None) -> list:
    """Each call of ``module.name`` from now on records its ``keyword`` argument (``default`` if not given)."""
    seen: list = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        seen.append(kwargs.get(keyword, default))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


def _needs_triton() -> None:
    if not triton_usable(DEVICE):
        pytest.skip("needs triton (or its interpreter)")


def _on_cpu(**options) -> ResolvedTuning:
    """The knobs as an engine on the CPU would resolve them (nothing is built)."""
    return resolve_here(EngineConfig.from_options("qwen3-tiny", device="cpu", **options)).tuning


def _refused_on_cpu(message: str, **options) -> None:
    """``options`` on the CPU: a ConfigError beginning with ``message`` (what the knob needs)."""
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        _on_cpu(**options)


# -- probes on any device ------------------------------------------------------------------------


def probe_decode_split_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    # the decode kernel's context slices: of 64 tokens, or chosen per step (None)
    _needs_triton()
    splits = _spy(monkeypatch, backends, "decode_attention", "split_tokens")
    for value, taken in ((64, 64), (0, None)):
        llm = _llm(attention_backend="triton", tuning={"decode_split_tokens": value})
        splits.clear()
        _generate(llm, [_prompt(5)], 3)
        assert splits and set(splits) == {taken}, (value, splits)


def probe_decode_longest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # The order pays only past the GPU's width (decode_config.order_pays): forced here from two rows.
    _needs_triton()
    monkeypatch.setattr("llmbench.kernels.decode_config.order_pays", lambda batch, heads, device: batch > 1)
    orders = _spy(monkeypatch, backends, "decode_attention", "order")
    for value in (True, False):
        llm = _llm(attention_backend="triton", tuning={"decode_longest_first": value})
        orders.clear()
        _generate(llm, [_prompt(3), _prompt(9)], 3)  # the second row's context is the longer
        taken = [o.tolist() for o in orders if o is not None]
        assert (taken and all(t == [1, 0] for t in taken)) if value else not taken, (value, taken)


def probe_decode_uniform_tiling(monkeypatch: pytest.MonkeyPatch) -> None:
    # Over a float8 cache, 16-bit queries: there the one-length tiles differ from the mixed-length ones.
    _needs_triton()
    uniform = _spy(monkeypatch, backends, "decode_attention", "uniform", False)
    for value in (True, False):
        llm = _llm(
            attention_backend="triton",
            dtype="float16",
            kv_cache_dtype="fp8_e4m3",
            tuning={"decode_uniform_tiling": value},
        )
        uniform.clear()
        _generate(llm, [_prompt(6), _prompt(6, 7)], 3)  # two contexts of one length
        assert (uniform and all(uniform)) if value else not any(uniform), (value, uniform)


def probe_mixed_step_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    # "b"'s prompt in chunks while "a" decodes: the prefill kernel starts after the decode (first_seq 1),
    # or takes it too.
    _needs_triton()
    firsts = _spy(monkeypatch, backends, "prefill_attention", "first_seq", 0)
    for value in (True, False):
        llm = _llm(
            attention_backend="triton", max_num_batched_tokens=16, tuning={"mixed_step_decodes": value}
        )
        firsts.clear()
        steps = _steps(llm.engine, {0: [("a", _prompt(6))], 1: [("b", _prompt(20, 3))]})
        assert "mixed" in {s.kind for s in steps}, [s.kind for s in steps]
        assert max(firsts) == (1 if value else 0), (value, firsts)


def probe_prefill_narrow_tiles_up_to(monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_triton()
    narrow = _spy(monkeypatch, backends, "prefill_attention", "narrow_up_to", 0)
    for value in (32, 0):
        llm = _llm(attention_backend="triton", tuning={"prefill_narrow_tiles_up_to": value})
        narrow.clear()
        _generate(llm, [_prompt(6)], 1)
        assert narrow and set(narrow) == {value}, (value, narrow)


def _skinny_kernels(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The skinny kernels, where the model calls them, replaced by their torch references (interpreted, the
    Triton ones take seconds a decode step); the rows of each call recorded by kernel."""
    from llmbench.kernels import skinny_matmul as skinny

    rows: dict[str, list[int]] = {"matmul": [], "silu": [], "norm": []}

    def into(out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        return y if out is None else out.copy_(y)

    def matmul(x, weight, bias=None, tiles=None, out=None):
        rows["matmul"].append(x.shape[0])
        return into(out, skinny.skinny_matmul_ref(x, weight, bias))

    def silu_matmul(x, weight, bias=None, tiles=None, out=None):
        rows["silu"].append(x.shape[0])
        return into(out, skinny.skinny_silu_matmul_ref(x, weight, bias))

    def norm_matmul(x, residual, norm_weight, eps, weight, bias=None, tiles=None, squares=None):
        assert squares is None, "tp > 1 only"
        rows["norm"].append(x.shape[0])
        return skinny.skinny_norm_matmul_ref(x, residual, norm_weight, eps, weight, bias)

    monkeypatch.setattr(linear, "skinny_matmul", matmul)
    monkeypatch.setattr(linear, "skinny_silu_matmul", silu_matmul)
    monkeypatch.setattr(fused_decode, "skinny_norm_matmul", norm_matmul)
    return rows


def probe_skinny_matmul_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three sequences decoding together: their steps of three rows take the skinny kernel up to 4 rows,
    # cuBLAS at 0 (nothing fused: the linear layers' own products).
    _needs_triton()
    rows = _skinny_kernels(monkeypatch)
    for value in (4, 0):
        llm = _llm(
            attention_backend="torch",
            triton_kernels=True,
            tuning={"skinny_matmul_rows": value, "skinny_fusion": "none"},
        )
        rows["matmul"].clear()
        _generate(llm, [_prompt(3), _prompt(4, 5), _prompt(5, 9)], 2)
        assert (set(rows["matmul"]) == {3}) if value else not rows["matmul"], (value, rows)


def probe_skinny_fusion(monkeypatch: pytest.MonkeyPatch) -> None:
    # One sequence's one-row decode step: the norm and the SiLU-and-multiply on the skinny kernel's loads.
    _needs_triton()
    rows = _skinny_kernels(monkeypatch)
    for fusion, fused in (("all", (True, True)), ("silu", (False, True)), ("none", (False, False))):
        llm = _llm(
            attention_backend="torch",
            triton_kernels=True,
            tuning={"skinny_matmul_rows": 1, "skinny_fusion": fusion},
        )
        rows["norm"].clear()
        rows["silu"].clear()
        _generate(llm, [_prompt(5)], 2)
        assert (bool(rows["norm"]), bool(rows["silu"])) == fused, (fusion, rows)


def probe_compile_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    modes = []

    def recorded(fn=None, **kwargs):  # the compile asked for, without inductor's minutes on a CPU
        modes.append(kwargs.get("mode"))
        return fn

    monkeypatch.setattr(torch, "compile", recorded)
    for mode in ("max-autotune-no-cudagraphs", "default"):
        modes.clear()
        _llm(attention_backend="sdpa", torch_compile=True, tuning={"compile_mode": mode})
        assert modes and set(modes) == {mode}, (mode, modes)


def probe_kv_cache_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: every layer's and head's scale, never changed; left to the engine: set from the first prefill.
    for scale in (0.5, None):
        llm = _llm(attention_backend="sdpa", kv_cache_dtype="fp8_e4m3", tuning={"kv_cache_scale": scale})
        _generate(llm, [_prompt(6)], 2)
        scales = llm.engine.runner.kv_scales
        given = torch.equal(scales, torch.full_like(scales, 0.5))
        assert given if scale else not torch.equal(scales, torch.ones_like(scales)), (scale, scales)


# -- on the CPU, the knobs of CUDA_ONLY say why they cannot apply (their gpu probes are below) ---------


def probe_cuda_graph_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    _refused_on_cpu(
        "tuning.cuda_graph_buckets sets the batch sizes that get a decode CUDA Graph: it needs cuda_graph=True",
        tuning={"cuda_graph_buckets": [3]},
    )
    assert _on_cpu().cuda_graph_buckets == ()


def probe_graph_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    _refused_on_cpu(
        "tuning.graph_sampling=True draws decode steps' tokens inside their CUDA Graphs: it needs cuda_graph=True",
        tuning={"graph_sampling": True},
    )
    assert _on_cpu().graph_sampling is False


def probe_prefill_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    _refused_on_cpu(
        "tuning.prefill_graphs=True runs prefill and mixed steps from CUDA Graphs cut at attention: it needs "
        "cuda_graph=True",
        tuning={"prefill_graphs": True},
    )
    tuning = _on_cpu()
    assert tuning.prefill_graphs is False and tuning.prefill_graph_tokens == ()


def probe_prefill_graph_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    _refused_on_cpu(
        "tuning.prefill_graph_tokens sets the token counts that get a prefill graph: it needs "
        "tuning.prefill_graphs",
        tuning={"prefill_graph_tokens": [24]},
    )
    assert _on_cpu().prefill_graph_tokens == ()


def probe_programmatic_launch_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    _refused_on_cpu(
        "tuning.programmatic_launch_rows=8 launches Triton kernels with programmatic dependent launch: it "
        "needs an NVIDIA GPU of compute capability 9.0 or later",
        tuning={"programmatic_launch_rows": 8},
    )
    assert _on_cpu().programmatic_launch_rows == 0
    assert _on_cpu(tuning={"programmatic_launch_rows": 0}).programmatic_launch_rows == 0


def probe_tp_all_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    _refused_on_cpu(
        "tuning.tp_all_reduce='symm_mem' reads the other GPUs' memory over NVLink: it needs tp > 1 on CUDA "
        "devices (got tp=2 on 'cpu')",
        tp=2,
        tuning={"tp_all_reduce": "symm_mem"},
    )
    _refused_on_cpu(
        "tuning.tp_all_reduce='nccl' is how tensor-parallel ranks sum their partial results: it needs tp > 1",
        tuning={"tp_all_reduce": "nccl"},
    )
    # torch.distributed's collective, named by what runs it: gloo on the CPU, asked for or left to the engine
    assert _on_cpu(tp=2).tp_all_reduce == "gloo"
    assert _on_cpu(tp=2, tuning={"tp_all_reduce": "nccl"}).tp_all_reduce == "gloo"
    assert _on_cpu().tp_all_reduce == "none"


def probe_tp_fuse_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    _refused_on_cpu(
        "tuning.tp_fuse_norm=True does each tensor-parallel all-reduce with the RMSNorm after it in one Triton "
        "kernel over the GPUs' shared memory: it needs a CUDA device",
        tp=2,
        tuning={"tp_fuse_norm": True},
    )
    assert _on_cpu(tp=2).tp_fuse_norm is False


def probe_tp_fuse_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    _refused_on_cpu(
        "tuning.tp_fuse_matmul=True sums each row-parallel product of a one-row decode step over the GPUs in "
        "the product's own kernel: it needs tuning.tp_fuse_norm",
        tp=2,
        tuning={"tp_fuse_matmul": True},
    )
    assert _on_cpu(tp=2).tp_fuse_matmul is False


# -- on a GPU ----------------------------------------------------------------------------------------


def _graphs(**options) -> LLM:
    """An engine on the GPU that replays its decode steps from CUDA Graphs (and, by default, its prefill
    steps of up to 64 tokens: a few prefill graphs to capture)."""
    options = {"max_num_batched_tokens": 64, **options}
    return _llm(device="cuda", attention_backend="triton", cuda_graph=True, **options)


def gpu_probe_cuda_graph_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    # two sequences decoding together: in the bucket of 3 asked for, or the default of 2
    for buckets, listed, taken in (([3], [3], 3), (None, [1, 2, 4, 8], 2)):
        llm = _graphs(max_num_seqs=8, tuning={"cuda_graph_buckets": buckets})
        assert llm.engine.startup.graph_buckets == listed
        steps = _steps(llm.engine, {0: [("a", _prompt(5)), ("b", _prompt(7, 3))]})
        assert {s.graph_bucket for s in steps if s.kind == "decode"} == {taken}, (buckets, steps)


def gpu_probe_graph_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    # Greedy rows need no cut: with it, only the prefill step samples outside a graph.
    for value in (True, False):
        engine = _graphs(tuning={"graph_sampling": value}).engine
        assert engine.runner.graphs.draws is value
        calls = []

        def counted(*args, calls=calls, sample=engine.sampler.sample):
            calls.append(1)
            return sample(*args)

        engine.sampler.sample = counted
        steps = _steps(engine, {0: [("a", _prompt(5))]})
        decodes = [s for s in steps if s.kind == "decode"]
        assert len(decodes) == GREEDY.max_tokens - 1 and all(s.graph_bucket for s in decodes), steps
        assert len(calls) == (1 if value else 1 + len(decodes)), (value, len(calls))


def gpu_probe_prefill_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in (True, False):
        llm = _graphs(max_num_batched_tokens=32, tuning={"prefill_graphs": value})  # buckets of 16 and 32
        pieces = llm.engine.runner.prefill_graphs
        assert (pieces is not None) is value
        _generate(llm, [_prompt(20)], 1)
        assert pieces is None or pieces.replays == 1


def gpu_probe_prefill_graph_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    # A prompt of 20 tokens runs in the bucket of 24 asked for (by default: 32), one of 50 eagerly.
    llm = _graphs(
        max_num_batched_tokens=64, tuning={"prefill_graphs": True, "prefill_graph_tokens": [24, 40]}
    )
    pieces = llm.engine.runner.prefill_graphs
    assert pieces.buckets == [24, 40]
    buckets = []
    real = pieces.run

    def run(*args):
        hidden, bucket = real(*args)
        buckets.append(bucket)
        return hidden, bucket

    pieces.run = run
    _generate(llm, [_prompt(20)], 1)
    _generate(llm, [_prompt(50, 7)], 1)  # (another start: no prefix of it cached)
    assert buckets == [24], buckets


def gpu_probe_programmatic_launch_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmbench.kernels import _triton, rmsnorm

    if torch.cuda.get_device_capability() < (9, 0) or not _triton.HAS_GDC:
        pytest.skip(
            "programmatic dependent launch needs a GPU of compute capability 9.0 (Hopper) and Triton 3.4"
        )
    launched = []
    real = rmsnorm.programmatic
    monkeypatch.setattr(
        rmsnorm, "programmatic", lambda t, rows: launched.append(real(t, rows)["PDL"]) or real(t, rows)
    )
    on = _llm(device="cuda", triton_kernels=True, tuning={"programmatic_launch_rows": 32})
    off = _llm(device="cuda", triton_kernels=True, tuning={"programmatic_launch_rows": 0})
    # each engine's steps launch as it was asked, whichever engine was built or ran last
    for llm, value in ((on, True), (off, False), (on, True)):
        launched.clear()
        _generate(llm, [_prompt(5)], 2)  # the prompt's norms: 5 rows
        assert (launched and all(launched)) if value else not any(launched), (value, launched)


def gpu_probe_decode_longest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # The graphs of buckets past the GPU's width take their rows longest first (the host path: the probe
    # above); qwen3-tiny's 2 KV heads: from 67 sequences on 132 multiprocessors.
    for value in (True, False):
        graphs = _graphs(max_num_seqs=128, tuning={"decode_longest_first": value}).engine.runner.graphs
        ordered = [b for b in graphs.buckets if graphs.ordered(b)]
        assert bool(ordered) is value, (value, ordered)


def gpu_probe_decode_uniform_tiling(monkeypatch: pytest.MonkeyPatch) -> None:
    # a second graph per bucket with the one-length tiles, where they differ (a float8 cache, 16-bit q)
    for value in (True, False):
        llm = _graphs(
            max_num_seqs=8,
            dtype="float16",
            kv_cache_dtype="fp8_e4m3",
            tuning={"decode_uniform_tiling": value},
        )
        keys = list(llm.engine.runner.graphs.graphs)
        assert any(uniform for _, uniform in keys) is value, (value, keys)


_TP2 = textwrap.dedent(
    """
    import json, sys
    from llmbench import LLM, SamplingParams
    llm = LLM("qwen3-tiny", **json.loads(sys.argv[1]))
    try:
        llm.generate([[1, 2, 3, 4, 5]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    finally:
        llm.engine.shutdown()
    s = llm.engine.startup
    print(json.dumps([s.all_reduce, s.all_reduce_norm, s.all_reduce_matmul]))
    """
)


@functools.cache
def _tp2_communicator(**tuning) -> tuple[str, bool, bool]:
    """What a tp=2 engine on two GPUs built: (its all-reduce, fused with the norms, and with the products).
    Each in a new interpreter: the one-shot all-reduce can be set up once per process."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    options = {"tp": 2, "device": "cuda", "dtype": "float32", "num_kv_blocks": 64, "block_size": BLOCK}
    options["tuning"] = tuning
    done = subprocess.run(
        [sys.executable, "-c", _TP2, json.dumps(options)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    used = json.loads(done.stdout.strip().splitlines()[-1])
    return used[0], used[1], used[2]


UNFUSED = {"tp_all_reduce": "symm_mem", "tp_fuse_norm": False}
NORM = {"tp_all_reduce": "symm_mem", "tp_fuse_norm": True, "tp_fuse_matmul": False}
NORM_MATMUL = {"tp_all_reduce": "symm_mem", "tp_fuse_norm": True, "tp_fuse_matmul": True}


def gpu_probe_tp_all_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _tp2_communicator(tp_all_reduce="nccl") == ("nccl", False, False)
    assert _tp2_communicator(**UNFUSED) == ("symm_mem", False, False)


def gpu_probe_tp_fuse_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _tp2_communicator(**NORM) == ("symm_mem", True, False)
    assert _tp2_communicator(**UNFUSED) == ("symm_mem", False, False)


def gpu_probe_tp_fuse_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _tp2_communicator(**NORM_MATMUL) == ("symm_mem", True, True)
    assert _tp2_communicator(**NORM) == ("symm_mem", True, False)


PROBES = {name: globals()[f"probe_{name}"] for name in TUNING_CHECKS if f"probe_{name}" in globals()}
GPU_PROBES = {
    name: globals()[f"gpu_probe_{name}"] for name in TUNING_CHECKS if f"gpu_probe_{name}" in globals()
}


def test_every_knob_has_a_probe() -> None:
    assert set(PROBES) == set(TUNING_CHECKS), (
        f"knobs without a probe: {sorted(set(TUNING_CHECKS) - set(PROBES))}"
    )
    assert set(CUDA_ONLY) <= set(GPU_PROBES), (
        f"without a gpu probe: {sorted(set(CUDA_ONLY) - set(GPU_PROBES))}"
    )


@pytest.mark.parametrize("knob", list(TUNING_CHECKS))
def test_each_knob_reaches_the_code_it_tunes(knob: str, monkeypatch: pytest.MonkeyPatch) -> None:
    PROBES[knob](monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("knob", list(GPU_PROBES))
def test_each_cuda_knob_acts_on_a_gpu(knob: str, monkeypatch: pytest.MonkeyPatch) -> None:
    GPU_PROBES[knob](monkeypatch)
