"""Engine options: every malformed value named with its path and what is allowed, all at once; every
"auto" decided by ``resolve`` from the config and the machine's facts (here made up: an H200 pair, a
torchrun job across hosts...), so the GPU's decisions are checked on any machine."""

from __future__ import annotations

import json
import re

import pytest
import torch

from llmbench.engine.config import ConfigError, EngineConfig, Tuning, check_option, nest, with_option
from llmbench.engine.facts import Facts, ModelFacts
from llmbench.engine.option_checks import ENGINE_CHECKS
from llmbench.engine.resolve import resolve
from llmbench.engine.resolve_tuning import (
    PREFILL_NARROW_TILES_UP_TO,
    PROGRAMMATIC_LAUNCH_ROWS,
    SKINNY_MATMUL_ROWS,
    default_buckets,
)
from llmbench.models.presets import PRESETS
from llmbench.suggest import did_you_mean


def model_facts(name: str) -> ModelFacts:
    return ModelFacts.of(name, PRESETS[name].config)


CPU = Facts(model=model_facts("qwen3-tiny"), triton=True)
CPU_INTERPRETED = Facts(model=model_facts("qwen3-tiny"), triton=True, triton_interpret=True)


def h200s(model: str = "qwen3-0.6b", **facts) -> Facts:
    """Two H200s of one host, Triton installed, ranks spawned by rank 0."""
    base = {
        "cuda_devices": 2,
        "device_name": "NVIDIA H200",
        "capability": (9, 0),
        "triton": True,
        "triton_gdc": True,
    }
    return Facts(model=model_facts(model), **{**base, **facts})


def resolved(facts: Facts = CPU, model: str | None = None, **options):
    return resolve(EngineConfig.from_options(model or facts.model.name, **options), facts)


def message(**options) -> str:
    with pytest.raises(ConfigError) as exc:
        EngineConfig.from_options("qwen3-tiny", **options)
    return str(exc.value)


# -- malformed values, where they enter ----------------------------------------------------------------


@pytest.mark.parametrize(
    "options,expected",
    [
        ({"max_num_seqs": "abc"}, "max_num_seqs: expected an integer in 1..1048576, got 'abc'"),
        ({"max_num_seqs": -5}, "max_num_seqs: expected an integer in 1..1048576, got -5"),
        ({"max_num_seqs": True}, "max_num_seqs: expected an integer in 1..1048576, got True"),
        (
            {"max_num_batched_tokens": 1.5e-3},
            "max_num_batched_tokens: expected an integer in 1..16777216, got 0.0015",
        ),
        (
            {"max_num_batched_tokens": 1500.5},
            "max_num_batched_tokens: expected an integer in 1..16777216, got 1500.5",
        ),
        ({"block_size": 2.5}, "block_size: expected an integer in 1..65536, got 2.5"),
        ({"block_size": 10**8}, "block_size: expected an integer in 1..65536, got 100000000"),
        ({"max_num_seqs": 10**11}, "max_num_seqs: expected an integer in 1..1048576, got 100000000000"),
        ({"tp": 0}, "tp: expected an integer in 1..1024, got 0"),
        ({"seed": -1}, "seed: expected an integer in 0..9223372036854775807, got -1"),
        ({"seed": 2**63}, "seed: expected an integer in 0..9223372036854775807, got 9223372036854775808"),
        ({"max_model_len": 1}, "max_model_len: expected an integer in 2..16777216 or auto, got 1"),
        (
            {"num_kv_blocks": "many"},
            "num_kv_blocks: expected an integer in 1..2147483647 or auto, got 'many'",
        ),
        (
            {"kv_cache_memory": "1 GB of it"},
            "kv_cache_memory: expected a number of bytes (an integer in 1..1,125,899,906,842,624 (1 PiB), or a size such as "
            "512MiB or 4GB) or "
            "auto, got '1 GB of it'",
        ),
        (
            {"gpu_memory_utilization": 1.5},
            "gpu_memory_utilization: expected a number in (0, 1] or auto, got 1.5",
        ),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization: expected a number in (0, 1] or auto, got 0"),
        (
            {"gpu_memory_utilization": "most"},
            "gpu_memory_utilization: expected a number in (0, 1] or auto, got 'most'",
        ),
        ({"cuda_graph": "yes please"}, "cuda_graph: expected true, false or auto, got 'yes please'"),
        ({"cuda_graph": 1}, "cuda_graph: expected true, false or auto, got 1"),
        ({"paged_kv": "yes"}, "paged_kv: expected true or false, got 'yes'"),
        ({"paged_kv": None}, "paged_kv: expected true or false, got None"),
        ({"torch_compile": "auto"}, "torch_compile: expected true or false, got 'auto'"),
        ({"dtype": "float13"}, "dtype: unsupported 'float13'; supported: auto, float32, float16, bfloat16"),
        ({"dtype": 16}, "dtype: unsupported 16; supported: auto, float32, float16, bfloat16"),
        ({"device": "tpu"}, "device: unsupported 'tpu'; supported: auto, cpu, cuda, cuda:N"),
        ({"device": "cuda:x"}, "device: unsupported 'cuda:x'; supported: auto, cpu, cuda, cuda:N"),
        (
            {"attention_backend": "xformers"},
            "attention_backend: unsupported 'xformers'; supported: auto, torch, sdpa, triton, flash_attn",
        ),
        (
            {"tuning": {"skinny_matmul_rows": 257}},
            "tuning.skinny_matmul_rows: expected an integer in 0..256 or auto, got 257",
        ),
        (
            {"tuning": {"decode_split_tokens": 100}},
            "tuning.decode_split_tokens: expected 0 (slices chosen per step), a positive multiple of 64 up to "
            "16,777,216, or auto, "
            "got 100",
        ),
        (
            {"tuning": {"cuda_graph_buckets": [0, 4]}},
            "tuning.cuda_graph_buckets: expected a list of batch sizes (integers in 1..1,048,576) or auto, got [0, 4]",
        ),
        (
            {"tuning": {"cuda_graph_buckets": "1,2"}},
            "tuning.cuda_graph_buckets: expected a list of batch sizes (integers in 1..1,048,576) or auto, got '1,2'",
        ),
        (
            {"tuning": {"prefill_graph_tokens": [0]}},
            "tuning.prefill_graph_tokens: expected a list of token counts (integers in 1..16,777,216) or auto, got [0]",
        ),
        (
            {"tuning": {"skinny_fusion": "norm"}},
            "tuning.skinny_fusion: unsupported 'norm'; supported: auto, all, silu, none",
        ),
        (
            {"tuning": {"tp_all_reduce": "mpi"}},
            "tuning.tp_all_reduce: unsupported 'mpi'; supported: auto, nccl, symm_mem",
        ),
        ({"tuning": {"tp_fuse_norm": "on"}}, "tuning.tp_fuse_norm: expected true, false or auto, got 'on'"),
        (
            {"tuning": {"compile_mode": "fast"}},
            "tuning.compile_mode: unsupported 'fast'; supported: auto, default, reduce-overhead, max-autotune, "
            "max-autotune-no-cudagraphs",
        ),
        (
            {"tuning": {"skinny_rows": 1}},
            "tuning.skinny_rows: unknown tuning knob (did you mean 'skinny_matmul_rows'?); valid: compile_mode, cuda_graph_buckets, "
            "decode_longest_first, decode_split_tokens, decode_uniform_tiling, graph_sampling, kv_cache_scale, "
            "mixed_step_decodes, prefill_graph_tokens, prefill_graphs, prefill_narrow_tiles_up_to, programmatic_launch_rows, skinny_fusion, skinny_matmul_rows, "
            "tp_all_reduce, tp_fuse_matmul, tp_fuse_norm",
        ),
        (
            {"tuning": 5},
            "tuning: expected a mapping of tuning knobs (cuda_graph_buckets, decode_split_tokens, decode_longest_first, "
            "decode_uniform_tiling, mixed_step_decodes, graph_sampling, prefill_graphs, prefill_graph_tokens, prefill_narrow_tiles_up_to, programmatic_launch_rows, "
            "skinny_matmul_rows, skinny_fusion, tp_all_reduce, "
            "tp_fuse_norm, tp_fuse_matmul, compile_mode, kv_cache_scale), got 5",
        ),
        (
            {"skinny_matmul_rows": 1},
            "skinny_matmul_rows: a tuning knob: set it under tuning (tuning.skinny_matmul_rows)",
        ),
    ],
)
def test_a_malformed_value_is_named_with_what_is_allowed(options, expected):
    assert message(**options) == expected


def test_an_unknown_option_names_the_valid_ones():
    text = message(cuda_graphs=True)
    assert text.startswith(
        "cuda_graphs: unknown engine option (did you mean 'cuda_graph'?); valid: async_scheduling, attention_backend,"
    )
    assert "cuda_graph," in text and text.endswith("triton_kernels, tuning")
    # nothing near enough to suggest: the list alone
    assert message(pdl=True).startswith("pdl: unknown engine option; valid:")  # (removed: it was slower)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as exc:
        EngineConfig.from_options(
            "qwen3-tiny",
            dtype="float13",
            max_num_seqs=-5,
            tuning={"skinny_fusion": "norm", "tp_fuse_norm": 2},
        )
    assert str(exc.value).splitlines() == [
        "dtype: unsupported 'float13'; supported: auto, float32, float16, bfloat16",
        "max_num_seqs: expected an integer in 1..1048576, got -5",
        "tuning.skinny_fusion: unsupported 'norm'; supported: auto, all, silu, none",
        "tuning.tp_fuse_norm: expected true, false or auto, got 2",
    ]
    assert [p.path for p in exc.value.problems] == [
        "dtype",
        "max_num_seqs",
        "tuning.skinny_fusion",
        "tuning.tp_fuse_norm",
    ]


def test_a_config_built_directly_is_checked_too():
    with pytest.raises(ConfigError, match=r"^max_num_seqs: expected an integer in 1..1048576, got 'abc'$"):
        EngineConfig(max_num_seqs="abc")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^tuning.skinny_fusion: unsupported 'x'"):
        Tuning(skinny_fusion="x")
    with pytest.raises(ConfigError, match=r"^tuning.bogus: unknown tuning knob"):
        EngineConfig(tuning={"bogus": 1})  # type: ignore[arg-type]


def test_auto_and_none_mean_the_same_and_values_are_normalised():
    a = EngineConfig.from_options(
        "qwen3-tiny", cuda_graph="auto", attention_backend=None, max_model_len="auto"
    )
    assert a == EngineConfig(model="qwen3-tiny")
    t = EngineConfig.from_options("qwen3-tiny", tuning={"cuda_graph_buckets": [4, 1], "tp_fuse_norm": "auto"})
    assert t.tuning == Tuning(cuda_graph_buckets=(4, 1))
    assert (
        EngineConfig.from_options("qwen3-tiny", tuning=Tuning(skinny_fusion="none")).tuning.skinny_fusion
        == "none"
    )


def test_one_option_is_checked_by_its_dotted_name():
    assert check_option("tuning.skinny_matmul_rows", 0) == (0, [])
    assert check_option("cuda_graph", "auto") == (None, [])
    _, problems = check_option("max_num_seqs", "abc", prefix="engine.")
    assert [str(p) for p in problems] == ["engine.max_num_seqs: expected an integer in 1..1048576, got 'abc'"]
    _, problems = check_option("tuning.warp", 1, prefix="engine.")
    assert [p.path for p in problems] == ["engine.tuning.warp"]


def test_dotted_names_nest_into_the_tuning_section():
    assert nest({"tp": 2, "tuning.skinny_fusion": "none", "tuning.tp_fuse_norm": False}) == {
        "tp": 2,
        "tuning": {"skinny_fusion": "none", "tp_fuse_norm": False},
    }
    base = {"tp": 2, "tuning": {"skinny_fusion": "none"}}
    assert with_option(base, "tuning.tp_fuse_norm", True) == {
        "tp": 2,
        "tuning": {"skinny_fusion": "none", "tp_fuse_norm": True},
    }
    assert base == {"tp": 2, "tuning": {"skinny_fusion": "none"}}  # left as it was


# -- resolve: every auto decided once, from the facts ---------------------------------------------------


def test_on_the_cpu_everything_resolves_to_the_plain_paths():
    r = resolved(CPU)
    assert (r.device, r.dtype, r.attention_backend) == ("cpu", "float32", "sdpa")
    assert (r.triton_kernels, r.cuda_graph, r.async_scheduling, r.prefix_cache) == (False, False, False, True)
    assert r.max_model_len == 4096  # the model's max_position_embeddings, under the 8192 default cap
    assert r.tuning.cuda_graph_buckets == () and r.tuning.skinny_matmul_rows == 0
    assert r.tuning.prefill_narrow_tiles_up_to == 0  # no Triton prefill kernel to tune
    assert (r.tuning.skinny_fusion, r.tuning.tp_all_reduce) == ("none", "none")
    assert not r.tuning.tp_fuse_norm and not r.tuning.tp_fuse_matmul


def test_on_an_h200_the_fast_paths_are_chosen():
    r = resolved(h200s("qwen3-0.6b"))
    assert (r.device, r.dtype, r.attention_backend) == ("cuda", "bfloat16", "triton")
    assert r.triton_kernels and r.cuda_graph and r.async_scheduling
    assert r.tuning.cuda_graph_buckets == tuple(default_buckets(256))
    assert r.tuning.cuda_graph_buckets[:6] == (1, 2, 4, 8, 16, 32) and r.tuning.cuda_graph_buckets[-1] == 256
    assert r.tuning.skinny_matmul_rows == SKINNY_MATMUL_ROWS > 1 and r.tuning.tp_all_reduce == "none"
    assert r.tuning.prefill_narrow_tiles_up_to == PREFILL_NARROW_TILES_UP_TO > 0
    assert resolved(h200s(), tuning={"prefill_narrow_tiles_up_to": 0}).tuning.prefill_narrow_tiles_up_to == 0
    # the skinny matmul past one row only over the rows programmatic launch covers, at tp=1
    assert resolved(h200s(), tuning={"programmatic_launch_rows": 16}).tuning.skinny_matmul_rows == 16
    assert resolved(h200s(), tuning={"programmatic_launch_rows": 256}).tuning.skinny_matmul_rows == 64
    for one_row in (
        {"tuning": {"programmatic_launch_rows": 0}},
        {"tuning": {"programmatic_launch_rows": 1}},
        {"torch_compile": True},
        {"tp": 2},
    ):
        assert resolved(h200s(), **one_row).tuning.skinny_matmul_rows == 1, one_row
    assert resolved(h200s(capability=(8, 0))).tuning.skinny_matmul_rows == 1
    # measured slower than cuBLAS past one row at qwen3-8b's hidden size (4096)
    assert resolved(h200s("qwen3-8b")).tuning.skinny_matmul_rows == 1
    assert resolved(h200s(), tuning={"skinny_matmul_rows": 8}).tuning.skinny_matmul_rows == 8
    assert r.tuning.decode_longest_first  # the Triton decode kernel's default
    assert not resolved(h200s(), attention_backend="sdpa").tuning.decode_longest_first
    assert (
        r.tuning.decode_uniform_tiling
        and not resolved(h200s(), attention_backend="sdpa").tuning.decode_uniform_tiling
    )
    assert r.tuning.graph_sampling  # the draw inside the decode graphs, where there are graphs
    assert not resolved(h200s(), cuda_graph=False).tuning.graph_sampling
    assert not resolved(CPU).tuning.graph_sampling
    # prefill and mixed steps from graphs cut at attention: buckets of powers of two up to the budget
    assert r.tuning.prefill_graphs
    assert r.tuning.prefill_graph_tokens == (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    assert resolved(h200s(), tuning={"prefill_graph_tokens": [512, 64]}).tuning.prefill_graph_tokens == (
        64,
        512,
    )
    assert resolved(h200s(), max_num_batched_tokens=3000).tuning.prefill_graph_tokens[-2:] == (2048, 3000)
    assert resolved(h200s(flash_attn=True), attention_backend="flash_attn").tuning.prefill_graph_tokens
    for off in ({"cuda_graph": False}, {"torch_compile": True}, {"attention_backend": "sdpa"}):
        assert resolved(h200s(), **off).tuning.prefill_graph_tokens == (), off
    assert resolved(h200s(), tuning={"prefill_graphs": False}).tuning.prefill_graph_tokens == ()
    assert resolved(CPU).tuning.prefill_graph_tokens == ()
    # programmatic dependent launch: Hopper and later, with the Triton kernels, uncompiled, a Triton that has it
    assert r.tuning.programmatic_launch_rows == PROGRAMMATIC_LAUNCH_ROWS > 0
    assert resolved(h200s(), tuning={"programmatic_launch_rows": 256}).tuning.programmatic_launch_rows == 256
    for off in (
        {"triton_kernels": False},
        {"torch_compile": True},
        {"tuning": {"programmatic_launch_rows": 0}},
    ):
        assert resolved(h200s(), **off).tuning.programmatic_launch_rows == 0, off
    assert resolved(h200s(capability=(8, 0))).tuning.programmatic_launch_rows == 0
    assert resolved(h200s(rocm=True, capability=(9, 4))).tuning.programmatic_launch_rows == 0  # an MI300
    assert resolved(h200s(triton_gdc=False)).tuning.programmatic_launch_rows == 0
    assert resolved(CPU).tuning.programmatic_launch_rows == 0
    assert r.max_model_len == 8192


@pytest.mark.parametrize(
    "model,fusion",
    [("qwen3-0.6b", "all"), ("qwen3-1.7b", "all"), ("qwen3-8b", "silu"), ("llama3.1-8b", "silu")],
)
def test_skinny_fusion_auto_fuses_the_norms_only_for_small_hidden_sizes(model, fusion):
    assert resolved(h200s(model)).tuning.skinny_fusion == fusion


def test_at_tp2_on_one_hosts_gpus_the_one_shot_all_reduce_takes_the_norms_and_products():
    r = resolved(h200s("qwen3-0.6b"), tp=2)
    assert r.tuning.tp_all_reduce == "symm_mem" and r.tuning.tp_fuse_norm and r.tuning.tp_fuse_matmul
    assert r.tuning.skinny_fusion == "silu"  # the norms go with the all-reduce, even at hidden size 1024
    plain = resolved(h200s("qwen3-0.6b"), tp=2, tuning={"tp_all_reduce": "nccl"})
    assert (plain.tuning.tp_fuse_norm, plain.tuning.tp_fuse_matmul, plain.tuning.skinny_fusion) == (
        False,
        False,
        "all",
    )


def test_a_second_engine_in_a_process_gets_nccl_and_symm_mem_says_why():
    used = h200s(symm_mem_used=True)
    r = resolved(used, tp=2)
    assert r.tuning.tp_all_reduce == "nccl" and not r.tuning.tp_fuse_norm
    with pytest.raises(
        ConfigError, match=r"can be set up once per process .* start this engine in a new process"
    ):
        resolved(used, tp=2, tuning={"tp_all_reduce": "symm_mem"})
    with pytest.raises(
        ConfigError, match=r"needs the one-shot all-reduce \(tuning.tp_all_reduce 'symm_mem' or"
    ):
        resolved(used, tp=2, tuning={"tp_fuse_norm": True})


def test_torchrun_across_hosts_gets_nccl_and_tp_must_equal_its_world_size():
    across = h200s(launcher="torchrun", world_size=2, local_world_size=1)
    assert resolved(across, tp=2).tuning.tp_all_reduce == "nccl"
    one_host = h200s(launcher="torchrun", world_size=2, local_world_size=2)
    assert resolved(one_host, tp=2).tuning.tp_all_reduce == "symm_mem"
    with pytest.raises(ConfigError) as exc:
        resolved(across, tp=2, tuning={"tp_all_reduce": "symm_mem"})
    assert str(exc.value) == (
        "tuning.tp_all_reduce='symm_mem' needs every rank on one host (NVLink); torchrun placed 1 of 2 ranks "
        "here: use tuning.tp_all_reduce='nccl' across hosts"
    )
    with pytest.raises(ConfigError) as exc:
        resolved(across, tp=4)
    assert str(exc.value) == (
        "torchrun started 2 processes (WORLD_SIZE) but tp=4: they must be equal (set tp=2, or start 4 processes)"
    )
    with pytest.raises(ConfigError, match="started 2 processes .* but tp=1"):  # each would run it all
        resolved(one_host, tp=1)


def test_the_cpu_at_tp2_uses_gloo_without_fusions():
    r = resolved(CPU, tp=2)
    assert r.tuning.tp_all_reduce == "gloo" and not r.tuning.tp_fuse_norm and not r.tuning.tp_fuse_matmul


@pytest.mark.parametrize(
    "facts,options,expected",
    [
        (CPU, {"cuda_graph": True}, "cuda_graph=True needs a CUDA device: CUDA Graphs cannot run on the CPU"),
        (
            h200s(),
            {"cuda_graph": True, "attention_backend": "sdpa"},
            "cuda_graph=True needs a graph-safe attention backend ('triton' or 'flash_attn'), got 'sdpa'",
        ),
        (
            CPU,
            {"paged_kv": False, "prefix_cache": True},
            "prefix_cache=True shares KV blocks between requests: it needs paged_kv=True",
        ),
        (
            CPU,
            {"attention_backend": "triton"},
            "attention_backend='triton' needs the triton package and a CUDA device (or TRITON_INTERPRET=1 to "
            "run its kernels on the CPU, slowly)",
        ),
        (
            h200s(flash_attn=True),
            {"dtype": "float32", "attention_backend": "flash_attn"},
            "attention_backend='flash_attn' runs in float16 or bfloat16 only (flash-attn has no float32 "
            "kernels): set dtype='bfloat16' or choose another attention backend",
        ),
        (
            # the root cause alone: on a GPU the dtype advice would follow, here it would mislead
            CPU,
            {"dtype": "float32", "attention_backend": "flash_attn"},
            "attention_backend='flash_attn' needs a CUDA device",
        ),
        (
            h200s(),
            {"attention_backend": "flash_attn"},
            "attention_backend='flash_attn' needs flash-attn installed (pip install 'llmbench[flash]'); "
            "available here: torch, sdpa, triton",
        ),
        (
            CPU,
            {"triton_kernels": True},
            "triton_kernels=True needs the triton package and a CUDA device (or TRITON_INTERPRET=1 on the CPU)",
        ),
        (
            CPU_INTERPRETED,
            {"triton_kernels": False, "tuning": {"skinny_matmul_rows": 1}},
            "tuning.skinny_matmul_rows=1 asks for a Triton kernel: it needs triton_kernels=True "
            "(or tuning.skinny_matmul_rows=0)",
        ),
        (
            CPU,
            {"tuning": {"decode_split_tokens": 64}},
            "tuning.decode_split_tokens tunes the Triton decode kernel: it needs attention_backend='triton', "
            "got 'sdpa'",
        ),
        (
            CPU,
            {"tuning": {"prefill_narrow_tiles_up_to": 512}},
            "tuning.prefill_narrow_tiles_up_to tunes the Triton prefill kernel: it needs "
            "attention_backend='triton', got 'sdpa'",
        ),
        (
            CPU,
            {"tuning": {"decode_longest_first": True}},
            "tuning.decode_longest_first=True orders the Triton decode kernel's work: it needs "
            "attention_backend 'triton'",
        ),
        (
            CPU,
            {"tuning": {"decode_uniform_tiling": True}},
            "tuning.decode_uniform_tiling=True picks the Triton decode kernel's tiling by the batch's lengths: it "
            "needs attention_backend 'triton'",
        ),
        (
            CPU,
            {"tuning": {"graph_sampling": True}},
            "tuning.graph_sampling=True draws decode steps' tokens inside their CUDA Graphs: it needs "
            "cuda_graph=True, triton_kernels=True (the draw is a Triton kernel)",
        ),
        (
            h200s(),
            {"triton_kernels": False, "tuning": {"graph_sampling": True}},
            "tuning.graph_sampling=True draws decode steps' tokens inside their CUDA Graphs: it needs "
            "triton_kernels=True (the draw is a Triton kernel)",
        ),
        (
            h200s(),
            {"torch_compile": True, "attention_backend": "sdpa", "tuning": {"prefill_graphs": True}},
            "tuning.prefill_graphs=True runs prefill and mixed steps from CUDA Graphs cut at attention: it needs "
            "cuda_graph=True, attention_backend 'triton' or 'flash_attn', torch_compile=False",
        ),
        (
            CPU_INTERPRETED,
            {"tuning": {"programmatic_launch_rows": 8}},
            "tuning.programmatic_launch_rows=8 launches Triton kernels with programmatic dependent launch: it "
            "needs an NVIDIA GPU of compute capability 9.0 or later, triton_kernels=True, a Triton with grid "
            "dependency control (3.4 or later)",
        ),
        (
            h200s(capability=(8, 0), triton_gdc=False),
            {"torch_compile": True, "tuning": {"programmatic_launch_rows": 1}},
            "tuning.programmatic_launch_rows=1 launches Triton kernels with programmatic dependent launch: it "
            "needs an NVIDIA GPU of compute capability 9.0 or later, torch_compile=False, a Triton with grid "
            "dependency control (3.4 or later)",
        ),
        (
            CPU,
            {"tuning": {"skinny_fusion": "silu"}},
            "tuning.skinny_fusion='silu' fuses into the skinny matmul, which is off "
            "(tuning.skinny_matmul_rows=0 or triton_kernels=False)",
        ),
        (
            CPU_INTERPRETED,
            {"tp": 2, "torch_compile": True, "tuning": {"tp_fuse_norm": True, "tp_all_reduce": "nccl"}},
            "tuning.tp_fuse_norm=True does each tensor-parallel all-reduce with the RMSNorm after it in one "
            "Triton kernel over the GPUs' shared memory: it needs a CUDA device, triton_kernels=True, the one-shot "
            "all-reduce (tuning.tp_all_reduce 'symm_mem' or 'auto'), torch_compile=False",
        ),
        (
            h200s(),
            {"tuning": {"tp_fuse_norm": True, "skinny_fusion": "all"}},
            "tuning.tp_fuse_norm=True does each tensor-parallel all-reduce with the RMSNorm after it in one "
            "Triton kernel over the GPUs' shared memory: it needs tp > 1, the one-shot all-reduce "
            "(tuning.tp_all_reduce 'symm_mem' or 'auto'), tuning.skinny_fusion other than 'all' (that fuses "
            "the norms into the matmuls)",
        ),
        (
            h200s(),
            {"tp": 2, "tuning": {"tp_fuse_matmul": True, "skinny_matmul_rows": 0}},
            "tuning.tp_fuse_matmul=True sums each row-parallel product of a one-row decode step over the GPUs "
            "in the product's own kernel: it needs tuning.skinny_matmul_rows >= 1 (the skinny matmul, whose "
            "kernel it extends)",
        ),
        (
            CPU,
            {"tp": 2, "tuning": {"tp_all_reduce": "symm_mem"}},
            "tuning.tp_all_reduce='symm_mem' reads the other GPUs' memory over NVLink: it needs tp > 1 on CUDA "
            "devices (got tp=2 on 'cpu')",
        ),
        (
            CPU,
            {"tuning": {"tp_all_reduce": "nccl"}},
            "tuning.tp_all_reduce='nccl' is how tensor-parallel ranks sum their partial results: it needs tp > 1 "
            "(got tp=1, one rank, nothing to sum); leave it 'auto'",
        ),
        (
            CPU,
            {"gpu_memory_utilization": 0.3},
            "gpu_memory_utilization=0.3 sizes the KV pool from a GPU's memory: on the CPU, kv_cache_memory (or "
            "num_kv_blocks) sizes it",
        ),
        (
            h200s(),
            {"kv_cache_memory": 1 << 30},
            "kv_cache_memory sizes the CPU's KV pool: on a GPU, gpu_memory_utilization (or num_kv_blocks) sizes it",
        ),
        (CPU, {"tp": 3}, "tp=3 does not divide the 4 attention heads of qwen3-tiny"),
        (
            CPU,
            {"max_model_len": 5000},
            "max_model_len=5000 exceeds the model's max_position_embeddings (4096)",
        ),
        (
            h200s(),
            {"block_size": 24},
            "block_size must be a power of two with attention_backend='triton', got 24",
        ),
        (h200s(), {"device": "cuda:2"}, "device='cuda:2': torch sees 2 CUDA device(s), cuda:0 to cuda:1"),
        (CPU, {"device": "cuda"}, "device='cuda' was asked for, but torch sees no CUDA device"),
    ],
)
def test_a_combination_that_cannot_run_here_says_what_it_needs(facts, options, expected):
    with pytest.raises(ConfigError) as exc:
        resolved(facts, **options)
    assert str(exc.value) == expected


def test_explicit_choices_are_kept_and_fusions_off_where_asked():
    r = resolved(
        h200s(), tuning={"skinny_matmul_rows": 4, "skinny_fusion": "none", "cuda_graph_buckets": [8, 2]}
    )
    assert (r.tuning.skinny_matmul_rows, r.tuning.skinny_fusion, r.tuning.cuda_graph_buckets) == (
        4,
        "none",
        (2, 8),
    )
    assert resolved(CPU, tp=2, tuning={"tp_fuse_norm": False}).tuning.tp_fuse_norm is False
    assert resolved(CPU, async_scheduling=True).async_scheduling is True


def test_what_results_record_holds_concrete_values_only():
    for facts, options in ((CPU, {}), (h200s(), {"tp": 2}), (h200s(symm_mem_used=True), {"tp": 2})):
        recorded = json.loads(json.dumps(resolved(facts, **options).to_dict()))

        def values(d, path=""):
            for key, value in d.items():
                if isinstance(value, dict):
                    yield from values(value, f"{path}{key}.")
                else:
                    yield f"{path}{key}", value

        found = dict(values(recorded))
        assert "auto" not in found.values()
        # only the KV pool's sizes and a float8 cache's scales may be left to the start-up (measured from
        # memory and from the first prefill), and a GPU's memory share on a CPU: nothing else is open
        assert {k for k, v in found.items() if v is None} <= {
            "kv_cache_memory",
            "num_kv_blocks",
            "tuning.kv_cache_scale",
            *(["gpu_memory_utilization"] if facts is CPU else []),
        }
        assert set(recorded["tuning"]) == {f for f in Tuning.__dataclass_fields__}


def test_resolve_is_a_function_of_its_inputs_alone():
    config = EngineConfig.from_options("qwen3-0.6b", tp=2)
    assert resolve(config, h200s()) == resolve(config, h200s())
    assert resolve(config, h200s()) != resolve(config, h200s(symm_mem_used=True))


def test_the_facts_say_how_ranks_start_and_whether_they_can_share_memory(monkeypatch):
    from llmbench.distributed import symmetric
    from llmbench.engine.facts import read_facts

    model = model_facts("qwen3-tiny")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(symmetric, "rendezvous_count", 0)
    facts = read_facts(model)
    assert facts.model == model and facts.launcher == "spawn" and facts.ranks_share_memory
    monkeypatch.setattr(symmetric, "rendezvous_count", 1)  # set up once in this process already
    assert read_facts(model).symm_mem_used and not read_facts(model).ranks_share_memory
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    for var, value in {**torchrun, "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(var, value)
    facts = read_facts(model)
    assert (facts.launcher, facts.world_size, facts.local_world_size) == ("torchrun", 2, 1)
    assert not facts.ranks_share_memory  # the other rank is on another host
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert read_facts(model).ranks_share_memory


def test_memory_the_options_leave_too_small_is_an_engine_options_error(monkeypatch):
    # The KV pool's budget on a GPU (total * gpu_memory_utilization - the warm-up's peak) below one
    # max_model_len sequence, and the CUDA Graphs running out of what the pool left: both say which
    # options give more memory, as engine-option errors (the CLI: "engine options: ...", exit 2).
    import torch

    from llmbench.engine import kv_cache

    config = resolved(h200s(), gpu_memory_utilization=0.5)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (80 << 30, 140 << 30))
    per_block = kv_cache.block_bytes(28, config.block_size, 8, 128, torch.bfloat16)
    assert kv_cache.num_blocks_for(config, 8192, per_block, 60 << 30) > 0
    with pytest.raises(ConfigError, match="fewer than one max_model_len=8192 sequence needs"):
        kv_cache.num_blocks_for(config, 8192, per_block, 139 << 29)  # 69.5 GiB: 0.5 left
    err = kv_cache.out_of_memory(
        "capturing the prefill CUDA Graphs", "tuning.prefill_graphs=False", config, 3 << 30
    )
    assert isinstance(err, ConfigError)
    assert str(err) == (
        "capturing the prefill CUDA Graphs ran out of GPU memory once the KV pool held 3.0 GiB: lower "
        "gpu_memory_utilization (now 0.5) or set num_kv_blocks, or set tuning.prefill_graphs=False"
    )


def test_a_mistyped_name_is_answered_with_the_nearest_one():
    assert did_you_mean("max_num_seq", ENGINE_CHECKS) == " (did you mean 'max_num_seqs'?)"
    assert did_you_mean("tpot", ["ttft_p50", "tpot_p50", "tpot_p99"]) == " (did you mean 'tpot_p50'?)"
    assert did_you_mean("warp_speed", ENGINE_CHECKS) == ""
    assert did_you_mean("tp", ["tpot_p50"]) == ""  # too short to stand for a longer name


def test_a_tuning_knob_set_for_a_feature_that_is_off_is_an_error():
    # set in vain it would change nothing: an error naming what it needs, never silently ignored
    cases = [
        ({"cuda_graph": False, "tuning": {"cuda_graph_buckets": [1, 2]}}, "it needs cuda_graph=True"),
        (
            {"tuning": {"prefill_graphs": False, "prefill_graph_tokens": [16]}},
            "it needs tuning.prefill_graphs",
        ),
        ({"tuning": {"compile_mode": "max-autotune"}}, "it needs torch_compile=True"),
    ]
    for options, message in cases:
        with pytest.raises(ConfigError, match=message):
            resolved(h200s(), **options)
    assert resolved(h200s(), tuning={"cuda_graph_buckets": [1, 2]}).tuning.cuda_graph_buckets == (1, 2)
    assert resolved(h200s(), torch_compile=True, tuning={"compile_mode": "max-autotune"})
    assert resolved(CPU, tuning={"compile_mode": "auto"})  # left to the engine: no request
    with pytest.raises(ConfigError, match="compile_mode='default' sets how torch.compile compiles"):
        resolved(CPU, tuning={"compile_mode": "default"})  # a mode given, even the default, asks for compile
    with pytest.raises(ConfigError, match="'reduce-overhead' replays CUDA Graphs .*: it needs a CUDA device"):
        resolved(CPU, torch_compile=True, tuning={"compile_mode": "reduce-overhead"})
    assert resolved(CPU, torch_compile=True, tuning={"compile_mode": "max-autotune-no-cudagraphs"})
    with pytest.raises(ConfigError, match="decode_split_tokens tunes the Triton decode kernel"):
        resolved(CPU, tuning={"decode_split_tokens": 0})  # 0 given is a request too
    assert resolved(CPU).tuning.decode_split_tokens == 0
    with pytest.raises(
        ConfigError, match=r"cuda_graph_buckets=\[1, 1000\] has batches larger than max_num_seqs=8"
    ):
        resolved(h200s(), max_num_seqs=8, tuning={"cuda_graph_buckets": [1, 1000]})
    with pytest.raises(ConfigError, match=r"prefill_graph_tokens=\[16, 100000\] has counts larger"):
        resolved(h200s(), max_num_batched_tokens=512, tuning={"prefill_graph_tokens": [16, 100000]})


def test_a_kv_pool_the_device_cannot_hold_names_the_options_that_size_it():
    from llmbench.engine.kv_cache import KVCacheError, allocate

    with pytest.raises(
        KVCacheError, match=r"the KV pool of 10000000000000 blocks of 16 tokens .* does not fit in cpu"
    ):
        allocate(2, 10**13, 16, 2, 64, torch.bfloat16, "cpu")
    pool = allocate(2, 4, 16, 2, 64, torch.bfloat16, "cpu")
    assert pool.layers[1].k.shape == (4, 16, 2, 64) and pool.layers[1].k.is_contiguous()


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8_e4m3"])
def test_a_cpu_kv_budget_must_hold_one_full_length_sequence(kv_dtype):
    """As on a GPU: a pool that could never hold one max_model_len request is refused with the sizes (on a
    CPU by resolve, before anything loads), not made larger than asked or left to refuse every long
    request later; resolve's arithmetic is the pool's own."""
    from llmbench import LLM

    options = dict(device="cpu", max_model_len=256, block_size=16, kv_cache_dtype=kv_dtype)
    per_block = LLM("qwen3-tiny", **options, num_kv_blocks=1).engine.runner.block_bytes
    one_sequence = 16 * per_block
    llm = LLM("qwen3-tiny", **options, kv_cache_memory=one_sequence)
    assert llm.engine.startup.kv_num_blocks == 16
    with pytest.raises(ConfigError) as info:
        LLM("qwen3-tiny", **options, kv_cache_memory=one_sequence - 1)
    assert str(info.value) == (
        f"kv_cache_memory={one_sequence - 1:,} bytes holds 15 blocks of 16 tokens ({per_block:,} bytes each), "
        f"fewer than one max_model_len=256 sequence needs (16, {one_sequence:,} bytes): raise kv_cache_memory "
        "or lower max_model_len"
    )


@pytest.mark.parametrize(
    "size,count",
    [
        ("512MiB", 512 << 20),
        ("4 GiB", 4 << 30),
        ("1.5GB", 1_500_000_000),
        ("4.1GB", 4_100_000_000),
        ("0.7GiB", 751_619_277),
        ("2kb", 2000),
        ("3 KiB", 3072),
        ("1e9", 10**9),
        ("100B", 100),
        ("2048", 2048),
        (1e9, 10**9),
    ],
)
def test_a_byte_budget_takes_a_size_with_its_unit(size, count):
    assert EngineConfig.from_options("qwen3-tiny", kv_cache_memory=size).kv_cache_memory == count


@pytest.mark.parametrize("size", ["0", "0.5B", "-1GB", "1.5", "4 GB RAM", "GB", 1.5, True])
def test_a_byte_budget_that_is_no_whole_positive_count_is_refused(size):
    with pytest.raises(
        ConfigError, match=rf"^kv_cache_memory: expected a number of bytes .*, got {re.escape(repr(size))}$"
    ):
        EngineConfig.from_options("qwen3-tiny", kv_cache_memory=size)


def test_a_whole_number_written_with_an_exponent_is_an_integer():
    # YAML gives 1e9 and 1.5e3 as floats: a count so written is taken as the integer it is
    config = EngineConfig.from_options("qwen3-tiny", max_num_batched_tokens=1.5e3, kv_cache_memory=1e9)
    assert config.max_num_batched_tokens == 1500 and isinstance(config.max_num_batched_tokens, int)
    assert config.kv_cache_memory == 10**9 and isinstance(config.kv_cache_memory, int)


def test_a_file_given_as_the_model_names_the_folder_to_give(tmp_path):
    from llmbench.models.registry import UnknownModelError, resolve_model

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UnknownModelError, match=f"is a file: .* \\(here perhaps '{tmp_path}'\\)"):
        resolve_model(str(tmp_path / "config.json"))


def test_an_unknown_model_or_metric_names_the_nearest_one(tmp_path):
    from llmbench.bench.errors import StoreError
    from llmbench.bench.report import build_report
    from llmbench.models.registry import UnknownModelError, resolve_model

    with pytest.raises(
        UnknownModelError, match=r"^Unknown model 'qwen3-06b' \(did you mean 'qwen3-0.6b'\?\)"
    ):
        resolve_model("qwen3-06b")
    with pytest.raises(StoreError, match=r"^Unknown metric: 'tpot' \(did you mean 'tpot_p50'\?\)\. Metrics"):
        build_report([tmp_path], metrics=["tpot"])


def test_weights_that_cannot_fit_where_they_go_are_refused_before_any_loads():
    eight = model_facts("qwen3-8b")  # 8.2e9 parameters: 30.5 GiB in float32, 15.3 GiB in bfloat16
    host = Facts(model=eight, host_memory_available=20 * 2**30)
    with pytest.raises(ConfigError) as exc:
        resolve(EngineConfig.from_options("qwen3-8b"), host)
    assert str(exc.value) == (
        "qwen3-8b in float32 needs 30.5 GiB of weights, more than the memory this machine has free now "
        "(20.0 GiB): use dtype='bfloat16' or a smaller model"
    )
    assert resolve(EngineConfig.from_options("qwen3-8b", dtype="bfloat16"), host).dtype == "bfloat16"
    small_gpu = h200s("qwen3-8b", device_memory=20 * 2**30)  # 18 GiB at gpu_memory_utilization 0.9
    with pytest.raises(ConfigError, match=r"needs 15\.3 GiB of weights, more than each GPU's 0\.5 share"):
        resolve(EngineConfig.from_options("qwen3-8b", gpu_memory_utilization=0.5), small_gpu)
    assert resolve(EngineConfig.from_options("qwen3-8b", tp=2, gpu_memory_utilization=0.5), small_gpu).tp == 2


def test_a_gpu_budget_given_on_the_cpu_is_an_error_even_at_its_default_value():
    # the check asks whether it was given, not whether it differs from what auto gives
    for value in (0.9, 0.5):
        with pytest.raises(ConfigError) as exc:
            resolved(CPU, gpu_memory_utilization=value)
        assert str(exc.value) == (
            f"gpu_memory_utilization={value} sizes the KV pool from a GPU's memory: on the CPU, kv_cache_memory "
            "(or num_kv_blocks) sizes it"
        )
    assert resolved(CPU).gpu_memory_utilization is None  # a GPU's share: nothing on a CPU reads one
    assert resolved(CPU, gpu_memory_utilization="auto").device == "cpu"  # how a CPU profile unsets it
    assert resolved(h200s()).gpu_memory_utilization == 0.9
    assert resolved(h200s(), gpu_memory_utilization=0.9).gpu_memory_utilization == 0.9


@pytest.mark.parametrize(
    "facts,budget,value",
    [(CPU, "kv_cache_memory", 64 << 20), (h200s(), "gpu_memory_utilization", 0.5)],
)
def test_a_memory_budget_beside_num_kv_blocks_is_an_error_naming_which_to_drop(facts, budget, value):
    # num_kv_blocks would size the pool and leave the budget silently unused
    with pytest.raises(ConfigError) as exc:
        resolved(facts, num_kv_blocks=10, **{budget: value})
    assert str(exc.value) == (
        f"num_kv_blocks=10 and {budget}={value} both size the KV pool, and num_kv_blocks would override "
        f"{budget}: drop {budget} to keep 10 blocks, or drop num_kv_blocks to size the pool from {budget}"
    )
    assert resolved(facts, num_kv_blocks=10).num_kv_blocks == 10
    assert getattr(resolved(facts, **{budget: value}), budget) == value


def test_every_contradiction_resolve_finds_is_reported_at_once_root_causes_first():
    with pytest.raises(ConfigError) as exc:
        resolved(CPU, cuda_graph=True, attention_backend="triton", torch_compile=True, async_scheduling=True)
    assert str(exc.value).splitlines() == [
        "attention_backend='triton' needs the triton package and a CUDA device (or TRITON_INTERPRET=1 to run "
        "its kernels on the CPU, slowly)",
        "cuda_graph=True needs a CUDA device: CUDA Graphs cannot run on the CPU",
    ]
    with pytest.raises(ConfigError) as exc:
        resolved(
            CPU,
            tp=3,
            gpu_memory_utilization=0.9,
            tuning={"decode_split_tokens": 64, "compile_mode": "max-autotune", "tp_all_reduce": "symm_mem"},
        )
    assert str(exc.value).splitlines() == [
        "tp=3 does not divide the 4 attention heads of qwen3-tiny",
        "gpu_memory_utilization=0.9 sizes the KV pool from a GPU's memory: on the CPU, kv_cache_memory (or "
        "num_kv_blocks) sizes it",
        "tuning.decode_split_tokens tunes the Triton decode kernel: it needs attention_backend='triton', got 'sdpa'",
        "tuning.tp_all_reduce='symm_mem' reads the other GPUs' memory over NVLink: it needs tp > 1 on CUDA "
        "devices (got tp=3 on 'cpu')",
        "tuning.compile_mode='max-autotune' sets how torch.compile compiles: it needs torch_compile=True",
    ]


def test_tensor_parallel_ranks_must_find_their_gpus():
    # rank r runs on the GPU after rank 0's: tp past the GPUs from the device asked is an error up front
    assert resolved(h200s(), tp=2).tp == 2
    with pytest.raises(
        ConfigError, match=r"tp=4 on device='cuda' takes GPUs 0..3; this machine has 2 \(0..1\)"
    ):
        resolved(h200s(), tp=4)
    with pytest.raises(ConfigError, match="takes GPUs 1..2; .* lower tp or start from an earlier GPU"):
        resolved(h200s(), device="cuda:1", tp=2)


def test_a_cpu_kv_pool_is_checked_by_arithmetic_before_anything_loads():
    import dataclasses

    from llmbench.engine.kv_cache import block_bytes

    m = CPU.model
    per_block = block_bytes(m.num_layers, 16, m.num_key_value_heads, m.head_dim, torch.float32)
    # too small for one max_model_len sequence: the same error start-up would give, now from resolve
    with pytest.raises(ConfigError, match="kv_cache_memory=1 bytes holds 0 blocks"):
        resolved(CPU, kv_cache_memory=1)
    small = dataclasses.replace(CPU, host_memory_available=per_block * 1000 + m.num_params * 4)
    assert resolved(small, num_kv_blocks=900).num_kv_blocks == 900
    with pytest.raises(
        ConfigError, match=r"the KV pool of 2,000 blocks of 16 tokens .* more than the memory"
    ):
        resolved(small, num_kv_blocks=2000)
    with pytest.raises(ConfigError, match=r"KV pool of 1,100 blocks .* over 2 ranks"):
        resolved(small, num_kv_blocks=1100, tp=2)  # each CPU rank holds a pool of its half of the heads
    assert resolved(small, num_kv_blocks=900, tp=2).tp == 2
    unknown = dataclasses.replace(CPU, host_memory_available=None)
    assert resolved(unknown, num_kv_blocks=2000).num_kv_blocks == 2000  # room unknown: start-up decides


def test_a_cpu_kv_pool_counts_in_the_processs_memory_from_the_start_whatever_its_dtype():
    # Pages never touched are not resident: a bf16 pool left as torch.empty gave it would be missing from
    # the run's memory figures while a (zeroed) float8 one was there, +180% for the smaller cache.
    import psutil

    from llmbench.engine.kv_cache import allocate

    process = psutil.Process()
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        before = process.memory_info().rss
        pool = allocate(2, 1024, 16, 8, 64, dtype, "cpu")  # 2 x 2 x 1024 x 16 x 8 x 64 entries
        grew = process.memory_info().rss - before
        size = 2 * 2 * 1024 * 16 * 8 * 64 * dtype.itemsize
        assert grew > 0.8 * size, (dtype, grew, size)
        del pool
