"""The public API: options checked where they enter, requests the engine cannot serve rejected clearly,
timestamps and step statistics reported, presets usable."""

from __future__ import annotations

import pytest
import torch

from llmbench import LLM, SamplingParams
from llmbench.engine.config import ConfigError, EngineConfig
from llmbench.engine.llm_engine import LLMEngine, RequestError
from llmbench.models.presets import PRESETS

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    return LLM("qwen3-tiny", max_model_len=256, num_kv_blocks=64)


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(
        ConfigError, match=r"Unknown engine option\(s\): cuda_graphs\. Valid options: .*cuda_graph,"
    ):
        LLM("qwen3-tiny", cuda_graphs=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_cuda_graph_on_cpu_says_it_needs_a_gpu():
    with pytest.raises(ConfigError, match="cuda_graph=True needs a CUDA device"):
        EngineConfig.from_options("qwen3-tiny", device="cpu", cuda_graph=True)


def test_prefix_cache_without_paged_kv_is_refused():
    with pytest.raises(ConfigError, match="prefix_cache=True .* needs paged_kv=True"):
        EngineConfig.from_options("qwen3-tiny", paged_kv=False, prefix_cache=True)


def test_unsupported_backend_lists_supported():
    with pytest.raises(
        ConfigError,
        match=r"Unsupported attention backend: 'xformers'\. Supported: \['torch', 'sdpa', 'triton', 'flash_attn'\]",
    ):
        EngineConfig.from_options("qwen3-tiny", attention_backend="xformers")


def test_unknown_model_lists_presets():
    with pytest.raises(ConfigError, match="not a preset .*qwen3-0.6b"):
        LLM("no-such-model")


def test_prompt_longer_than_max_model_len_is_rejected(tiny):
    with pytest.raises(RequestError, match="does not fit max_model_len=256"):
        tiny.generate([[1] * 256], GREEDY)
    assert not tiny.engine.has_unfinished()


def test_request_larger_than_the_pool_is_rejected_not_hung(tiny):
    # 64 blocks of 16 tokens = 1024 tokens; max_model_len 256 fits, so shrink the pool instead
    llm = LLM("qwen3-tiny", max_model_len=256, num_kv_blocks=4)
    with pytest.raises(RequestError, match="needs 6 KV blocks .* the whole pool has 4"):
        llm.generate([[1] * 60], SamplingParams(max_tokens=30, ignore_eos=True))


def test_out_of_vocabulary_token_is_rejected(tiny):
    with pytest.raises(RequestError, match=r"outside \[0, 4096\)"):
        tiny.generate([[1, 5000]], GREEDY)


def test_generate_returns_tokens_text_and_timestamps(tiny):
    outs = tiny.generate(["hello", [1, 2, 3]], GREEDY)
    assert [len(o.token_ids) for o in outs] == [6, 6]
    for o in outs:
        assert o.finish_reason == "length"
        assert o.arrival_time <= o.first_scheduled_time <= o.token_times[0]
        assert o.token_times == sorted(o.token_times) and o.finish_time == o.token_times[-1]
        assert isinstance(o.text, str)


def test_eos_stops_unless_ignored():
    llm = LLM("qwen3-tiny", num_kv_blocks=128)
    free = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0]
    eos = free.token_ids[3]
    llm.engine.eos_token_ids = frozenset({eos})
    stopped = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=20))[0]
    first = free.token_ids.index(eos)
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: first + 1]


def test_step_statistics_account_for_every_token():
    engine = LLMEngine(
        EngineConfig.from_options("qwen3-tiny", max_num_batched_tokens=32, block_size=8, num_kv_blocks=128)
    )
    prompts = [[7] * 40, [3] * 5]
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, GREEDY)
    steps, events = [], []
    while engine.has_unfinished():
        out = engine.step()
        steps.append(out.stats)
        events += out.tokens
    assert sum(s.num_prefill_tokens for s in steps) == 45
    assert sum(s.num_decode_tokens for s in steps) == 2 * (GREEDY.max_tokens - 1)
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in steps) <= 32
    assert {s.kind for s in steps} >= {"prefill", "decode"}
    assert len(events) == 2 * GREEDY.max_tokens
    assert steps[-1].kv_blocks_used == 0 and steps[-1].kv_blocks_free == engine.kv.num_blocks
    assert all(s.end_time >= s.start_time for s in steps)


@pytest.mark.parametrize("name", ["qwen3-tiny"])
def test_preset_greedy_tokens_vary_with_context(name):
    outs = LLM(name, num_kv_blocks=128).generate(
        [[1, 2, 3], [4, 5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    )
    for o in outs:
        assert len(set(o.token_ids)) >= 8, o.token_ids
    assert outs[0].token_ids != outs[1].token_ids


def test_presets_have_the_published_shapes():
    # Parameter counts of the real checkpoints (embedding included), within rounding.
    expected = {"qwen3-0.6b": 0.596e9, "qwen3-8b": 8.19e9, "llama3.2-1b": 1.236e9, "llama3.1-8b": 8.03e9}
    for name, n in expected.items():
        assert abs(PRESETS[name].config.num_params() - n) / n < 0.01, name


def test_decode_split_tokens_is_checked_where_it_enters():
    with pytest.raises(ConfigError, match="decode_split_tokens must be a positive multiple of 64, got 100"):
        EngineConfig.from_options("qwen3-tiny", device="cpu", decode_split_tokens=100)
    with pytest.raises(ConfigError, match="needs attention_backend='triton', got 'sdpa'"):
        EngineConfig.from_options(
            "qwen3-tiny", device="cpu", attention_backend="sdpa", decode_split_tokens=64
        )


def test_skinny_matmul_rows_is_checked_and_follows_triton_kernels():
    with pytest.raises(ConfigError, match="skinny_matmul_rows must be in 0..8, got 9"):
        EngineConfig.from_options("qwen3-tiny", device="cpu", skinny_matmul_rows=9)
    with pytest.raises(ConfigError, match="needs triton_kernels=True \\(or skinny_matmul_rows=0\\)"):
        EngineConfig.from_options("qwen3-tiny", device="cpu", triton_kernels=False, skinny_matmul_rows=1)
    assert EngineConfig.from_options("qwen3-tiny", device="cpu", triton_kernels=False).skinny_matmul_rows == 0
    with pytest.raises(
        ConfigError, match="Unsupported skinny_fusion: 'norm'. Supported: \\['auto', 'all', 'silu', 'none'\\]"
    ):
        EngineConfig.from_options("qwen3-tiny", device="cpu", skinny_fusion="norm")
    with pytest.raises(ConfigError, match="skinny_fusion='silu' fuses into the skinny matmul, which is off"):
        EngineConfig.from_options("qwen3-tiny", device="cpu", triton_kernels=False, skinny_fusion="silu")


def test_tp_fuse_norm_applies_where_it_can_and_says_what_it_needs():
    # on the CPU it can never apply: asked for, the error lists each missing condition
    assert EngineConfig.from_options("qwen3-tiny", device="cpu", tp=2).tp_fuse_norm is False
    with pytest.raises(
        ConfigError, match="tp_fuse_norm=True .* needs tp > 1, a CUDA device, triton_kernels=True"
    ):
        EngineConfig.from_options("qwen3-tiny", device="cpu", tp_fuse_norm=True, triton_kernels=False)
    with pytest.raises(
        ConfigError,
        match="needs a CUDA device, triton_kernels=True, tp_all_reduce 'symm_mem' or 'auto', torch_compile=False$",
    ):
        EngineConfig.from_options(
            "qwen3-tiny", device="cpu", tp=2, tp_fuse_norm=True, tp_all_reduce="nccl", torch_compile=True
        )
    assert EngineConfig.from_options("qwen3-tiny", device="cpu", tp_fuse_norm=False).tp_fuse_norm is False


def test_tp_fuse_matmul_applies_where_it_can_and_says_what_it_needs():
    assert EngineConfig.from_options("qwen3-tiny", device="cpu", tp=2).tp_fuse_matmul is False
    with pytest.raises(
        ConfigError,
        match=r"tp_fuse_matmul=True .* needs tp_fuse_norm \(.*\), skinny_matmul_rows >= 1 \(.*\)$",
    ):
        EngineConfig.from_options("qwen3-tiny", device="cpu", tp_fuse_matmul=True, triton_kernels=False)
    with pytest.raises(ConfigError, match=r"needs tp_fuse_norm \(the all-reduce fused with the norm, .*\)$"):
        EngineConfig.from_options("qwen3-tiny", device="cpu", tp=2, tp_fuse_matmul=True)
    assert EngineConfig.from_options("qwen3-tiny", device="cpu", tp_fuse_matmul=False).tp_fuse_matmul is False


def test_flash_attn_in_float32_is_a_clear_error():
    with pytest.raises(
        ConfigError, match="runs in float16 or bfloat16 only \\(flash-attn has no float32 kernels\\)"
    ):
        EngineConfig.from_options("qwen3-tiny", device="cpu", dtype="float32", attention_backend="flash_attn")


def test_async_scheduling_is_on_by_default_only_where_it_can_overlap():
    assert EngineConfig.from_options("qwen3-tiny", device="cpu").async_scheduling is False
    assert (
        EngineConfig.from_options("qwen3-tiny", device="cpu", async_scheduling=True).async_scheduling is True
    )


def test_tp_all_reduce_is_checked_where_it_enters():
    with pytest.raises(
        ConfigError, match=r"Unsupported tp_all_reduce: 'mpi'. Supported: \['nccl', 'symm_mem', 'auto'\]"
    ):
        EngineConfig.from_options("qwen3-tiny", device="cpu", tp_all_reduce="mpi")
    with pytest.raises(ConfigError, match="needs tp > 1 on CUDA devices \\(got tp=2 on 'cpu'\\)"):
        EngineConfig.from_options("qwen3-tiny", device="cpu", tp=2, tp_all_reduce="symm_mem")
    assert EngineConfig.from_options("qwen3-tiny", device="cpu", tp=2).tp_all_reduce == "auto"
