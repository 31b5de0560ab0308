"""The products' weights asked into L2 by the kernels before them (kernels/prefetch.py, the RMSNorm and
SiLU-and-multiply kernels, models/fused_decode.py wiring them).

Under the interpreter the prefetch itself (inline PTX) cannot run: what runs here is who prefetches which
bytes, that the kernels' outputs do not change with a prefetch asked for, and which kernel of a layer is
handed which weight. On a GPU (``pytest -m gpu`` runs this file too) the kernels run their prefetching
programs, and the outputs are compared with and without them.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from llmbench.distributed import single_rank
from llmbench.kernels import prefetch as prefetch_mod
from llmbench.kernels._triton import HAS_TRITON, cdiv, set_programmatic_launch
from llmbench.kernels.activation import silu_and_mul
from llmbench.kernels.prefetch import CHUNK, fits_l2, prefetch_launch, prefetch_spans
from llmbench.kernels.rmsnorm import rms_norm
from llmbench.kernels.skinny_matmul import skinny_matmul, skinny_norm_matmul, skinny_silu_matmul
from llmbench.kernels.triton_decode import decode_attention
from llmbench.layers.attention.backends import make_backend
from llmbench.layers.parallel import TPGroup
from llmbench.models import fused_decode
from llmbench.models.fused_decode import DecodePlan, fuse_decode
from llmbench.models.llama import BuildOptions, LlamaForCausalLM
from llmbench.models.presets import PRESETS

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else ("cuda" if torch.cuda.is_available() else None)
needs_kernels = pytest.mark.skipif(
    DEVICE is None or not HAS_TRITON, reason="Triton kernels need CUDA or TRITON_INTERPRET=1"
)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _spans_kernel(starts_ptr, sizes_ptr, nbytes, chunk, LANES: tl.constexpr):
        # program q writes the spans its LANES threads would prefetch
        q = tl.program_id(0)
        start, size = prefetch_spans(q, nbytes, chunk, LANES)
        lanes = q * LANES + tl.arange(0, LANES)
        tl.store(starts_ptr + lanes, start)
        tl.store(sizes_ptr + lanes, size)


@needs_kernels
@pytest.mark.parametrize("nbytes", [16, 240, 256, 272, 1024, 4096 + 48, 3 * 256 - 16])
@pytest.mark.parametrize("chunk", [256, 48, 4096])  # 32, 16 and 512 bytes a thread of 8
def test_the_prefetching_programs_ask_for_every_byte_of_the_weight_once(nbytes, chunk):
    lanes = 8
    programs = cdiv(nbytes, chunk)
    starts = torch.full((programs * lanes,), -1, dtype=torch.int64, device=DEVICE)
    sizes = torch.full((programs * lanes,), -1, dtype=torch.int32, device=DEVICE)
    _spans_kernel[(programs,)](starts, sizes, nbytes, chunk, LANES=lanes)
    spans = sorted((s, n) for s, n in zip(starts.tolist(), sizes.tolist(), strict=True) if n > 0)
    covered = 0
    for start, size in spans:
        assert start == covered, f"a gap or an overlap at byte {covered}: {spans}"
        assert start % 16 == 0 and size % 16 == 0  # the bulk prefetch's granularity
        covered += size
    assert covered == nbytes


def test_a_weight_is_prefetched_only_where_it_fits_in_half_the_l2():
    l2 = 50 * 2**20  # an H200's
    assert fits_l2(8 * 2**20, l2)  # qwen3-0.6b's q/k/v
    assert fits_l2(25 * 2**20, l2) and not fits_l2(25 * 2**20 + 16, l2)
    assert not fits_l2(48 * 2**20, l2)  # qwen3-8b's q/k/v: it would evict its own first lines
    assert not fits_l2(16, 0)  # no L2 known: nothing


def test_a_launch_that_cannot_run_the_prefetch_adds_no_program():
    # the CPU (and the interpreter): nothing to prefetch into, and the inline PTX cannot run there
    w, out = torch.zeros(64, 64), torch.zeros(4, 64)
    programs, args = prefetch_launch(w, out, num_warps=2)
    assert programs == 0 and args["PREFETCH"] is False and args["pf_bytes"] == 0
    assert prefetch_mod.prefetchable(w) is None


@pytest.mark.skipif(DEVICE != "cuda", reason="prefetching programs run on an NVIDIA GPU only")
def test_a_gpu_launch_adds_a_program_per_chunk_and_a_thread_per_lane():
    w = torch.zeros(4096, 1024, dtype=torch.bfloat16, device="cuda")
    programs, args = prefetch_launch(w, w, num_warps=4)
    assert programs == cdiv(w.numel() * 2, CHUNK) and args["PREFETCH"] and args["PF_LANES"] == 128


@needs_kernels
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_the_norm_and_the_activation_give_the_same_values_with_a_prefetch(rows):
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float16
    g = torch.Generator(device="cpu").manual_seed(rows)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(DEVICE, dtype)  # noqa: E731
    hidden, inter = 256, 384
    x, residual, weight = rand(rows, hidden), rand(rows, hidden), rand(hidden)
    product = rand(3 * hidden, hidden)  # the weight of the product after them
    plain = rms_norm(x, weight, 1e-6, residual)
    fetched = rms_norm(x, weight, 1e-6, residual, prefetch=product)
    for a, b in zip(plain, fetched, strict=True):
        assert torch.equal(a, b)
    gate_up = rand(rows, 2 * inter)
    assert torch.equal(silu_and_mul(gate_up), silu_and_mul(gate_up, prefetch=rand(hidden, inter)))


@needs_kernels
@pytest.mark.parametrize("batch", [1, 6])
def test_attention_gives_the_same_values_with_a_prefetch(batch):
    # the decode kernel's extra grid rows (after the batch's) prefetch and return: the batch's rows are
    # the same, one slice or several
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float16
    hq, hk, d, page = 4, 2, 32, 8
    g = torch.Generator(device="cpu").manual_seed(batch)
    cache = torch.randn(4 * batch, page, hk, d, generator=g).to(DEVICE, dtype)
    q = torch.randn(batch, hq, d, generator=g).to(DEVICE, dtype)
    tables = torch.randperm(4 * batch, generator=g).view(batch, 4).to(DEVICE, torch.int32)
    lens = torch.randint(1, 4 * page + 1, (batch,), generator=g).to(DEVICE)
    weight = torch.randn(64, hq * d, generator=g).to(DEVICE, dtype)
    for splits in (1, 2):
        plain = decode_attention(q, cache, cache, tables, lens, d**-0.5, num_splits=splits)
        fetched = decode_attention(q, cache, cache, tables, lens, d**-0.5, num_splits=splits, prefetch=weight)
        assert torch.equal(plain, fetched)


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_the_skinny_products_give_the_same_values_asking_for_their_own_weight(rows):
    # under programmatic launch (a GPU's) each program prefetches its weight rows before it waits
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float16
    g = torch.Generator(device="cpu").manual_seed(rows)
    rand = lambda *shape: (torch.randn(*shape, generator=g) / 8).to(DEVICE, dtype)  # noqa: E731
    x, w, norm = rand(rows, 256), rand(384, 256), rand(256)
    gate_up, down = rand(rows, 512), rand(320, 256)  # the down projection of a 256-wide MLP

    def products(prefetch: bool) -> tuple[torch.Tensor, ...]:
        return (
            skinny_matmul(x, w, prefetch=prefetch),
            skinny_silu_matmul(gate_up, down, prefetch=prefetch),
            skinny_norm_matmul(x, x, norm, 1e-6, w, prefetch=prefetch)[0],
        )

    set_programmatic_launch(64)
    try:
        for plain, fetched in zip(products(False), products(True), strict=True):
            assert torch.equal(plain, fetched)
    finally:
        set_programmatic_launch(0)


def _tiny_model(backend: str = "torch") -> LlamaForCausalLM:
    cfg = dataclasses.replace(PRESETS["qwen3-tiny"].config, num_hidden_layers=2)
    triton = backend == "triton"
    return LlamaForCausalLM(cfg, BuildOptions(make_backend(backend, 0), 64, TPGroup(), use_triton=triton))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_each_kernel_before_a_product_is_handed_that_products_weight(monkeypatch, backend):
    monkeypatch.setattr(fused_decode, "prefetchable", lambda w: w)  # as on a GPU where every weight fits
    model = _tiny_model(backend)
    fuse_decode(model, DecodePlan.of(0, "none", prefetch_rows=16), single_rank())
    for layer in model.model.layers:
        attn = layer.self_attn
        pairs = [
            (layer.input_layernorm, attn.qkv_proj),
            (layer.post_attention_layernorm, layer.mlp.gate_up_proj),
            (layer.mlp.act, layer.mlp.down_proj),
        ]
        if backend == "triton":  # attention's decode kernel before the output projection
            pairs.append((attn, attn.o_proj))
        else:  # attention in torch has no kernel of ours to prefetch from
            assert attn.prefetch is None and attn.prefetch_rows == 0
        for kernel, product in pairs:
            assert kernel.prefetch.data_ptr() == product.weight.data_ptr()
            assert kernel.prefetch.shape == product.weight.shape and kernel.prefetch_rows == 16
            assert product.prefetch_rows == 16  # the skinny kernel asks for its own weight too
    assert model.model.norm.prefetch is None  # the LM head's weight is larger than any L2
    # handed as plain tensors: no parameter counted twice
    assert len(list(model.parameters())) == len({p.data_ptr() for p in model.parameters()})


def test_the_kernels_prefetch_for_steps_of_up_to_the_plans_rows_only(monkeypatch):
    monkeypatch.setattr(fused_decode, "prefetchable", lambda w: w)
    model = _tiny_model()
    fuse_decode(model, DecodePlan.of(0, "none", prefetch_rows=4), single_rank())
    norm, act = model.model.layers[0].input_layernorm, model.model.layers[0].mlp.act
    asked = []
    monkeypatch.setattr(norm, "_impl", lambda x, w, eps, r, h, prefetch: asked.append(prefetch) or (x, x))
    monkeypatch.setattr(act, "_impl", lambda x, prefetch: asked.append(prefetch) or x)
    hidden = norm.weight.shape[0]
    for rows in (1, 4, 5):
        norm(torch.zeros(rows, hidden))
        act(torch.zeros(rows, 8))
    assert [a is not None for a in asked] == [True, True, True, True, False, False]
    assert asked[0] is norm.prefetch and asked[1] is act.prefetch


def test_nothing_is_prefetched_where_the_plan_says_none():
    model = _tiny_model()
    fuse_decode(model, DecodePlan.of(8, "none"), single_rank())
    assert all(getattr(m, "prefetch", None) is None for m in model.modules())
    assert all(getattr(m, "prefetch_rows", 0) == 0 for m in model.modules())


def test_a_linear_layer_asks_its_skinny_kernel_to_prefetch_up_to_its_rows_only(monkeypatch):
    from llmbench.layers import linear

    asked = []
    monkeypatch.setattr(
        linear, "skinny_matmul", lambda x, w, b, out=None, prefetch=False: asked.append(prefetch)
    )
    layer = linear.ReplicatedLinear(8, 4, bias=False, tp=TPGroup())
    layer.skinny_rows, layer.prefetch_rows = 16, 4
    for rows in (1, 4, 5, 16):
        layer(torch.zeros(rows, 8))
    assert asked == [True, True, False, False]


@pytest.mark.gpu  # `pytest -m gpu` (make bench-check): the tests above with their prefetching programs live
def test_on_the_gpu_the_prefetching_kernels_change_no_value():
    test_a_gpu_launch_adds_a_program_per_chunk_and_a_thread_per_lane()
    for rows in (1, 64, 256):
        test_the_norm_and_the_activation_give_the_same_values_with_a_prefetch(rows)
    for batch in (1, 256):
        test_attention_gives_the_same_values_with_a_prefetch(batch)
    for rows in (1, 16, 64):
        test_the_skinny_products_give_the_same_values_asking_for_their_own_weight(rows)
