"""Greedy tokens of the engine equal a plain argmax loop over the transformers model, for every
architecture and every combination of toggles that changes no numerics."""

from __future__ import annotations

import itertools

import pytest
import torch

from llmbench import LLM, SamplingParams
from llmbench.engine import graph_inputs
from llmbench.engine.facts import triton_usable
from llmbench.engine.sequence import Sequence
from llmbench.engine.step_inputs import build_step
from llmbench.models.fused_decode import DecodePlan, FusedDecode

from tiny_models import hf_greedy, make_tiny

MAX_TOKENS = 12
BLOCK = 8
# Lengths around block boundaries, a single token, and two prompts sharing a 17-token prefix.
SHARED = [(7 * i + 3) % 384 for i in range(17)]
PROMPTS = [
    [5],
    [(3 * i + 1) % 384 for i in range(BLOCK)],
    [(5 * i + 2) % 384 for i in range(BLOCK + 1)],
    [(11 * i + 7) % 384 for i in range(2 * BLOCK - 1)],
    SHARED + [42, 43],
    SHARED + [44],
    [(13 * i + 5) % 384 for i in range(37)],
]


@pytest.fixture(scope="module", params=["qwen3", "qwen2", "llama"])
def arch_model(request, tmp_path_factory):
    arch = request.param
    folder = tmp_path_factory.mktemp(arch)
    hf = make_tiny(arch, folder, tie=(arch == "qwen2"), shard=(arch == "llama"))
    expected = [hf_greedy(hf, p, MAX_TOKENS) for p in PROMPTS]
    assert len({t for e in expected for t in e}) > 10, "tokens do not vary: parity would prove little"
    return arch, folder, expected


def _generate(folder, **options):
    options.setdefault("num_kv_blocks", 256)  # on a GPU the default would take 90% of its memory
    llm = LLM(str(folder), block_size=BLOCK, max_model_len=128, dtype="float32", **options)
    # NaN everywhere: a backend that reads a slot no token was written to poisons the output.
    llm.engine.runner.kv_pool.fill_(float("nan"))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.last_outputs = llm.generate(PROMPTS, params)
    return [o.token_ids for o in llm.last_outputs], llm


# Every toggle is one of two kinds. Those that change which tokens a step holds or when its work is
# launched, never what is computed for a token: greedy output equals transformers' under every combination
# of them (below). Those that change how a token is computed: each has tests of its own.
NUMERICS_NEUTRAL = ("paged_kv", "prefix_cache", "continuous_batching", "chunked_prefill", "async_scheduling")
OWN_TESTS = {
    "attention_backend": "test_greedy_matches_transformers_per_attention_backend",
    "triton_kernels": "test_greedy_matches_transformers_with_each_skinny_fusion",
    "torch_compile": "test_torch_compile_keeps_tokens_and_does_not_recompile",
    "cuda_graph": "test_cuda_graph_replay_keeps_tokens",
    "tp": "tests/test_tensor_parallel.py",
    "kv_cache_dtype": "tests/test_kv_fp8_engine.py",
}
COMBINATIONS = [
    dict(zip(NUMERICS_NEUTRAL, values, strict=True))
    for values in itertools.product([True, False], repeat=len(NUMERICS_NEUTRAL))
    if values[0] or not values[1]  # the prefix cache needs the paged pool
]


def test_every_toggle_is_checked_against_transformers_one_way_or_the_other():
    from pathlib import Path

    from llmbench.engine.config import TOGGLES

    assert not set(NUMERICS_NEUTRAL) & set(OWN_TESTS)
    assert set(NUMERICS_NEUTRAL) | set(OWN_TESTS) == set(TOGGLES), "a new toggle: which kind is it?"
    here = Path(__file__).resolve()
    for where in OWN_TESTS.values():
        path = here.parents[1] / where if where.startswith("tests/") else here
        assert path.exists() and (where.startswith("tests/") or f"def {where}(" in path.read_text()), where


@pytest.mark.parametrize(
    "toggles", COMBINATIONS, ids=lambda t: "-".join(f"{k}={int(v)}" for k, v in t.items())
)
def test_greedy_matches_transformers_under_scheduling_toggles(arch_model, toggles):
    _, folder, expected = arch_model
    got, _ = _generate(
        folder, attention_backend="torch", max_num_batched_tokens=24, max_num_seqs=4, **toggles
    )
    assert got == expected


# (flash_attn has no float32 kernels: test_kernels.py checks that backend against the reference in bf16)
# Triton under the CPU interpreter takes most of a minute an architecture: slow
@pytest.mark.parametrize("backend", ["torch", "sdpa", pytest.param("triton", marks=pytest.mark.slow)])
def test_greedy_matches_transformers_per_attention_backend(arch_model, backend):
    if backend == "triton" and not triton_usable("cuda" if torch.cuda.is_available() else "cpu"):
        pytest.skip("triton is not installed")
    _, folder, expected = arch_model
    fused = backend == "triton"
    skinny = 8 if fused else 0  # every decode step of these prompts through the skinny matmul
    got, llm = _generate(
        folder,
        attention_backend=backend,
        triton_kernels=fused,
        tuning={"skinny_matmul_rows": skinny},
        max_num_batched_tokens=24,
    )
    assert got == expected
    runner = llm.engine.runner
    # every linear layer up to `skinny` rows through the skinny kernel; the norms and the SiLU fused in
    # at one row (the kernel's tensor-core form from two rows on takes them unfused)
    assert runner.model.model.layers[0].mlp.down_proj.skinny_rows == skinny
    assert runner.decode_plan == (DecodePlan(skinny, 1, 1) if fused else DecodePlan())
    assert isinstance(runner.runnable, FusedDecode) == fused
    if fused:  # one sequence alone: every decode step through the fused one-row kernels
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        assert [o.token_ids for o in llm.generate(PROMPTS[:1], params)] == expected[:1]
    # Backends that read K/V from the cache run the fused attention prologue (q/k norm, RoPE, KV store in
    # one kernel); the others do not.
    attn = llm.engine.runner.model.model.layers[0].self_attn
    assert attn.fused_prologue == fused


# "all" (the default for small models) is what the triton case above runs on every architecture; the
# fusions' kernels do not depend on the architecture, so the others run on one.
@pytest.mark.slow
@pytest.mark.parametrize("arch_model", ["qwen3"], indirect=True)
@pytest.mark.parametrize("fusion", ["silu", "none"])
def test_greedy_matches_transformers_with_each_skinny_fusion(arch_model, fusion):
    # every decode step through the skinny matmul, with the SiLU fused in or not
    if not triton_usable("cuda" if torch.cuda.is_available() else "cpu"):
        pytest.skip("triton is not installed")
    _, folder, expected = arch_model
    got, llm = _generate(
        folder,
        attention_backend="triton",
        triton_kernels=True,
        tuning={"skinny_matmul_rows": 8, "skinny_fusion": fusion},
    )
    assert got == expected
    plan = llm.engine.runner.decode_plan
    assert (plan.norm_rows, plan.silu_rows) == {"silu": (0, 1), "none": (0, 0)}[fusion]
    assert isinstance(llm.engine.runner.runnable, FusedDecode) == (fusion != "none")


@pytest.mark.slow
def test_decode_in_fixed_length_slices_keeps_tokens(arch_model, monkeypatch):
    if not triton_usable("cuda" if torch.cuda.is_available() else "cpu"):
        pytest.skip("triton is not installed")
    from llmbench.layers.attention import backends

    _, folder, expected = arch_model
    splits = []
    real = backends.decode_attention

    def spy(*args, **kwargs):  # the knob must reach the kernel, not only leave the tokens as they were
        splits.append(kwargs.get("split_tokens"))
        return real(*args, **kwargs)

    monkeypatch.setattr(backends, "decode_attention", spy)
    got, _ = _generate(
        folder, attention_backend="triton", triton_kernels=True, tuning={"decode_split_tokens": 64}
    )
    assert got == expected
    assert splits and set(splits) == {64}, splits


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("chunked", [True, False])
def test_greedy_survives_forced_preemption(arch_model, chunked, async_):
    _, folder, expected = arch_model
    # 12 blocks of 8 tokens: the 7 prompts cannot all keep their KV while decoding. Under asynchronous
    # scheduling a sequence is preempted while its last token is still a placeholder.
    got, llm = _generate(
        folder,
        num_kv_blocks=12,
        chunked_prefill=chunked,
        max_num_batched_tokens=64,
        async_scheduling=async_,
    )
    assert got == expected
    assert sum(s.num_preemptions for s in llm.last_outputs) > 0, "nothing was preempted"
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_prefix_cache_serves_shared_prefix_and_keeps_tokens(arch_model):
    _, folder, expected = arch_model
    llm = LLM(
        str(folder),
        block_size=BLOCK,
        max_model_len=128,
        attention_backend="sdpa",
        dtype="float32",
        num_kv_blocks=256,
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    first = llm.generate([PROMPTS[4]], params)[0]
    second = llm.generate([PROMPTS[5]], params)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 2 * BLOCK  # the two full blocks of the shared 17-token prefix
    assert [first.token_ids, second.token_ids] == [expected[4], expected[5]]


@pytest.mark.slow
def test_torch_compile_keeps_tokens_and_does_not_recompile(arch_model):
    arch, folder, expected = arch_model
    if arch != "qwen3":
        pytest.skip("one architecture is enough: compiling takes ~20 s on 2 cores")
    got, llm = _generate(folder, torch_compile=True, attention_backend="sdpa", max_num_batched_tokens=24)
    assert got == expected
    assert llm.engine.startup.compile_time > 0
    assert llm.engine.startup.recompiles == 0, "torch.compile recompiled in steady state"


@pytest.mark.slow
def test_decode_rows_taken_longest_first_keep_tokens(arch_model, monkeypatch):
    # Tuning.decode_longest_first: the host orders each decode step's rows and the Triton decode kernel
    # takes them in that order. Forced here at any batch size (it pays only past the GPU's width).
    arch, folder, expected = arch_model
    if arch != "qwen3" or not triton_usable("cuda" if torch.cuda.is_available() else "cpu"):
        pytest.skip("one architecture is enough (interpreted Triton is slow); needs triton")
    taken = []

    def always(batch, num_kv_heads, device):
        taken.append(batch)
        return True

    monkeypatch.setattr("llmbench.kernels.decode_config.order_pays", always)
    got, llm = _generate(folder, attention_backend="triton", max_num_batched_tokens=24)
    assert got == expected
    assert llm.engine.config.tuning.decode_longest_first and max(taken) > 1
    # a step without decodes (a prompt alone, as the GPU's warm-up runs) has no rows to order
    prompt = Sequence("p", list(range(9)), SamplingParams(max_tokens=1), 0.0)
    prompt.block_table = [0, 1]
    with torch.inference_mode():  # as the engine uploads its steps (its buffers are inference tensors)
        assert llm.engine.runner.to_inputs(build_step([prompt], [9], BLOCK)).meta.decode_order is None


@pytest.mark.slow
@pytest.mark.parametrize("mixed_decodes", [False, True])
def test_mixed_steps_keep_tokens_whichever_kernel_takes_their_decodes(arch_model, monkeypatch, mixed_decodes):
    # Tuning.mixed_step_decodes: a step that mixes decodes with prompt chunks attends the decodes with the
    # decode kernel (the prefill kernel starting after them) or lets the prefill kernel take them all.
    arch, folder, expected = arch_model
    if arch != "qwen3" or not triton_usable("cuda" if torch.cuda.is_available() else "cpu"):
        pytest.skip("one architecture is enough (interpreted Triton is slow); needs triton")
    from llmbench.layers.attention import backends

    first_seqs = []
    real = backends.prefill_attention

    def spy(*args, **kwargs):
        first_seqs.append(kwargs.get("first_seq", 0))
        return real(*args, **kwargs)

    monkeypatch.setattr(backends, "prefill_attention", spy)
    got, llm = _generate(
        folder, attention_backend="triton", max_num_batched_tokens=24, max_num_seqs=4,
        tuning={"mixed_step_decodes": mixed_decodes},
    )  # fmt: skip
    assert got == expected
    assert llm.engine.config.tuning.mixed_step_decodes == mixed_decodes
    assert (max(first_seqs) > 0) == mixed_decodes, (
        "no mixed step had leading decodes" if mixed_decodes else ""
    )


@pytest.mark.gpu  # past the GPU's width: more sequences than its multiprocessors hold programs
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_a_large_decode_batch_taken_longest_first_keeps_tokens(arch_model, cuda_graph):
    _, folder, _ = arch_model
    runs = [_wide_batch(folder, 160, cuda_graph, {"decode_longest_first": on}) for on in (False, True)]
    assert runs[0] == runs[1]


def _wide_batch(folder, n: int, cuda_graph: bool, tuning: dict) -> list[list[int]]:
    """Greedy tokens of ``n`` prompts of mixed lengths, all in one decode batch of the Triton kernels."""
    prompts = [[(7 * i + j) % 384 for j in range(1 + (13 * i) % 60)] for i in range(n)]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm = LLM(
        str(folder), block_size=BLOCK, max_model_len=128, dtype="float32", num_kv_blocks=2048,
        attention_backend="triton", cuda_graph=cuda_graph, max_num_seqs=256, tuning=tuning,
    )  # fmt: skip
    return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.gpu  # programmatic dependent launch is an NVIDIA GPU's (Hopper and later)
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_programmatic_launch_keeps_tokens(arch_model, cuda_graph):
    # Each Triton kernel placed while the one before drains must still read only what that one wrote: the
    # greedy tokens of transformers, and of a batch wider than the GPU with the launches on and off.
    _, folder, expected = arch_model
    got, llm = _generate(
        folder, attention_backend="triton", triton_kernels=True, cuda_graph=cuda_graph,
        tuning={"programmatic_launch_rows": 256},
    )  # fmt: skip
    assert got == expected
    assert llm.engine.config.tuning.programmatic_launch_rows == 256
    runs = [_wide_batch(folder, 200, cuda_graph, {"programmatic_launch_rows": rows}) for rows in (0, 256)]
    assert runs[0] == runs[1]


@pytest.mark.gpu  # CUDA Graphs need a GPU
@pytest.mark.parametrize(
    "compile_, tables_apart",
    [(False, False), (True, False), (False, True)],
    ids=["eager", "compiled", "tables-apart"],
)
def test_cuda_graph_replay_keeps_tokens(arch_model, compile_, tables_apart, monkeypatch):
    _, folder, expected = arch_model
    if tables_apart:  # every step sends its block tables in a copy of their own (engine/graph_inputs.py)
        monkeypatch.setattr(graph_inputs, "INLINE_TABLE_BYTES", 0)
    got, llm = _generate(folder, attention_backend="triton", cuda_graph=True, torch_compile=compile_)
    assert got == expected
    assert llm.engine.startup.graph_buckets
