"""A float8 KV cache in the engine: every attention backend reads it like the reference, the pool holds
twice the blocks of a bf16 pool in the same memory, scales are set from the first prefill (or fixed), and
the options that cannot go together are errors that say so."""

from __future__ import annotations

import math

import pytest
import torch

from llmbench import LLM, SamplingParams
from llmbench.engine.config import ConfigError, EngineConfig
from llmbench.engine.facts import triton_usable
from llmbench.engine.resolve import resolve_here
from llmbench.kernels.kv_layout import by_token
from llmbench.kernels.kv_quant import HEADROOM
from llmbench.kernels.kv_store import store_kv_ref
from llmbench.kernels.paged_attention import paged_attention_prefill_ref
from llmbench.layers.attention.backends import make_backend
from llmbench.layers.attention.kv import LayerKV
from llmbench.layers.attention.metadata import AttentionMetadata

TRITON = triton_usable("cuda" if torch.cuda.is_available() else "cpu")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["torch", "sdpa", *(["triton"] if TRITON else [])]
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROMPTS = [[(7 * i + 3) % 300 for i in range(n)] for n in (5, 17, 33)]


def step_batch(query_lens: list[int], context_lens: list[int], block_size: int, Hk: int, D: int):
    """A float8 cache holding each sequence's earlier context (quantised), and the metadata of a step that
    adds ``query_lens`` tokens after it: (kv, meta)."""
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    width = max(-(-n // block_size) for n in seq_lens)
    num_blocks = len(seq_lens) * width + 2
    tables = torch.randperm(num_blocks, device=DEVICE)[: len(seq_lens) * width].view(-1, width).int()
    k_cache = torch.zeros(num_blocks, block_size, Hk, D, device=DEVICE, dtype=torch.float8_e4m3fn)
    kv = LayerKV(k_cache, torch.zeros_like(k_cache), torch.rand(Hk, device=DEVICE) * 0.02 + 0.01,
                 torch.rand(Hk, device=DEVICE) * 0.02 + 0.01)  # fmt: skip

    def slots(seq: int, positions: range) -> torch.Tensor:
        p = torch.tensor(list(positions), device=DEVICE, dtype=torch.long)
        return tables[seq, p // block_size].long() * block_size + p % block_size

    for i, c in enumerate(context_lens):  # the context, stored before this step
        k, v = torch.randn(2, c, Hk, D, device=DEVICE)
        store_kv_ref(k, v, kv.k, kv.v, slots(i, range(c)), kv.k_scale, kv.v_scale)
    lens = zip(query_lens, context_lens, strict=True)
    new = torch.cat([slots(i, range(c, c + q)) for i, (q, c) in enumerate(lens)])
    meta = AttentionMetadata(
        slot_mapping=new,
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], device=DEVICE).int(),
        seq_lens=torch.tensor(seq_lens, device=DEVICE).int(),
        block_tables=tables,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )
    return kv, meta


def clone(kv: LayerKV) -> LayerKV:
    return LayerKV(*(t.clone() for t in kv))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("query_lens,context_lens", [([1, 6, 3], [9, 0, 5]), ([1, 1], [12, 3])])
def test_every_backend_reads_a_float8_cache_like_the_reference(backend, query_lens, context_lens) -> None:
    # A fresh prompt, a chunk after context, decodes (and a decode-only step: sdpa's batched path).
    Hq, Hk, D = 4, 2, 32
    kv, meta = step_batch(query_lens, context_lens, 8, Hk, D)
    T = sum(query_lens)
    q, k, v = torch.randn(3, T, Hq, D, device=DEVICE).split([1, 1, 1])
    q, k, v = q[0], k[0, :, :Hk], v[0, :, :Hk]
    ref_kv = clone(kv)
    store_kv_ref(k, v, ref_kv.k, ref_kv.v, meta.slot_mapping, ref_kv.k_scale, ref_kv.v_scale)
    ref = paged_attention_prefill_ref(
        q, ref_kv.k, ref_kv.v, meta.block_tables, meta.query_start_loc, meta.seq_lens, meta.max_query_len,
        D**-0.5, ref_kv.k_scale, ref_kv.v_scale,
    )  # fmt: skip
    out = make_backend(backend).forward(q, k, v, kv, meta, D**-0.5)
    diff = (out - ref).abs().max().item()
    print(f"{backend} over a float8 cache, queries {query_lens}: max |out - ref| = {diff:.3g}")
    assert diff <= 1e-5 * max(1.0, ref.abs().max().item())
    assert torch.equal(kv.k.view(torch.uint8), ref_kv.k.view(torch.uint8))  # the same bytes stored


def test_a_float8_pool_holds_twice_the_blocks_of_bf16_in_the_same_memory() -> None:
    budget = 3 << 20
    pools = {}
    for kv_dtype in ("auto", "fp8_e4m3"):
        llm = LLM(
            "qwen3-tiny",
            device="cpu",
            dtype="bfloat16",
            kv_cache_memory=budget,
            kv_cache_dtype=kv_dtype,
            max_model_len=1024,
        )
        pools[kv_dtype] = llm.engine.startup
        assert llm.engine.runner.kv_pool.nbytes <= budget
    bf16, fp8 = pools["auto"], pools["fp8_e4m3"]
    print(f"blocks in {budget} bytes: bf16 {bf16.kv_num_blocks}, fp8 {fp8.kv_num_blocks}")
    assert fp8.kv_num_blocks == 2 * bf16.kv_num_blocks
    assert fp8.kv_capacity_tokens == 2 * bf16.kv_capacity_tokens
    assert 2 * fp8.kv_bytes_per_token == bf16.kv_bytes_per_token
    assert (bf16.kv_cache_dtype, fp8.kv_cache_dtype) == ("bfloat16", "fp8_e4m3")


def test_a_float8_pool_starts_zeroed_with_v_laid_out_by_token() -> None:
    # The attention kernels load whole pages of V (kernels/kv_layout.py): the tokens past a sequence's end
    # must be finite, so the pool starts at zero; a bf16 pool keeps V laid out as K.
    for dtype, v_tokens in (("fp8_e4m3", True), ("auto", False)):
        llm = LLM("qwen3-tiny", device="cpu", kv_cache_dtype=dtype, num_kv_blocks=8)
        runner = llm.engine.runner
        for kv in runner.kv_caches:
            assert kv.k.stride(-1) == 1 and by_token(kv.v) == v_tokens and kv.v.shape == kv.k.shape
        if v_tokens:
            assert not runner.kv_pool.view(torch.uint8).any()


def test_scales_are_set_from_the_first_prefill_with_headroom_then_kept() -> None:
    llm = LLM(
        "qwen3-tiny", device="cpu", attention_backend="torch", kv_cache_dtype="fp8_e4m3", num_kv_blocks=32
    )
    runner = llm.engine.runner
    assert torch.equal(runner.kv_scales, torch.ones_like(runner.kv_scales))  # not set before a request
    llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    scales = runner.kv_scales.clone()
    # The prompt's largest |K| and |V| of each layer and head were stored as max / HEADROOM exactly.
    n = len(PROMPTS[1])
    first = [torch.stack([kv.k.flatten(0, 1)[:n], kv.v.flatten(0, 1)[:n]]) for kv in runner.kv_caches]
    stored = torch.stack(first, dim=1).float().abs().amax(dim=(2, 4))  # (2, L, Hk)
    print(f"largest stored |x| per layer and head: {stored.unique().tolist()}")
    assert torch.equal(stored, torch.full_like(stored, torch.finfo(torch.float8_e4m3fn).max / HEADROOM))
    llm.generate(PROMPTS, GREEDY)
    assert torch.equal(runner.kv_scales, scales)  # later prefills leave them as they are


def test_a_given_scale_is_used_as_it_is() -> None:
    llm = LLM("qwen3-tiny", device="cpu", attention_backend="sdpa", kv_cache_dtype="fp8_e4m3",
              tuning={"kv_cache_scale": 0.5}, num_kv_blocks=32)  # fmt: skip
    runner = llm.engine.runner
    assert not runner.kv_calibrate
    llm.generate([PROMPTS[0]], GREEDY)
    assert torch.equal(runner.kv_scales, torch.full_like(runner.kv_scales, 0.5))  # not calibrated


@pytest.mark.slow
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "torch"])
def test_float8_greedy_tokens_are_the_same_through_every_backend(backend) -> None:
    # Every backend stores the same bytes and reads them back the same way (up to float rounding).
    def tokens(name: str) -> list[list[int]]:
        llm = LLM("qwen3-tiny", device=DEVICE, dtype="float32", attention_backend=name,
                  triton_kernels=name == "triton", kv_cache_dtype="fp8_e4m3", num_kv_blocks=32)  # fmt: skip
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]

    assert tokens(backend) == tokens("torch")


def test_float8_options_that_cannot_apply_say_why() -> None:
    with pytest.raises(ConfigError) as bad:
        EngineConfig.from_options("qwen3-tiny", device="cpu", kv_cache_dtype="int8")
    assert str(bad.value) == "kv_cache_dtype: unsupported 'int8'; supported: auto, fp8_e4m3, fp8_e5m2"
    with pytest.raises(ConfigError) as bad:
        EngineConfig.from_options("qwen3-tiny", kv_cache_dtype="fp8_e4m3", tuning={"kv_cache_scale": 0})
    assert str(bad.value) == "tuning.kv_cache_scale: expected a finite number > 0 or auto, got 0"
    with pytest.raises(ConfigError, match="kv_cache_scale: expected a finite number > 0 or auto, got inf"):
        EngineConfig.from_options(
            "qwen3-tiny", kv_cache_dtype="fp8_e4m3", tuning={"kv_cache_scale": math.inf}
        )
    with pytest.raises(ConfigError, match="^tuning.kv_cache_scale sets the scales of a float8 KV cache"):
        resolve_here(EngineConfig.from_options("qwen3-tiny", device="cpu", tuning={"kv_cache_scale": 1.0}))
    config = EngineConfig(model="qwen3-tiny", device="cpu", attention_backend="flash_attn", dtype="bfloat16",
                          kv_cache_dtype="fp8_e4m3")  # fmt: skip
    with pytest.raises(ConfigError, match="flash_attn backend cannot read"):
        resolve_here(config)


@pytest.mark.slow
def test_torch_compile_builds_no_more_graphs_for_a_float8_cache() -> None:
    # Each layer's scales are tensors of their own: views at per-layer offsets made Dynamo compile layers
    # again (an offset equal to some size became a guard) until it gave up and ran them eagerly.
    from torch._dynamo.utils import counters

    graphs = {}
    for kv_dtype in ("auto", "fp8_e4m3"):
        torch._dynamo.reset()
        counters.clear()
        llm = LLM("qwen3-tiny", device="cpu", dtype="float32", attention_backend="sdpa", kv_cache_dtype=kv_dtype,
                  num_kv_blocks=64, torch_compile=True)  # fmt: skip
        llm.generate(PROMPTS, GREEDY)
        graphs[kv_dtype] = counters["stats"]["unique_graphs"]
        assert llm.engine.startup.recompiles == 0
    print(f"graphs compiled: {graphs}")
    assert graphs["fp8_e4m3"] == graphs["auto"]


@pytest.mark.skipif(not TRITON, reason="needs triton")
def test_decode_steps_of_one_length_take_the_uniform_tiles_and_keep_tokens(monkeypatch) -> None:
    # Tuning.decode_uniform_tiling: the host marks the decode steps whose contexts are about one length and
    # the Triton decode kernel takes that tiling for them (float16: the 16-bit form the tilings differ for).
    from llmbench.layers.attention import backends

    marked: list[bool] = []
    decode = backends.decode_attention

    def spy(*args, uniform: bool = False, **kwargs):
        marked.append(uniform)
        return decode(*args, uniform=uniform, **kwargs)

    monkeypatch.setattr(backends, "decode_attention", spy)
    one_length = [[(5 * i + j) % 300 for j in range(20)] for i in range(3)]

    def run(prompts: list[list[int]], uniform_tiling: bool) -> list[list[int]]:
        marked.clear()
        llm = LLM("qwen3-tiny", device=DEVICE, dtype="float16", attention_backend="triton", cuda_graph=False,
                  kv_cache_dtype="fp8_e4m3", num_kv_blocks=32, tuning={"decode_uniform_tiling": uniform_tiling})  # fmt: skip
        marked.clear()  # the start-up's warm-up steps on a GPU are of one length too
        return [o.token_ids for o in llm.generate(prompts, GREEDY)]

    got = run(one_length, True)
    assert marked and all(marked)  # every decode step: three contexts of one length
    assert got == run(one_length, False) and not any(marked)
    run(PROMPTS, True)  # contexts of 5 to 33 tokens
    assert marked and not any(marked)
