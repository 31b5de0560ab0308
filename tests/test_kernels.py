"""Each Triton kernel against its torch reference, on random inputs of awkward sizes (STYLE habit 5).

On a machine without a GPU the kernels run on CPU tensors under ``TRITON_INTERPRET=1`` (set by
conftest.py), in float32 with tight tolerances and small sizes; on CUDA they run larger, in bf16, with
a relative tolerance. Every fresh allocation is poisoned with NaN (``poison_empty``), so an output
element (or split-KV scratch entry) that a kernel forgets to write shows up as a mismatch.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._device import _device_constructors

pytest.importorskip("triton")

from llmbench.engine.facts import flash_attn_available  # noqa: E402
from llmbench.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402
from llmbench.kernels.allreduce_norm import (  # noqa: E402
    MAX_PROGRAMS,
    allreduce_norm,
    allreduce_norm_ref,
    mark_empty,
)
from llmbench.kernels.attention_prologue import attention_prologue, attention_prologue_ref  # noqa: E402
from llmbench.kernels.decode_config import (  # noqa: E402
    MAX_SPLITS,
    choose_num_splits,
    default_decode_config,
    is_uniform,
    longest_first,
    order_pays,
    uniform_tiling_differs,
)
from llmbench.kernels.kv_store import store_kv, store_kv_ref  # noqa: E402
from llmbench.kernels.paged_attention import (  # noqa: E402
    paged_attention_decode,
    paged_attention_decode_ref,
    paged_attention_prefill,
    paged_attention_prefill_ref,
)
from llmbench.kernels.rmsnorm import rms_norm, rms_norm_ref  # noqa: E402
from llmbench.kernels.rotary import apply_rotary, apply_rotary_ref  # noqa: E402
from llmbench.kernels.skinny_allreduce import skinny_matmul_allreduce, skinny_matmul_allreduce_ref  # noqa: E402
from llmbench.kernels.skinny_matmul import (  # noqa: E402
    MAX_ROWS,
    Tiles,
    skinny_matmul,
    skinny_matmul_ref,
    skinny_norm_matmul,
    skinny_norm_matmul_ref,
    skinny_silu_matmul,
    skinny_silu_matmul_ref,
    tiles_for,
)
from llmbench.kernels.triton_decode import decode_attention  # noqa: E402
from llmbench.kernels.triton_prefill import PrefillConfig, default_prefill_config, prefill_attention  # noqa: E402
from llmbench.layers.attention.backends import TritonBackend  # noqa: E402
from llmbench.layers.attention.flash import FlashAttnBackend  # noqa: E402
from llmbench.layers.attention.metadata import AttentionMetadata, leading_decodes  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# Under the interpreter Triton only runs on CPU tensors; compiled, only on CUDA ones.
DEVICES = ["cpu"] if INTERPRET else (["cuda"] if torch.cuda.is_available() else [])
if not DEVICES:
    pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1", allow_module_level=True)


@dataclass(frozen=True)
class Setting:
    device: str
    dtype: torch.dtype
    tol: float  # max |out - ref| allowed, relative to max(1, max |ref|)
    big: bool  # larger shapes where compiled kernels make them cheap


@pytest.fixture(params=DEVICES)
def setting(request: pytest.FixtureRequest) -> Setting:
    if request.param == "cuda":
        return Setting("cuda", torch.bfloat16, 2e-2, big=True)
    return Setting("cpu", torch.float32, 2e-5, big=False)


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fill every torch.empty / empty_like with NaN (floats) so unwritten elements cannot pass."""
    real_empty, real_empty_like = torch.empty, torch.empty_like
    # `with torch.device(...)` recognises constructors from a set that torch builds once, on first use:
    # built while these patches are on, it would hold the lambdas, and every later model in this
    # process (built under that context on a GPU) would get its parameters on the CPU. Build it now.
    _device_constructors()

    def poisoned(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poisoned(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poisoned(real_empty_like(*a, **k)))


def check(name: str, out: torch.Tensor, ref: torch.Tensor, s: Setting) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, out.dtype, ref.shape, ref.dtype)
    diff = (out.float() - ref.float()).abs().max().item() if out.numel() else 0.0
    bound = s.tol * max(1.0, ref.float().abs().max().item() if ref.numel() else 0.0)
    print(f"{name}: max |triton - ref| = {diff:.3g} (allowed {bound:.3g})")
    assert torch.isfinite(ref).all(), f"{name}: the reference itself is not finite"
    assert diff <= bound, f"{name}: max |triton - ref| = {diff:.3g} > {bound:.3g}"


# --- the skinny matmul of decode steps ------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 17, 64, 100])  # from two rows on, the tensor-core form
# (above 64 rows in blocks of rows, the last one masked)
@pytest.mark.parametrize("N,K,bias", [(64, 256, False), (37, 100, True), (96, 1024, False), (5, 17, True)])
def test_skinny_matmul_matches_reference(setting: Setting, rows: int, N: int, K: int, bias: bool) -> None:
    # N, K not multiples of the tiles (masked loads), one row and several, with and without bias
    if setting.big:
        N, K = N * 64, K * 4
    kw = dict(device=setting.device, dtype=setting.dtype)
    x = torch.randn(rows, K + 5, **kw)[:, 2 : K + 2]  # rows K + 5 apart
    weight = torch.randn(N, K, **kw) / K**0.5
    b = torch.randn(N, **kw) if bias else None
    check("skinny_matmul", skinny_matmul(x, weight, b), skinny_matmul_ref(x, weight, b), setting)


@pytest.mark.parametrize(
    "tiles",
    [
        Tiles(2, 16, 1, 1),
        Tiles(4, 64, 2, 2),
        Tiles(16, 32, 4, 3),
        Tiles(16, 32, 4, 2, dot=True),
        Tiles(64, 64, 4, 3, dot=True),
        Tiles(2, 16, 1, 1, block_m=4),
        Tiles(16, 32, 4, 2, dot=True, block_m=16),
    ],
)
def test_skinny_matmul_any_tiling_matches_reference(setting: Setting, tiles: Tiles) -> None:
    # tiles that divide N and K (no masks) and ones that do not, as devtools/bench_gemv.py --sweep tries them;
    # with blocks of rows, more rows than one block holds (the last block masked)
    rows = 3 * tiles.block_m - 1 if tiles.block_m else 1
    for N, K in ((64, 128), (50, 90)):
        x = torch.randn(rows, K, device=setting.device, dtype=setting.dtype)
        weight = torch.randn(N, K, device=setting.device, dtype=setting.dtype) / K**0.5
        check(
            f"skinny_matmul {tiles} {N}x{K}",
            skinny_matmul(x, weight, tiles=tiles),
            skinny_matmul_ref(x, weight),
            setting,
        )


HOPPER_SHARED = 232_448  # bytes of shared memory a program may take on an H100 or H200 (Triton's limit there)


def test_skinny_matmul_tiles_fit_the_shared_memory_at_every_element_size() -> None:
    # A program stages (block_n + block_m) x block_k elements a stage: float32 inputs (an engine in float32
    # on a GPU) take twice bf16's bytes, and tiles chosen for bf16 then ask for more than a Hopper SM has
    # (the launch fails: "out of resource: shared memory"). 2-byte inputs keep the measured choices.
    from llmbench.kernels.skinny_tiles import _tiled, block_m, tiles_for

    shapes = [
        (n, k)
        for n in (64, 1024, 2048, 4096, 6144, 12288, 151936)
        for k in (64, 1024, 2048, 3072, 4096, 12288)
    ]
    for rows in (1, 2, 3, 8, 16, 17, 32, 33, 64, 65, 128, 200, 256):
        for n, k in shapes:
            assert tiles_for(rows, n, k) == tiles_for(rows, n, k, itemsize=2) == _tiled(rows, n, k, True)
            for itemsize in (1, 2, 4):
                t = tiles_for(rows, n, k, itemsize=itemsize)
                if t.dot:
                    staged = (
                        t.num_stages * (t.block_n + (t.block_m or block_m(rows, True))) * t.block_k * itemsize
                    )
                    assert staged <= HOPPER_SHARED - 16 * 1024, (rows, n, k, itemsize, t)


@pytest.mark.parametrize("rows", [1, 3, 40])
@pytest.mark.parametrize("N,K,bias", [(64, 256, False), (37, 100, True)])
def test_skinny_silu_matmul_matches_reference(
    setting: Setting, rows: int, N: int, K: int, bias: bool
) -> None:
    # the gated MLP's down projection: silu(gate) * up computed on the loads
    if setting.big:
        N, K = N * 64, K * 12
    kw = dict(device=setting.device, dtype=setting.dtype)
    x = torch.randn(rows, 2 * K, **kw) * 2
    weight = torch.randn(N, K, **kw) / K**0.5
    b = torch.randn(N, **kw) if bias else None
    check(
        "skinny_silu_matmul", skinny_silu_matmul(x, weight, b), skinny_silu_matmul_ref(x, weight, b), setting
    )


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 5, 33])
@pytest.mark.parametrize("N,K", [(64, 256), (37, 100)])
def test_skinny_norm_matmul_matches_reference(
    setting: Setting, with_residual: bool, rows: int, N: int, K: int
) -> None:
    # residual add + RMSNorm on the loads: the product and the new residual (written by one program)
    if setting.big:
        N, K = N * 64, K * 16
    kw = dict(device=setting.device, dtype=setting.dtype)
    x = torch.randn(rows, K, **kw) * 3
    residual = torch.randn(rows, K, **kw) if with_residual else None
    norm_weight = torch.rand(K, **kw) + 0.5
    weight = torch.randn(N, K, **kw) / K**0.5
    ref_y, ref_h = skinny_norm_matmul_ref(x, residual, norm_weight, 1e-6, weight)
    # all rows in one program's tile, and in blocks of 16 rows (each block's first program writes its h)
    for tiles in (None, Tiles(16, 32, 4, 2, dot=True, block_m=16)):
        y, h = skinny_norm_matmul(x, residual, norm_weight, 1e-6, weight, tiles=tiles)
        check(f"skinny_norm_matmul {tiles}", y, ref_y, setting)
        check(f"skinny_norm_matmul residual {tiles}", h, ref_h, setting)


@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS + 2])
def test_skinny_matmuls_write_into_a_given_output(setting: Setting, rows: int) -> None:
    # tp_fuse_norm: row-parallel layers write their partial sums straight into the all-reduce's memory
    kw = dict(device=setting.device, dtype=setting.dtype)
    x = torch.randn(rows, 96, **kw)
    weight = torch.randn(40, 48, **kw) / 48**0.5
    bias = torch.randn(40, **kw)
    out = torch.full((rows + 1, 40), float("nan"), **kw)[1:]  # a view at an offset, as a slot is
    y = skinny_matmul(x[:, :48], weight, bias, out=out)
    assert y.data_ptr() == out.data_ptr()
    check("skinny_matmul into out", out, skinny_matmul_ref(x[:, :48], weight, bias), setting)
    if rows <= MAX_ROWS:
        out.fill_(float("nan"))
        assert skinny_silu_matmul(x, weight, bias, out=out).data_ptr() == out.data_ptr()
        check("skinny_silu_matmul into out", out, skinny_silu_matmul_ref(x, weight, bias), setting)
        with pytest.raises(ValueError, match=f"out must be \\({rows}, 40\\)"):
            skinny_matmul(x[:, :48], weight, out=out[:, :39])


def test_skinny_matmul_hands_larger_inputs_to_torch(setting: Setting) -> None:
    x = torch.randn(MAX_ROWS + 1, 64, device=setting.device, dtype=setting.dtype)
    weight = torch.randn(32, 64, device=setting.device, dtype=setting.dtype)
    assert torch.equal(skinny_matmul(x, weight), skinny_matmul_ref(x, weight))
    with pytest.raises(ValueError, match="x has 64 input features, the weight 63"):
        skinny_matmul(x[:1], weight[:, :63])
    with pytest.raises(
        ValueError, match=f"the skinny kernels take up to {MAX_ROWS} rows, got {MAX_ROWS + 1}"
    ):
        skinny_silu_matmul(torch.cat([x, x], 1), weight)
    empty = skinny_norm_matmul(x[:0], x[:0], weight[0], 1e-6, weight)  # no rows: empty outputs, no launch
    assert empty[0].shape == (0, 32) and empty[1].shape == (0, 64)


# --- the all-reduce fused with the RMSNorm after it (tensor parallelism) ---------------------------


def _addresses(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=tensors[0].device)


@pytest.mark.parametrize("world,rank", [(1, 0), (2, 0), (2, 1), (4, 2)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("T,H", [(1, 64), (5, 100), (MAX_PROGRAMS + 3, 48)])
def test_allreduce_norm_matches_reference_and_leaves_the_flags_clear(
    setting: Setting, world: int, rank: int, with_residual: bool, T: int, H: int
) -> None:
    # The ranks' buffers are ordinary tensors of one process here, and every peer has already arrived
    # (its flag for each program is set in this rank's flags). After the kernel: the peers' arrivals are
    # taken back (this rank's flags all zero) and this rank's arrival is in each peer's flags, once per
    # program. More rows than programs: each program takes several rows.
    if setting.big:
        H *= 64
    kw = dict(device=setting.device, dtype=setting.dtype)
    parts = [torch.randn(T, H, **kw) * 2 for _ in range(world)]
    residual = torch.randn(T, H, **kw) if with_residual else None
    weight = torch.rand(H, **kw) + 0.5
    flags = [torch.zeros(MAX_PROGRAMS, world, dtype=torch.int32, device=setting.device) for _ in range(world)]
    programs = min(T, MAX_PROGRAMS)
    flags[rank][:programs] = 1
    flags[rank][:, rank] = 0
    out, h = allreduce_norm(
        _addresses(parts), _addresses(flags), rank, (T, H), setting.dtype, residual, weight, 1e-6
    )
    ref_out, ref_h = allreduce_norm_ref(parts, residual, weight, 1e-6)
    check("allreduce_norm out", out, ref_out, setting)
    check("allreduce_norm residual", h, ref_h, setting)
    assert not flags[rank].any(), "the peers' arrivals were not taken back"
    for q in range(world):
        if q != rank:
            arrived = torch.zeros(MAX_PROGRAMS, world, dtype=torch.int32, device=setting.device)
            arrived[:programs, rank] = 1
            assert torch.equal(flags[q], arrived), f"rank {q}'s flags: {flags[q][: programs + 1].tolist()}"


def test_allreduce_norm_takes_back_one_arrival_per_call(setting: Setting) -> None:
    # a peer may already have arrived for the next call too (it passed this call's barrier first): the
    # kernel takes back one arrival, and the next call finds the other
    kw = dict(device=setting.device, dtype=setting.dtype)
    parts = [torch.randn(2, 32, **kw) for _ in range(2)]
    weight = torch.ones(32, **kw)
    flags = [torch.zeros(MAX_PROGRAMS, 2, dtype=torch.int32, device=setting.device) for _ in range(2)]
    flags[0][:2, 1] = 2
    for left in (1, 0):
        allreduce_norm(_addresses(parts), _addresses(flags), 0, (2, 32), setting.dtype, None, weight, 1e-6)
        assert flags[0][:2, 1].tolist() == [left, left] and not flags[0][2:].any()
    assert flags[1][:2, 0].tolist() == [2, 2]  # this rank's two arrivals, not yet taken back by rank 1


def test_allreduce_norm_ref_sums_in_float32_and_rounds_once() -> None:
    # three float16 partial sums whose pairwise float16 sums would round: the float32 sum rounds once
    parts = [torch.full((1, 4), v, dtype=torch.float16) for v in (2048.0, 1.0, 1.0)]
    _, h = allreduce_norm_ref(parts, None, torch.ones(4, dtype=torch.float16), 1e-6)
    assert torch.equal(h, torch.full((1, 4), 2050.0, dtype=torch.float16))  # 2048 + 1 + 1 in float16: 2048


def test_allreduce_norm_rejects_what_cannot_meet() -> None:
    a = torch.zeros(2, dtype=torch.int64)
    weight = torch.ones(8)
    with pytest.raises(ValueError, match="rank 2 of 2 ranks, with 2 flag addresses"):
        allreduce_norm(a, a, 2, (1, 8), torch.float32, None, weight, 1e-6)
    with pytest.raises(ValueError, match="rank 0 of 2 ranks, with 3 flag addresses"):
        allreduce_norm(a, torch.zeros(3, dtype=torch.int64), 0, (1, 8), torch.float32, None, weight, 1e-6)
    with pytest.raises(ValueError, match="weight must be \\(16,\\), got \\(8,\\)"):
        allreduce_norm(a, a, 0, (1, 16), torch.float32, None, weight, 1e-6)


def test_skinny_matmul_allreduce_refuses_blocks_of_rows(setting: Setting) -> None:
    # its last programs sum every row: a block of the rows per program would sum the others' rows too
    kw = dict(device=setting.device, dtype=setting.dtype)
    x, weight = torch.randn(5, 48, **kw), torch.randn(40, 48, **kw)
    buffers = [mark_empty(torch.empty(1, 5, 40, **kw))]
    with pytest.raises(ValueError, match="takes all 5 rows in one program's tile, not 4"):
        skinny_matmul_allreduce(
            x, weight, None, _addresses(buffers), 0, None, tiles=Tiles(2, 16, 1, 1, block_m=4)
        )


def _empty_marks(t: torch.Tensor) -> torch.Tensor:
    """Where ``t`` holds -0.0, the receive buffers' mark of an element not yet written."""
    return (t == 0) & torch.signbit(t)


@pytest.mark.parametrize("world,rank", [(1, 0), (2, 0), (2, 1), (4, 3)])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize(
    "gated,with_residual,block", [(False, True, 16), (True, True, 256), (False, False, 32)]
)
def test_skinny_matmul_allreduce_matches_reference_and_empties_its_buffer(
    setting: Setting, world: int, rank: int, rows: int, gated: bool, with_residual: bool, block: int
) -> None:
    # The ranks' receive buffers are tensors of this process; every peer's partial sums are already in
    # this rank's buffer. After the kernel: the sum is the reference over every rank's products bit for
    # bit (same products, same order), the squares close to the reference's, this rank's buffer all empty
    # marks again, and each peer's buffer holds this rank's products in section `rank` and nothing else.
    # Then the next product, normed on its loads from those squares, against the unfused references.
    N, K = (4096, 1024) if setting.big else (40, 48)
    kw = dict(device=setting.device, dtype=setting.dtype)
    xs = [torch.randn(rows, 2 * K if gated else K, **kw) for _ in range(world)]
    weights = [torch.randn(N, K, **kw) / K**0.5 for _ in range(world)]
    bias = torch.randn(N, **kw)
    residual = torch.randn(rows, N, **kw) if with_residual else None
    product = skinny_silu_matmul if gated else skinny_matmul
    broadcast = tiles_for(rows, N, K, dot=False)  # the summing form's tiles: the same sums, bit for bit
    parts = [product(xs[q], weights[q], bias if q == 0 else None, broadcast) for q in range(world)]
    buffers = [mark_empty(torch.empty(world, rows, N, **kw)) for _ in range(world)]
    for q in range(world):
        if q != rank:
            buffers[rank][q] = parts[q]
    h, squares = skinny_matmul_allreduce(
        xs[rank], weights[rank], bias if rank == 0 else None, _addresses(buffers), rank, residual,
        gated=gated, block=block,
    )  # fmt: skip
    norm_weight = torch.rand(N, **kw) + 0.5
    _, ref_h = allreduce_norm_ref(parts, residual, norm_weight, 1e-6)
    assert torch.equal(h, ref_h)
    ref2_h, ref_squares = skinny_matmul_allreduce_ref(xs, weights, bias, residual, gated, block)
    check("skinny_matmul_allreduce_ref", h, ref2_h, setting)
    check("skinny_matmul_allreduce_ref squares", squares, ref_squares, setting)
    # the squares of the sum as the kernel rounded it (the reference's products may round otherwise in bf16)
    own = F.pad(ref_h.float() ** 2, (0, -N % block)).view(rows, -1, block).sum(-1)
    torch.testing.assert_close(squares, own, rtol=1e-4, atol=1e-4)
    assert _empty_marks(buffers[rank]).all(), "this rank's receive buffer was not emptied"
    for q in range(world):
        if q != rank:
            assert torch.equal(buffers[q][rank], parts[rank]), f"rank {q} did not get this rank's products"
            others = torch.cat([buffers[q][:rank], buffers[q][rank + 1 :]])
            assert _empty_marks(others).all(), f"rank {q}'s other sections were written"
    after = torch.randn(24, N, **kw) / N**0.5
    out, same = skinny_norm_matmul(h, None, norm_weight, 1e-6, after, squares=squares)
    assert same is h
    check(
        "skinny_norm_matmul from squares",
        out,
        skinny_norm_matmul_ref(ref_h, None, norm_weight, 1e-6, after)[0],
        setting,
    )


def test_skinny_matmul_allreduce_rejects_what_cannot_meet() -> None:
    x, weight = torch.zeros(1, 8), torch.zeros(4, 8)
    addrs = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="rank 2 of 2 ranks"):
        skinny_matmul_allreduce(x, weight, None, addrs, 2, None)
    with pytest.raises(ValueError, match="residual must be \\(1, 4\\)"):
        skinny_matmul_allreduce(x, weight, None, addrs, 0, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="4 columns in blocks of 1 need more programs than the product's 2"):
        skinny_matmul_allreduce(x, weight, None, addrs, 0, None, block=1)
    with pytest.raises(ValueError, match="squares must be float32 \\(1, P\\), with no residual"):
        skinny_norm_matmul(
            torch.zeros(1, 8), torch.zeros(1, 8), torch.ones(8), 1e-6, weight, squares=torch.zeros(1, 1)
        )


# --- small kernels -----------------------------------------------------------------------------------


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("T,H", [(1, 64), (7, 100), (3, 1024)])
def test_rms_norm_matches_reference(setting: Setting, with_residual: bool, T: int, H: int) -> None:
    if setting.big:
        T, H = T * 97, H * 4
    kw = dict(device=setting.device, dtype=setting.dtype)
    x = torch.randn(T, H + 3, **kw)[:, 1 : H + 1]  # a strided view: rows H + 3 apart
    weight = torch.randn(H, **kw)
    residual = torch.randn(T, H, **kw) if with_residual else None
    out, h = rms_norm(x, weight, 1e-6, residual)
    ref_out, ref_h = rms_norm_ref(x, weight, 1e-6, residual)
    check("rms_norm out", out, ref_out, setting)
    if with_residual:
        check("rms_norm residual", h, ref_h, setting)
    else:
        assert h is None


def test_rms_norm_updates_the_residual_in_place(setting: Setting) -> None:
    # h_out=residual (a forward cut at attention keeps the residual stream in one buffer): each row is read
    # before it is written, so the result is the fresh-output one; a wrong shape is refused.
    kw = dict(device=setting.device, dtype=setting.dtype)
    x, weight, residual = torch.randn(9, 96, **kw), torch.randn(96, **kw), torch.randn(9, 96, **kw)
    ref_out, ref_h = rms_norm_ref(x, weight, 1e-6, residual)
    out, h = rms_norm(x, weight, 1e-6, residual, residual)
    assert h is not None and h.data_ptr() == residual.data_ptr()
    check("rms_norm out, residual in place", out, ref_out, setting)
    check("rms_norm residual in place", residual, ref_h, setting)
    with pytest.raises(ValueError, match="h_out must be a \\(T, H\\) tensor like x"):
        rms_norm(x, weight, 1e-6, residual, torch.empty(9, 95, **kw))


def test_rms_norm_per_head_of_3d_input(setting: Setting) -> None:
    # Qwen3's q/k norm normalises each head: (T, H, D) with weight (D,).
    x = torch.randn(5, 6, 128, device=setting.device, dtype=setting.dtype)
    weight = torch.randn(128, device=setting.device, dtype=setting.dtype)
    check("rms_norm 3-d", rms_norm(x, weight, 1e-6)[0], rms_norm_ref(x, weight, 1e-6)[0], setting)


@pytest.mark.parametrize("T,inter", [(1, 64), (5, 1500), (2, 3072)])
def test_silu_and_mul_matches_reference(setting: Setting, T: int, inter: int) -> None:
    if setting.big:
        T *= 131
    x = torch.randn(T, 2 * inter, device=setting.device, dtype=setting.dtype) * 3
    check("silu_and_mul", silu_and_mul(x), silu_and_mul_ref(x), setting)


@pytest.mark.parametrize("Hq,Hk,D", [(4, 1, 64), (6, 2, 128), (2, 2, 80)])
def test_apply_rotary_matches_reference(setting: Setting, Hq: int, Hk: int, D: int) -> None:
    T = 301 if setting.big else 5
    kw = dict(device=setting.device, dtype=setting.dtype)
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, **kw)  # q and k as views of a fused projection
    q = qkv[:, : Hq * D].view(T, Hq, D)
    k = qkv[:, Hq * D : (Hq + Hk) * D].view(T, Hk, D)
    cos_sin_cache = torch.randn(4096, D, device=setting.device, dtype=torch.float32)
    positions = torch.randint(0, 4096, (T,), device=setting.device)
    before = qkv.clone()
    q_out, k_out = apply_rotary(q, k, positions, cos_sin_cache)
    q_ref, k_ref = apply_rotary_ref(q, k, positions, cos_sin_cache)
    check("rotary q", q_out, q_ref, setting)
    check("rotary k", k_out, k_ref, setting)
    assert torch.equal(qkv, before), "apply_rotary modified its inputs"


@pytest.mark.parametrize("block_size", [8, 16])
def test_store_kv_writes_its_slots_and_skips_minus_one(setting: Setting, block_size: int) -> None:
    num_blocks, Hk, D, T = 6, 2, 64, 9
    kw = dict(device=setting.device, dtype=setting.dtype)
    k_cache, v_cache = (
        torch.randn(num_blocks, block_size, Hk, D, **kw),
        torch.randn(num_blocks, block_size, Hk, D, **kw),
    )
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kv = torch.randn(T, 2, Hk, D, **kw)  # k and v as strided views of one tensor
    k, v = kv[:, 0], kv[:, 1]
    slots = torch.randperm(num_blocks * block_size, device=setting.device)[:T]
    slots[[0, 4, T - 1]] = -1  # padded tokens, first, middle and last
    store_kv(k, v, k_cache, v_cache, slots)
    store_kv_ref(k, v, k_ref, v_ref, slots)
    written = (k_cache != k_ref).sum().item() + (v_cache != v_ref).sum().item()
    print(f"store_kv: {written} cache elements differ from the reference")
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize(
    "Hq,Hk,D,block_size", [(2, 2, 64, 8), (8, 1, 128, 16), (6, 2, 80, 8), (16, 8, 128, 16)]
)
def test_attention_prologue_matches_the_unfused_reference(
    setting: Setting, qk_norm: bool, Hq: int, Hk: int, D: int, block_size: int
) -> None:
    T, num_blocks = (517, 80) if setting.big else (7, 6)  # more slots than tokens: 80 x 8 > 517
    kw = dict(device=setting.device, dtype=setting.dtype)
    qkv = torch.randn(T, (Hq + 2 * Hk) * D + 5, **kw)[:, 3 : 3 + (Hq + 2 * Hk) * D] * 2  # strided rows
    positions = torch.randint(0, 4096, (T,), device=setting.device)
    cos_sin_cache = torch.randn(4096, D, device=setting.device, dtype=torch.float32)
    q_w, k_w = (torch.randn(D, **kw), torch.randn(D, **kw)) if qk_norm else (None, None)
    k_cache = torch.randn(num_blocks, block_size, Hk, D, **kw)
    v_cache = torch.randn(num_blocks, block_size, Hk, D, **kw)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(num_blocks * block_size, device=setting.device)[:T]
    slots[[0, T // 2, T - 1]] = -1  # padded tokens write nothing, but their q is still computed
    before = qkv.clone()
    args = (positions, cos_sin_cache, q_w, k_w, 1e-6)
    q = attention_prologue(qkv, *args, k_cache, v_cache, slots, Hq, Hk)
    q_ref = attention_prologue_ref(qkv, *args, k_ref, v_ref, slots, Hq, Hk)
    check("prologue q", q, q_ref, setting)
    check("prologue k cache", k_cache, k_ref, setting)
    assert torch.equal(v_cache, v_ref), "v is copied, not computed: it must be bit-exact"
    assert torch.equal(qkv, before), "attention_prologue modified its input"


# --- paged attention ---------------------------------------------------------------------------------


def random_paged_cache(
    s: Setting, seq_lens: list[int], block_size: int, Hk: int, D: int, spare_blocks: int = 3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Caches with random contents and block tables of shuffled, distinct blocks (spare columns too)."""
    max_blocks = max(1, max(-(-n // block_size) for n in seq_lens)) + spare_blocks
    num_blocks = len(seq_lens) * max_blocks + 5
    kw = dict(device=s.device, dtype=s.dtype)
    k_cache = torch.randn(num_blocks, block_size, Hk, D, **kw)
    v_cache = torch.randn(num_blocks, block_size, Hk, D, **kw)
    perm = torch.randperm(num_blocks, device=s.device)[: len(seq_lens) * max_blocks]
    block_tables = perm.view(len(seq_lens), max_blocks).to(torch.int32)  # (B, max_blocks)
    return k_cache, v_cache, block_tables


# (Hq, Hk, D, block_size): GQA ratios 1, 2, 4, 8 and 3 (padded to 4); head_dim 64, 128 and 80 (padded
# to 128); pages 8, 16.
DECODE_SHAPES = [(2, 2, 64, 8), (4, 2, 128, 16), (8, 2, 64, 16), (8, 1, 128, 8), (6, 2, 80, 8)]


def mixed_decode_batch(s: Setting, seq_lens: list[int]) -> tuple[torch.Tensor, ...]:
    """A decode batch of these context lengths (40 random ones more at real sizes), 4/2 heads of 64, pages
    of 8: q, caches, block tables, lengths and the reference's output at scale 0.125."""
    if s.big:
        seq_lens = seq_lens + torch.randint(1, 2000, (40,)).tolist()
    k_cache, v_cache, block_tables = random_paged_cache(s, seq_lens, 8, 2, 64)
    q = torch.randn(len(seq_lens), 4, 64, device=s.device, dtype=s.dtype)
    sl = torch.tensor(seq_lens, device=s.device, dtype=torch.int32)
    return (
        q,
        k_cache,
        v_cache,
        block_tables,
        sl,
        paged_attention_decode_ref(q, k_cache, v_cache, block_tables, sl, 0.125),
    )


def test_paged_decode_in_fixed_length_slices_matches_reference(setting: Setting) -> None:
    # Slices of a fixed length (a tile or two here): short sequences leave their last slices empty.
    block_n = 32 if setting.dtype == torch.float32 else 64
    seq_lens = [1, 5, block_n, block_n + 1, 3 * block_n + 7, 70]
    q, k_cache, v_cache, block_tables, sl, ref = mixed_decode_batch(setting, seq_lens)
    for split_tokens in (block_n, 2 * block_n):
        out = decode_attention(q, k_cache, v_cache, block_tables, sl, 0.125, split_tokens=split_tokens)
        check(f"decode split_tokens={split_tokens}", out, ref, setting)
    with pytest.raises(ValueError, match="split_tokens must be a positive multiple"):
        decode_attention(q, k_cache, v_cache, block_tables, sl, 0.125, split_tokens=block_n + 1)


def test_paged_decode_reads_a_cache_laid_out_by_head_through_its_strides(setting: Setting) -> None:
    # The same values with each page's heads one after another (devtools/bench_kernels.py --tune
    # decode-layout): the kernel walks the cache by its strides, so the output is the same bit for bit.
    q, k_cache, v_cache, block_tables, sl, ref = mixed_decode_batch(setting, [3, 70, 1, 17, 130, 8, 64])
    by_head = [c.transpose(1, 2).contiguous().transpose(1, 2) for c in (k_cache, v_cache)]
    assert torch.equal(by_head[0], k_cache) and by_head[0].stride() != k_cache.stride()
    plain = decode_attention(q, k_cache, v_cache, block_tables, sl, 0.125, num_splits=2)
    out = decode_attention(q, *by_head, block_tables, sl, 0.125, num_splits=2)
    check("decode over a cache laid out by head", out, ref, setting)
    assert torch.equal(out, plain)


@pytest.mark.parametrize("seq_lens,per_sm", [([3, 70, 0, 17, 130, 8, 64, 0], 2), ([1500, 900, 40, 3, 0], 1)])
def test_the_balanced_decode_kernel_matches_reference_across_program_bounds(
    setting: Setting, seq_lens: list[int], per_sm: int, monkeypatch
) -> None:
    # devtools/balanced_decode.py, measured against the engine's kernel (BENCHMARKS.md): items cut across
    # programs (with programs of no tile between their parts) and items whole inside one, padded rows of
    # length 0 (written as 0); a launch leaves its arrival counts at 0, so the next gives the same output.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "devtools"))
    from balanced_decode import BalancedConfig, balanced_decode_attention, balanced_programs

    q, k_cache, v_cache, block_tables, sl, ref = mixed_decode_batch(setting, seq_lens)
    live = sl > 0
    config = BalancedConfig(block_n=16 if setting.dtype == torch.float32 else 64, programs_per_sm=per_sm)
    counts = torch.zeros(balanced_programs(config, q.device), dtype=torch.int32, device=q.device)
    out = balanced_decode_attention(q, k_cache, v_cache, block_tables, sl, 0.125, config, counts)
    check(f"balanced decode, {per_sm} programs an SM", out[live], ref[live], setting)
    assert not out[~live].any(), "a row of length 0 is written as 0"
    assert not counts.any(), "every split item's last part resets its count"
    again = balanced_decode_attention(q, k_cache, v_cache, block_tables, sl, 0.125, config, counts)
    assert torch.equal(again, out)


def test_the_pool_read_and_the_register_decode_match_their_references(setting: Setting, monkeypatch) -> None:
    # devtools/register_decode.py, measured against the engine's kernel (BENCHMARKS.md, "What the pool's
    # pages allow"): rows of length 0, contexts within a tile, across pages and across tiles, longest first.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "devtools"))
    from register_decode import (
        paged_read,
        paged_read_ref,
        paged_read_rows,
        register_decode_attention,
        rows_decode_attention,
    )

    q, k_cache, v_cache, block_tables, sl, ref = mixed_decode_batch(setting, [3, 70, 0, 17, 130, 8, 64])
    order = longest_first(sl)
    summed_ref = paged_read_ref(k_cache, v_cache, block_tables, sl)
    for block_n in (16, 32):
        out = register_decode_attention(q, k_cache, v_cache, block_tables, sl, 0.125, order, block_n=block_n)
        check(f"register decode, {block_n}-token tiles", out, ref, setting)
        summed = paged_read(k_cache, v_cache, block_tables, sl, order, block_n=block_n)
        check(f"pool read, {block_n}-token tiles", summed, summed_ref, setting)
    # a program per sequence (in slices, empty ones too), every KV head of a page at once; pages of 8
    for block_n, splits in ((8, 1), (8, 3)):  # 8 tokens x 2 KV heads: the tensor cores' 16 rows
        out = rows_decode_attention(
            q, k_cache, v_cache, block_tables, sl, 0.125, order, block_n=block_n, num_splits=splits
        )
        check(f"decode by sequence, {splits} slices", out, ref, setting)
        summed = paged_read_rows(
            k_cache, v_cache, block_tables, sl, order, block_n=block_n, num_splits=splits
        )
        check(f"pool read by sequence, {splits} slices", summed, summed_ref, setting)
    with pytest.raises(ValueError, match="one or two query heads a KV head"):
        register_decode_attention(q.repeat(1, 2, 1), k_cache, v_cache, block_tables, sl, 0.125, order)


@pytest.mark.parametrize("split", [1, 2, 4])
def test_the_split_k_products_sum_to_the_matmul(setting: Setting, split: int, monkeypatch) -> None:
    # devtools/splitk_matmul.py: each part of the input features' partial sums; rows fewer than a tile.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "devtools"))
    from splitk_matmul import splitk_matmul

    x = torch.randn(5, 128, device=setting.device, dtype=setting.dtype)
    w = torch.randn(64, 128, device=setting.device, dtype=setting.dtype) / 128**0.5
    parts = splitk_matmul(x, w, split, block_m=16, block_n=32, block_k=32, num_stages=2)
    assert parts.shape == (split, 5, 64) and parts.dtype == torch.float32
    check(f"split-K in {split}", parts.sum(0), x.float() @ w.float().T, setting)
    with pytest.raises(ValueError, match="must be a multiple"):
        splitk_matmul(x, w, 3, block_m=16, block_n=32, block_k=32)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_paged_decode_in_any_order_matches_reference(setting: Setting, num_splits: int) -> None:
    # Programs take the rows in a given order (longest first, the reverse, shuffled): the same output.
    q, k_cache, v_cache, block_tables, sl, ref = mixed_decode_batch(setting, [3, 70, 1, 17, 130, 8, 64])
    first = longest_first(sl)
    assert sl[first].tolist() == sorted(sl.tolist(), reverse=True)
    orders = {"longest first": first, "shortest first": first.flip(0), "shuffled": torch.randperm(len(sl))}
    plain = decode_attention(q, k_cache, v_cache, block_tables, sl, 0.125, num_splits=num_splits)
    for name, order in orders.items():
        order = order.to(setting.device)
        out = decode_attention(
            q, k_cache, v_cache, block_tables, sl, 0.125, num_splits=num_splits, order=order
        )
        check(f"decode {name}, {num_splits} slices", out, ref, setting)
        assert torch.equal(out, plain), "each row is computed as without an order: bit for bit"
    with pytest.raises(ValueError, match=f"order must be a permutation of the {len(sl)} rows"):
        decode_attention(q, k_cache, v_cache, block_tables, sl, 0.125, order=first[:3])


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("Hq,Hk,D,block_size", [(4, 2, 64, 8), (6, 2, 80, 16), (4, 1, 64, 32)])
def test_paged_decode_in_whole_tiles_then_a_tail_matches_reference(
    setting: Setting, num_splits: int, Hq: int, Hk: int, D: int, block_size: int
) -> None:
    # Whole wide tiles unmasked, then the slice's rest in narrow masked ones: lengths that end on a wide
    # tile, on a narrow one, inside one, below one narrow tile, and slices left empty (8 of them).
    block_n, tail_n = (32, 16) if setting.dtype == torch.float32 else (128, 64)
    seq_lens = [1, tail_n - 1, tail_n, block_n, block_n + tail_n, 2 * block_n + tail_n + 3, 3 * block_n - 1]
    if setting.big:
        seq_lens += torch.randint(1, 2000, (27,)).tolist()
    k_cache, v_cache, block_tables = random_paged_cache(setting, seq_lens, block_size, Hk, D)
    q = torch.randn(len(seq_lens), Hq, D, device=setting.device, dtype=setting.dtype)
    sl = torch.tensor(seq_lens, device=setting.device, dtype=torch.int32)
    config = default_decode_config(D, setting.dtype)._replace(block_n=block_n, tail_n=tail_n)
    ref = paged_attention_decode_ref(q, k_cache, v_cache, block_tables, sl, D**-0.5)
    out = decode_attention(
        q, k_cache, v_cache, block_tables, sl, D**-0.5, num_splits=num_splits, config=config
    )
    check(f"decode n{block_n} tail {tail_n} splits={num_splits}", out, ref, setting)
    out = decode_attention(
        q, k_cache, v_cache, block_tables, sl, D**-0.5, split_tokens=block_n, config=config
    )
    check(f"decode n{block_n} tail {tail_n} in slices of {block_n}", out, ref, setting)
    for bad in (3 * tail_n, 2 * block_n):
        with pytest.raises(ValueError, match=f"tail_n must divide block_n \\({block_n}\\)"):
            decode_attention(q, k_cache, v_cache, block_tables, sl, 0.1, config=config._replace(tail_n=bad))


def test_programmatic_launch_goes_to_kernels_of_up_to_the_rows_set_on_a_gpu_only(monkeypatch) -> None:
    from llmbench.kernels import _triton

    t = torch.zeros(1)
    monkeypatch.setattr(_triton, "runs_ptx", lambda _: True)  # as if on an NVIDIA GPU
    monkeypatch.setattr(_triton, "HAS_GDC", True)
    try:
        _triton.set_programmatic_launch(32)
        on = {"PDL": True, "launch_pdl": True}
        off = {"PDL": False}  # always given (torch.compile launches need every constexpr passed)
        assert [_triton.programmatic(t, rows) for rows in (1, 32, 33, 0)] == [on, on, off, off]
        _triton.set_programmatic_launch(0)
        assert _triton.programmatic(t, 1) == off
        monkeypatch.setattr(_triton, "HAS_GDC", False)  # a Triton without grid dependency control
        _triton.set_programmatic_launch(32)
        assert _triton.programmatic(t, 1) == off
        monkeypatch.setattr(_triton, "HAS_GDC", True)
        monkeypatch.undo()  # the interpreter (or ROCm) cannot run it, whatever was set
        _triton.set_programmatic_launch(32)
        assert _triton.programmatic(t, 1) == off
    finally:
        _triton.set_programmatic_launch(0)


def test_longest_first_is_taken_only_where_programs_outnumber_multiprocessors() -> None:
    cpu = torch.device("cpu")  # the interpreter stands for an H200: 132 multiprocessors
    assert not order_pays(1, 64, cpu)  # one sequence: nothing to order
    assert not order_pays(16, 8, cpu)  # 128 programs: all start at once
    assert order_pays(17, 8, cpu) and order_pays(256, 8, cpu)


@settings(max_examples=300, deadline=None)
@given(
    batch=st.integers(1, 512),
    heads=st.sampled_from([1, 2, 4, 8, 32]),
    context=st.integers(1, 1 << 16),
    fp8=st.booleans(),
)
def test_split_count_fills_the_gpu_to_its_configs_target(
    batch: int, heads: int, context: int, fp8: bool
) -> None:
    # The largest power of two that keeps the grid within the config's programs a multiprocessor, with at
    # least one tile a slice and no more slices than the warm-up compiles the merge for.
    cpu = torch.device("cpu")  # the interpreter stands for an H200: 132 multiprocessors
    config = default_decode_config(128, torch.bfloat16, fp8, v_tokens=fp8)
    n = choose_num_splits(batch, heads, context, config, cpu)
    assert n >= 1 and n & (n - 1) == 0 and n <= MAX_SPLITS
    assert n == 1 or (batch * heads * n <= config.programs_per_sm * 132 and n * config.block_n <= context)
    doubled_fits = batch * heads * 2 * n <= config.programs_per_sm * 132 and 2 * n * config.block_n <= context
    assert not doubled_fits or 2 * n > MAX_SPLITS


def test_uniform_tiles_are_taken_only_where_they_differ() -> None:
    # A float8 cache by token below a wide batch: one tiling for contexts of about one length, another for
    # mixed ones (--tune decode-fp8-tails, decode-fp8-spread); a wide batch and a 16-bit cache have one.
    cpu = torch.device("cpu")  # the interpreter stands for an H200: 132 multiprocessors
    fp8 = dict(head_dim=128, dtype=torch.bfloat16, fp8=True, v_tokens=True, device=cpu)
    assert uniform_tiling_differs(1, 8, **fp8) and uniform_tiling_differs(131, 8, **fp8)
    assert not uniform_tiling_differs(132, 8, **fp8)
    assert not uniform_tiling_differs(64, 8, **{**fp8, "fp8": False, "v_tokens": False})
    layout = (128, torch.bfloat16, True, True)
    assert default_decode_config(*layout, uniform=True) != default_decode_config(*layout)
    assert is_uniform(2048, 4096) and is_uniform(7, 7) and not is_uniform(2047, 4096)


def test_split_targets_follow_the_tilings_measured_best() -> None:
    # --tune decode-batches on an H200 (BENCHMARKS.md): qwen3-0.6b's 8 KV heads, contexts to 2,048.
    cpu = torch.device("cpu")
    bf16 = default_decode_config(128, torch.bfloat16)
    fp8 = default_decode_config(128, torch.bfloat16, fp8=True, v_tokens=True)
    assert [choose_num_splits(b, 8, 2048, bf16, cpu) for b in (16, 32, 64, 96, 256)] == [8, 4, 2, 1, 1]
    assert [choose_num_splits(b, 8, 2048, fp8, cpu) for b in (16, 32, 64, 96, 128)] == [8, 4, 2, 2, 1]


@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("Hq,Hk,D,block_size", DECODE_SHAPES)
def test_paged_decode_matches_reference(
    setting: Setting, num_splits: int | None, Hq: int, Hk: int, D: int, block_size: int
) -> None:
    # seq_len 1, a page boundary (page - 1, page, page + 1) and random lengths over several pages.
    seq_lens = [1, block_size - 1, block_size, block_size + 1, 3 * block_size + 5]
    if setting.big:
        seq_lens += torch.randint(1, 2000, (27,)).tolist()
    k_cache, v_cache, block_tables = random_paged_cache(setting, seq_lens, block_size, Hk, D)
    q = torch.randn(len(seq_lens), Hq, D, device=setting.device, dtype=setting.dtype)
    sl = torch.tensor(seq_lens, device=setting.device, dtype=torch.int32)
    scale = D**-0.5
    out = decode_attention(q, k_cache, v_cache, block_tables, sl, scale, num_splits=num_splits)
    ref = paged_attention_decode_ref(q, k_cache, v_cache, block_tables, sl, scale)
    check(f"decode splits={num_splits}", out, ref, setting)


def test_paged_decode_empty_splits_and_padding_rows(setting: Setting) -> None:
    # More slices than tiles leaves some slices empty; seq_len 0 (a padded graph row) must give zeros.
    seq_lens = [0, 1, 2, 40]
    k_cache, v_cache, block_tables = random_paged_cache(setting, seq_lens, 8, 2, 64)
    q = torch.randn(len(seq_lens), 4, 64, device=setting.device, dtype=setting.dtype)
    sl = torch.tensor(seq_lens, device=setting.device, dtype=torch.int32)
    out = decode_attention(q, k_cache, v_cache, block_tables, sl, 0.125, num_splits=8)
    ref = paged_attention_decode_ref(q, k_cache, v_cache, block_tables, sl, 0.125)
    check("decode empty splits", out, ref, setting)
    assert torch.equal(out[0], torch.zeros_like(out[0]))


def test_paged_decode_default_heuristic_on_one_long_sequence(setting: Setting) -> None:
    # Batch 1: the public entry point chooses split-KV on its own.
    seq_lens = [1000 if setting.big else 300]
    k_cache, v_cache, block_tables = random_paged_cache(setting, seq_lens, 16, 2, 128)
    q = torch.randn(1, 8, 128, device=setting.device, dtype=setting.dtype)
    sl = torch.tensor(seq_lens, device=setting.device, dtype=torch.int32)
    out = paged_attention_decode(q, k_cache, v_cache, block_tables, sl, 128**-0.5)
    ref = paged_attention_decode_ref(q, k_cache, v_cache, block_tables, sl, 128**-0.5)
    check("decode heuristic", out, ref, setting)


def run_prefill(
    s: Setting, query_lens: list[int], context_lens: list[int], Hq: int, Hk: int, D: int, block_size: int,
    config: PrefillConfig | None = None,
) -> None:  # fmt: skip
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    k_cache, v_cache, block_tables = random_paged_cache(s, seq_lens, block_size, Hk, D)
    T = sum(query_lens)
    q = torch.randn(T, Hq, D, device=s.device, dtype=s.dtype)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], device=s.device, dtype=torch.int32)
    sl = torch.tensor(seq_lens, device=s.device, dtype=torch.int32)
    args = (q, k_cache, v_cache, block_tables, qsl, sl, max(query_lens), D**-0.5)
    out = prefill_attention(*args, config=config) if config else paged_attention_prefill(*args)
    ref = paged_attention_prefill_ref(*args)
    check(f"prefill q={query_lens} ctx={context_lens}", out, ref, s)


PREFILL_SHAPES = [(2, 2, 64, 8), (4, 2, 128, 16), (8, 2, 64, 8), (8, 1, 128, 16), (6, 2, 80, 16)]


@pytest.mark.parametrize("Hq,Hk,D,block_size", PREFILL_SHAPES)
def test_paged_prefill_mixed_batch_matches_reference(
    setting: Setting, Hq: int, Hk: int, D: int, block_size: int
) -> None:
    # Decodes (query 1) beside a fresh prompt, a chunk after a prefix hit, page-boundary lengths.
    query_lens = [1, 23, 1, block_size + 1, block_size]
    context_lens = [9, 0, 0, 2 * block_size - 1, block_size]
    if setting.big:
        query_lens, context_lens = [q * 37 for q in query_lens], [c * 37 for c in context_lens]
    run_prefill(setting, query_lens, context_lens, Hq, Hk, D, block_size)


def test_paged_prefill_small_tiles_cross_pages_and_query_tiles(setting: Setting) -> None:
    # 16-row tiles (4 tokens x 4 heads) and 16-key tiles over 8-token pages: many query tiles per
    # sequence, causal diagonals inside tiles, and the tile-to-sequence search over 6 sequences.
    query_lens = [13, 1, 2, 30, 5, 1]
    context_lens = [0, 3, 17, 11, 40, 0]
    run_prefill(setting, query_lens, context_lens, 8, 2, 64, 8, PrefillConfig(16, 16, 4, 2))


def test_paged_prefill_only_decodes_equals_decode_kernel(setting: Setting) -> None:
    # A batch of single-token queries through the prefill kernel is exactly a decode batch.
    seq_lens = [1, 8, 9, 33]
    k_cache, v_cache, block_tables = random_paged_cache(setting, seq_lens, 8, 2, 64)
    q = torch.randn(len(seq_lens), 4, 64, device=setting.device, dtype=setting.dtype)
    sl = torch.tensor(seq_lens, device=setting.device, dtype=torch.int32)
    qsl = torch.arange(len(seq_lens) + 1, device=setting.device, dtype=torch.int32)
    out = paged_attention_prefill(q, k_cache, v_cache, block_tables, qsl, sl, 1, 0.125)
    check(
        "prefill of decodes",
        out,
        paged_attention_decode(q, k_cache, v_cache, block_tables, sl, 0.125),
        setting,
    )


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("Hq,Hk,D,block_size", PREFILL_SHAPES[:3])
def test_mixed_step_decodes_taken_by_the_decode_kernel_match_reference(
    setting: Setting, Hq: int, Hk: int, D: int, block_size: int, ordered: bool
) -> None:
    # A mixed step as the scheduler lays it out: decodes first (contexts from one token to several pages),
    # then a chunk after earlier chunks, a fresh prompt, a one-token prompt. The decode kernel takes the
    # leading decodes (longest first, or in batch order), the prefill kernel the rest, into one output.
    # 37 decodes: more rows than a query tile, so that the prefill kernel's grid has tiles before its first
    # sequence's rows.
    query_lens = [1] * 37 + [block_size + 1, 23, 1]
    context_lens = [(9, 0, 3 * block_size + 2, block_size)[i % 4] for i in range(37)]
    context_lens += [2 * block_size - 1, 0, 0]
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    k_cache, v_cache, block_tables = random_paged_cache(setting, seq_lens, block_size, Hk, D)
    q = torch.randn(sum(query_lens), Hq, D, device=setting.device, dtype=setting.dtype)
    starts = [0, *itertools.accumulate(query_lens)]
    qsl = torch.tensor(starts, device=setting.device, dtype=torch.int32)
    sl = torch.tensor(seq_lens, device=setting.device, dtype=torch.int32)
    nd = leading_decodes(query_lens)
    assert nd == 37
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(len(q), dtype=torch.int64, device=setting.device),
        query_start_loc=qsl, seq_lens=sl, block_tables=block_tables, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), query_lens_cpu=query_lens, seq_lens_cpu=seq_lens, num_decodes=nd,
        decode_order=longest_first(sl[:nd]) if ordered else None,
    )  # fmt: skip
    out = TritonBackend().attend(q, k_cache, v_cache, meta, D**-0.5)
    ref = paged_attention_prefill_ref(q, k_cache, v_cache, block_tables, qsl, sl, max(query_lens), D**-0.5)
    check(f"mixed step, decodes apart, {Hq}/{Hk}x{D}", out, ref, setting)
    # The prefill kernel from the first sequence after the decodes leaves their rows as they were.
    rest = prefill_attention(
        q, k_cache, v_cache, block_tables, qsl, sl, max(query_lens), D**-0.5, first_seq=nd,
        out=torch.full_like(q, float("nan")),
    )  # fmt: skip
    assert torch.isnan(rest[:nd]).all()
    check("prefill from the first non-decode", rest[nd:], ref[nd:], setting)


def test_leading_decodes_counts_the_one_row_sequences_in_front() -> None:
    assert leading_decodes([1, 1, 5, 1]) == 2
    assert leading_decodes([3, 1]) == 0
    assert leading_decodes([1, 1, 1]) == 3


def test_paged_prefill_long_prompt_matches_reference(setting: Setting) -> None:
    # Several 128-row query tiles with the default (GPU) tiles, after a prefix hit.
    run_prefill(setting, [300, 1], [45, 200], 4, 1, 128, 16)


def test_prefill_narrow_tiles_up_to_a_longest_query_then_wide_ones() -> None:
    # bf16, qwen3-0.6b's 16/8 heads: 64-row tiles of 64 keys up to the threshold, 128 x 128 past it; 0 keeps
    # the wide tiles wherever the queries fill them; a float8 cache keeps its own tiles
    def tiles(max_query_len: int, narrow_up_to: int, fp8: bool = False) -> tuple[int, int]:
        c = default_prefill_config(max_query_len, 2, 128, torch.bfloat16, fp8, narrow_up_to)
        return c.block_m, c.block_n

    assert tiles(1024, 1024) == (64, 64) and tiles(100, 1024) == (64, 64)
    assert tiles(1025, 1024) == (128, 128) and tiles(100, 0) == (128, 128)
    assert tiles(20, 0) == tiles(20, 1024) == (64, 64)  # too short to fill wide tiles either way
    assert tiles(100, 1024, fp8=True) == (128, 64)


def test_triton_backend_takes_its_prefill_tiles_from_the_threshold(setting: Setting) -> None:
    # the backend passes its threshold down: a step longer than it and one within it, both as the reference
    query_lens, context_lens = [70, 1, 33], [0, 40, 17]
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    k_cache, v_cache, block_tables = random_paged_cache(setting, seq_lens, 16, 2, 64)
    q = torch.randn(sum(query_lens), 4, 64, device=setting.device, dtype=setting.dtype)
    qsl = torch.tensor([0, *itertools.accumulate(query_lens)], device=setting.device, dtype=torch.int32)
    sl = torch.tensor(seq_lens, device=setting.device, dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(len(q), dtype=torch.int64, device=setting.device),
        query_start_loc=qsl, seq_lens=sl, block_tables=block_tables, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), query_lens_cpu=query_lens, seq_lens_cpu=seq_lens, num_decodes=0,
    )  # fmt: skip
    ref = paged_attention_prefill_ref(q, k_cache, v_cache, block_tables, qsl, sl, max(query_lens), 0.125)
    for narrow in (0, 64, 1024):
        check(
            f"prefill, narrow up to {narrow}",
            TritonBackend(None, narrow).attend(q, k_cache, v_cache, meta, 0.125),
            ref,
            setting,
        )


# --- contracts around the kernels --------------------------------------------------------------------


@pytest.mark.skipif(
    INTERPRET or not (torch.cuda.is_available() and flash_attn_available()),
    reason="flash-attn needs a GPU and the package",
)
@pytest.mark.parametrize("block_size", [16, 128])
def test_flash_attn_backend_matches_reference(block_size: int) -> None:
    # flash-attn has no float32 kernels, so the engine's float32 parity suite cannot cover this backend:
    # here it reads the same paged cache as the reference, in bf16 (decodes, a fresh prompt, chunks after
    # a prefix, page-boundary lengths; 16 query / 8 KV heads of 128 as qwen3-8b).
    s = Setting("cuda", torch.bfloat16, 2e-2, big=True)
    query_lens = [1, 300, 1, block_size + 1, 64, 1]
    context_lens = [900, 0, 4 * block_size, 2 * block_size - 1, 1000, 0]
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    k_cache, v_cache, block_tables = random_paged_cache(s, seq_lens, block_size, 8, 128)
    q = torch.randn(sum(query_lens), 16, 128, device="cuda", dtype=s.dtype)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    sl = torch.tensor(seq_lens, device="cuda", dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.full((sum(query_lens),), -1, device="cuda", dtype=torch.int64),
        query_start_loc=qsl,
        seq_lens=sl,
        block_tables=block_tables,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )
    out = FlashAttnBackend().attend(q, k_cache, v_cache, meta, 128**-0.5)
    ref = paged_attention_prefill_ref(q, k_cache, v_cache, block_tables, qsl, sl, max(query_lens), 128**-0.5)
    check(f"flash_attn block_size={block_size}", out, ref, s)


@pytest.mark.gpu  # CUDA graphs need a CUDA device
def test_paged_decode_replays_in_a_cuda_graph() -> None:
    # Split-KV scratch and grid come from shapes only: a captured graph must follow new seq_lens.
    s = Setting("cuda", torch.bfloat16, 2e-2, big=True)
    seq_lens = [700, 3]
    k_cache, v_cache, block_tables = random_paged_cache(s, [1024, 1024], 16, 2, 128)
    q = torch.randn(2, 8, 128, device="cuda", dtype=torch.bfloat16)
    sl = torch.tensor(seq_lens, device="cuda", dtype=torch.int32)
    paged_attention_decode(q, k_cache, v_cache, block_tables, sl, 0.1)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention_decode(q, k_cache, v_cache, block_tables, sl, 0.1)
    for new_lens in ([5, 1000], [1024, 17]):
        sl.copy_(torch.tensor(new_lens))
        q.normal_()
        graph.replay()
        check(
            f"graph replay {new_lens}",
            out,
            paged_attention_decode_ref(q, k_cache, v_cache, block_tables, sl, 0.1),
            s,
        )


def test_kernel_modules_import_without_triton_and_say_so_when_called() -> None:
    code = """
import sys
sys.modules["triton"] = None  # makes `import triton` raise ImportError
import torch
from llmbench.kernels import activation, attention_prologue, kv_store, paged_attention, rmsnorm, rotary, skinny_matmul
x = torch.zeros(2, 8)
calls = [
    lambda: rmsnorm.rms_norm(x, torch.ones(8), 1e-6),
    lambda: activation.silu_and_mul(x),
    lambda: skinny_matmul.skinny_matmul(x, x),
    lambda: rotary.apply_rotary(x.view(2, 1, 8), x.view(2, 1, 8), torch.zeros(2, dtype=torch.long), torch.zeros(4, 8)),
    lambda: kv_store.store_kv(x.view(2, 1, 8), x.view(2, 1, 8), x.view(1, 2, 1, 8), x.view(1, 2, 1, 8), torch.zeros(2, dtype=torch.long)),
    lambda: paged_attention.paged_attention_decode(x.view(2, 1, 8), x.view(1, 2, 1, 8), x.view(1, 2, 1, 8), None, None, 1.0),
    lambda: attention_prologue.attention_prologue(x, None, None, None, None, 1e-6, x, x, None, 1, 1),
    lambda: paged_attention.paged_attention_prefill(x.view(2, 1, 8), x.view(1, 2, 1, 8), x.view(1, 2, 1, 8), None, None, None, 1, 1.0),
]
for call in calls:
    try:
        call()
    except RuntimeError as e:
        assert "needs Triton" in str(e), e
    else:
        raise SystemExit("no RuntimeError")
print(rmsnorm.rms_norm_ref(x, torch.ones(8), 1e-6)[0].shape)
"""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(INTERPRET, reason="counts compiled kernel variants: needs the GPU compiler")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_eager_decode_steps_compile_nothing_after_the_warm_up(kv_cache_dtype: str) -> None:
    # A JIT compile inside a measured step is a ~1 s stall: the start-up warm-up must cover every
    # split-KV variant an eager decode step can pick (batch and block-table width vary per step), the
    # tiles of batches of one context length (a float8 cache's differ), and the decodes of mixed steps
    # (a small token budget chunks the longer prompts beside running decodes: Tuning.mixed_step_decodes).
    from llmbench import LLM, SamplingParams
    from llmbench.kernels import triton_decode, triton_prefill

    def compiled() -> int:  # Triton 3.x: device_caches[device][0] is the compiled-kernel cache
        kernels = (
            triton_decode._decode_kernel,
            triton_decode._decode_reduce_kernel,
            triton_prefill._prefill_kernel,
        )
        return sum(len(entry[0]) for k in kernels for entry in k.device_caches.values())

    llm = LLM("qwen3-tiny", device="cuda", cuda_graph=False, max_model_len=2048, num_kv_blocks=512,
              kv_cache_dtype=kv_cache_dtype, max_num_batched_tokens=512)  # fmt: skip
    assert llm.engine.config.tuning.mixed_step_decodes
    before = compiled()
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    llm.generate([[1] * n for n in (1, 30, 300, 1500)], params)  # widths and batch sizes that vary
    for batch in (3, 40, 100):  # batches of one context length, in one slice or several, in order or not
        llm.generate([[2] * 200] * batch, params)
    assert compiled() == before, "a decode step compiled a kernel variant after start-up"


@pytest.mark.parametrize("rows,passes", [(64, [64, 0]), (0, [0])])
def test_the_warm_up_compiles_each_kernel_with_programmatic_launch_and_without(
    monkeypatch, rows, passes
) -> None:
    # A launch takes programmatic dependent launch by its own rows: the warm-up's few-row dummy steps
    # compile the PDL variants, and a step of more rows runs the same tiles without it (the GPU test
    # above caught those compiling mid-run); so the dummy steps run once as configured and once with it off.
    from types import SimpleNamespace

    from llmbench.engine import warmup

    launches: list[int] = []
    seen: list[int] = []
    monkeypatch.setattr(warmup, "set_programmatic_launch", launches.append)
    monkeypatch.setattr(warmup, "_steps_and_splits", lambda runner: seen.append(launches[-1]))
    runner = SimpleNamespace(config=SimpleNamespace(tuning=SimpleNamespace(programmatic_launch_rows=rows)))
    warmup.kernel_variants(runner)
    assert seen == passes and launches[-1] == rows  # every pass, then the engine's setting back


def test_the_read_ceiling_kernel_sums_every_block_it_reads(monkeypatch) -> None:
    # devtools/bench_kernels.py's first rows: a kernel that only reads; its sums are checked there too
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "devtools"))
    import bench_kernels

    env = bench_kernels.Env.pick(smoke=DEVICES != ["cuda"])
    x = env.t(4096)
    out = torch.empty(4096 // 256, device=env.device, dtype=torch.float32)
    bench_kernels._stream_read_kernel[(out.numel(),)](x, out, BLOCK=64, STEPS=4)
    torch.testing.assert_close(out, x.view(16, 256).float().sum(dim=1), rtol=1e-5, atol=1e-4)
    rows = bench_kernels.read_ceiling_case(env, 4096, block=64, steps=4)
    assert [r.kernel for r in rows] == ["stream read (Triton)", "sum (torch)", "copy (torch)"]
    assert rows[0].max_rel_diff < 1e-5 and all(r.time_us > 0 for r in rows)
    # the copy timed as llmbench calibrate times it: a CUDA graph replays it as a slower copy node
    assert [r.timing for r in rows] == ["graph", "graph", "eager"]


@pytest.mark.parametrize("shuffled,paired", [(False, False), (True, True)])
def test_the_chunk_read_kernel_sums_the_chunks_it_is_given(monkeypatch, shuffled, paired) -> None:
    # devtools/bench_kernels.py --tune read-pattern: chunks in a given order, alone or in K/V pairs
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "devtools"))
    import bench_kernels

    env = bench_kernels.Env.pick(smoke=DEVICES != ["cuda"])
    n, chunk = 4096, 256  # elements
    halves = 2 if paired else 1
    num_chunks = n // halves // chunk
    x = env.t(n)
    order = torch.randperm(num_chunks) if shuffled else torch.arange(num_chunks)
    chunks = order.to(device=env.device, dtype=torch.int32)
    out = torch.empty(num_chunks // 2, device=env.device, dtype=torch.float32)  # two chunks a program
    bench_kernels._chunk_read_kernel[(out.numel(),)](
        x, chunks, out, n // 2, BLOCK=64, STEPS=chunk // 64, CHUNKS=2, PAIRED=paired
    )
    parts = x.view(halves, num_chunks, chunk).float().sum(dim=(0, 2))
    torch.testing.assert_close(out, parts[order.to(env.device)].view(-1, 2).sum(dim=1), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("placement", ["in order", "spread 4"])
def test_the_benchmark_pool_places_each_sequence_pages_as_asked(monkeypatch, placement) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "devtools"))
    import bench_kernels

    env = bench_kernels.Env.pick(smoke=True)
    k, v, tables, _ = bench_kernels.paged_cache(env, 3, 40, 16, 2, 8, placement=placement)
    pages = tables.flatten().long()
    assert pages.unique().numel() == pages.numel() == 9  # three pages each, none shared
    if placement == "in order":
        assert pages.tolist() == list(range(9)) and k.shape[0] == v.shape[0] == 9
    else:
        assert k.shape[0] == 36 and int(pages.max()) < 36


@pytest.mark.skipif(DEVICES == ["cuda"], reason="the script's CPU smoke form")
def test_bench_kernels_read_ceiling_writes_those_rows_alone(tmp_path) -> None:
    script = Path(__file__).resolve().parents[1] / "devtools" / "bench_kernels.py"
    out = tmp_path / "rows.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, str(script), "--smoke", "--read-ceiling", "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=600)
    rows = json.loads(out.read_text())
    assert [r["kernel"] for r in rows] == ["stream read (Triton)", "sum (torch)", "copy (torch)"]
