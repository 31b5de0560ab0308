"""A decode step's products, every layer, in ONE persistent kernel: does it beat cuBLAS in a CUDA graph?

On qwen3-0.6b a decode step's four products a layer (q/k/v N=4096 K=1024, o N=1024 K=2048, gate/up N=6144
K=1024, down N=1024 K=3072) take 25-29 µs a layer under cuBLAS at 16-256 rows on an H200 while their weights
(31 MB) read in ~7.5 µs: launch, ramp and drain are the cost. Here one Triton kernel runs the chain x -> qkv
-> o (of qkv[:, :2H]) -> silu(gate) * up -> down -> the next layer's x over L layers, each with its own
weights (nothing stays in L2), grid-wide barriers where kernel boundaries were; against the same products
by cuBLAS with the engine's SiLU-and-multiply kernel, in one CUDA graph. No residual and no norm: silu(gate) *
up is quadratic in a small input, so the activations fall towards zero over many layers, and outputs are
checked over the first CHECK_LAYERS layers (the timings do not depend on the values).

Design. Programs take a product's tiles (BLOCK_M rows x BLOCK_N features, tl.dot, float32 sums, bf16 between
products), tile t to program t % programs. The narrow products (o, down) may cut K into ``split`` parts for
more tiles, summed by float32 atomics into a buffer the kernel zeroed two barriers before (``atomic``) or
stored apart and summed by the next product's loads. SiLU-and-multiply is the gate/up epilogue: a tile is
BLOCK_N/2 gate rows and the same features' up rows. At a barrier a program arrives, loads its first weight
chunk of the next product (weights depend on nothing written) and then waits: the read overlaps the wait.

The barrier: an int32 counter. A program arrives (a CTA barrier, then thread 0's release add, as
cooperative groups' grid.sync() and torch inductor's x_grid_barrier do) and spins on an acquire load until
the counter reaches (products done) x (programs): a target that only grows, so nothing is reset within a
launch (tl.atomic_poll waits for equality, which a late poller could miss); the last program out resets
it to 0. Activations are read ``.cg`` (from L2, never a stale L1 line of the layer before). It deadlocks
unless every program is resident at once: the grid is multiprocessors x ``per_sm``, checked against the
compiled kernel's registers, shared memory and warps (``SmLimits``), and launched cooperatively, so that
the driver refuses a grid that cannot be resident rather than start it; nothing else may hold
multiprocessors meanwhile (MPS, a kernel of another stream that waits on this one).

    python devtools/persistent_chain.py --rows 1 8 16 64 128 256 --layers 28 --json FILE
    TRITON_INTERPRET=1 python devtools/persistent_chain.py --smoke   # tiny sizes on the CPU

The interpreter runs programs one after another, so a barrier never opens: there each launch runs one
product of one layer (``ONLY_PHASE``) through the same tile code, without barriers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

if "--smoke" in sys.argv:  # must be decided before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmbench.kernels._triton import jit, next_power_of_2, tl  # noqa: E402
from llmbench.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402

import bench_kernels  # noqa: E402  (this script's folder)
from bench_kernels import Env, Row, check, row, time_us  # noqa: E402

SILU_MUL_VAR = 0.356  # E[silu(g)^2 u^2] for unit normal g, u: the down weights' gain is 1 / sqrt of it
CHECK_LAYERS = 4  # the layers a check runs through (``measure``)
INTERPRET_PROGRAMS = 5  # the CPU's grid: fewer programs than most products' tiles, more than some
SiluMul = Callable[[torch.Tensor], torch.Tensor]  # (M, 2I) gate | up -> (M, I)


class Chain(NamedTuple):
    """Each product's weights of all layers, (L, N, K) bf16 as F.linear takes one layer's: q/k/v (L, 4H, H),
    o (L, H, 2H), gate/up (L, 6H, H), down (L, H, 3H); qwen3-0.6b's at H = 1024."""

    wqkv: torch.Tensor
    wo: torch.Tensor
    wgu: torch.Tensor
    wd: torch.Tensor

    @classmethod
    def random(cls, layers: int, h: int, device: str) -> Chain:
        def w(n: int, k: int, gain: float = 1.0) -> torch.Tensor:  # unit-scale outputs of unit-scale inputs
            return (torch.randn(layers, n, k, device=device) * (gain / k) ** 0.5).to(torch.bfloat16)

        return cls(w(4 * h, h), w(h, 2 * h), w(6 * h, h), w(h, 3 * h, 1 / SILU_MUL_VAR))

    @property
    def layers(self) -> int:
        return self.wqkv.shape[0]

    @property
    def hidden(self) -> int:
        return self.wqkv.shape[2]

    @property
    def weight_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in self)


def chain_ref(x: torch.Tensor, c: Chain, silu_mul: SiluMul = silu_and_mul_ref) -> torch.Tensor:
    # x (M, H) -> (M, H), through every layer
    h = c.hidden
    for layer in range(c.layers):
        qkv = F.linear(x, c.wqkv[layer])  # (M, 4H)
        o = F.linear(qkv[:, : 2 * h], c.wo[layer])  # (M, H)
        act = silu_mul(F.linear(o, c.wgu[layer]))  # (M, 6H) -> (M, 3H)
        x = F.linear(act, c.wd[layer])  # (M, H)
    return x


@dataclass(frozen=True)
class Tiling:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split: int = 1  # parts of K of the narrow products (o, down)
    atomic: bool = True  # parts summed by float32 atomics; else stored apart, summed by the next loads
    per_sm: int = 1  # programs a multiprocessor

    @property
    def parts(self) -> int:  # slices of the narrow products' float32 output buffers
        return 1 if self.atomic else self.split

    @property
    def name(self) -> str:
        cut = f" split {self.split} {'atomic' if self.atomic else 'parts'}" if self.split > 1 else ""
        return (
            f"m{self.block_m} n{self.block_n} k{self.block_k} w{self.num_warps} s{self.num_stages}{cut}"
            f" {self.per_sm}/SM"
        )

    def validate(self, hidden: int) -> None:
        steps = {  # what must divide what: every tile whole, no masks on the weights
            "hidden (o and down's N)": (hidden, self.block_n),
            "hidden (q/k/v and gate/up's K)": (hidden, self.block_k),
            "o's K": (2 * hidden, self.split * self.block_k),
            "down's K": (3 * hidden, self.split * self.block_k),
        }
        wrong = [
            f"{name} {size} is no multiple of {step}" for name, (size, step) in steps.items() if size % step
        ]
        blocks = (self.block_m, self.block_n, self.block_k)
        if any(b < 16 or b & (b - 1) for b in blocks):
            wrong.append(f"blocks {blocks} must be powers of 2 from 16 (tl.dot)")
        if wrong:
            raise ValueError(f"tiling {self.name} does not fit hidden {hidden}: {'; '.join(wrong)}")


class SmLimits(NamedTuple):
    """What one multiprocessor holds: 32-bit registers, bytes of shared memory, threads."""

    regs: int
    shared: int
    threads: int

    @classmethod
    def of(cls, device: torch.device) -> SmLimits:
        p = torch.cuda.get_device_properties(device)
        return cls(
            p.regs_per_multiprocessor, p.shared_memory_per_multiprocessor, p.max_threads_per_multi_processor
        )

    def programs(self, n_regs: int, shared: int, num_warps: int) -> int:
        """Programs of a compiled kernel resident at once: registers (allocated a warp at a time, in units
        of 256), shared memory (1 KiB of it reserved a block), threads, and at most 32 blocks."""
        regs_per_warp = -(-max(n_regs, 1) * 32 // 256) * 256
        by_regs = self.regs // regs_per_warp // num_warps
        return min(by_regs, self.shared // (shared + 1024), self.threads // (32 * num_warps), 32)


@jit
def _tile(t, M, N: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Tile t -> (feature block, part of K, row block): consecutive tiles share a weight block, so the
    # programs that take them at the same time read it from HBM once.
    mblocks = tl.cdiv(M, BLOCK_M)
    rest = t // mblocks
    return rest // SPLIT, rest % SPLIT, t % mblocks


@jit
def _weight_chunk(w_ptr, layer, nb, k0, N: tl.constexpr, K: tl.constexpr, GATED: tl.constexpr,
                  FFN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    # (BN, BK) of layer's (N, K) weight; int64, as a larger model's stack passes 2**31 elements (qwen3-8b's
    # gate/up: 3.6e9). GATED: BN/2 gate rows, then the up rows of the same features.
    r = tl.arange(0, BLOCK_N)
    if GATED:
        rows = (r // (BLOCK_N // 2)) * FFN + nb * (BLOCK_N // 2) + r % (BLOCK_N // 2)
    else:
        rows = nb * BLOCK_N + r
    w = w_ptr + tl.cast(layer, tl.int64) * (N * K) + rows.to(tl.int64)[:, None] * K
    return tl.load(w + k0 + tl.arange(0, BLOCK_K)[None, :])


@jit
def _input_chunk(in_ptr, rows, k0, M, STRIDE: tl.constexpr, PARTS: tl.constexpr, BLOCK_K: tl.constexpr,
                 INTERPRET: tl.constexpr):  # fmt: skip
    # (BM, BK) of the product's input, bf16: float32 parts summed, then rounded as a bf16 product rounds
    ptrs = in_ptr + rows[:, None] * STRIDE + k0 + tl.arange(0, BLOCK_K)[None, :]
    mask = (rows < M)[:, None]
    x = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    for p in tl.static_range(1, PARTS):
        x += tl.load(ptrs + p * M * STRIDE, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    return _bf16(x, INTERPRET)  # (BM, BK)


@jit
def _bf16(x, INTERPRET: tl.constexpr):
    # float32 -> bf16 rounded to nearest even. The interpreter's cast truncates: there the bits are
    # rounded first, which leaves the cast exact.
    if INTERPRET:
        b = x.to(tl.uint32, bitcast=True)
        x = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@jit
def _mma(w, x, acc, INTERPRET: tl.constexpr):
    # acc (BN, BM) += w (BN, BK) @ x (BM, BK).T. The interpreter's tl.dot multiplies bf16 bit patterns
    # (triton#11584): there the same bf16 values in float32, whose products are exact.
    if INTERPRET:
        return tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(w, tl.trans(x), acc)


@jit
def _product(in_ptr, w_ptr, out_ptr, w_first, layer, M, pid, nprog,
             IN_STRIDE: tl.constexpr, IN_PARTS: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
             EPILOGUE: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr, FFN: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             INTERPRET: tl.constexpr):  # fmt: skip
    # out = in[:, :K] @ w[layer].T over tiles pid, pid + nprog, ...; w_first: the first tile's first chunk,
    # loaded while this program waited at the barrier before. EPILOGUE 0: bf16 out (M, N); 1: silu(gate)
    # * up, bf16 (M, FFN); 2: float32 sums (parts, M, N), a part's added atomically or stored at its slice.
    k_part = K // SPLIT
    w = w_first  # (BN, BK)
    for t in range(pid, N // BLOCK_N * SPLIT * tl.cdiv(M, BLOCK_M), nprog):
        nb, s, mb = _tile(t, M, N, SPLIT, BLOCK_M, BLOCK_N)
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        k_lo = s * k_part
        x = _input_chunk(in_ptr, rows, k_lo, M, IN_STRIDE, IN_PARTS, BLOCK_K, INTERPRET)
        acc = _mma(w, x, tl.zeros((BLOCK_N, BLOCK_M), tl.float32), INTERPRET)  # (BN, BM)
        for k0 in range(k_lo + BLOCK_K, k_lo + k_part, BLOCK_K):
            wk = _weight_chunk(w_ptr, layer, nb, k0, N, K, EPILOGUE == 1, FFN, BLOCK_N, BLOCK_K)
            x = _input_chunk(in_ptr, rows, k0, M, IN_STRIDE, IN_PARTS, BLOCK_K, INTERPRET)
            acc = _mma(wk, x, acc, INTERPRET)
        # The next tile's first chunk, read during this one's epilogue (after the last tile, one of another
        # program's, from L2, unused). Loaded here, not at the next tile's top, it is not held in registers
        # through the K loop.
        w = _first_chunk(
            w_ptr, layer, t + nprog, M, N, K, SPLIT, EPILOGUE == 1, FFN, BLOCK_M, BLOCK_N, BLOCK_K
        )
        row_ok = (rows < M)[None, :]
        if EPILOGUE == 1:
            g, u = tl.split(tl.permute(tl.reshape(acc, (2, BLOCK_N // 2, BLOCK_M)), (1, 2, 0)))  # (BN/2, BM)
            g = _bf16(g, INTERPRET).to(tl.float32)
            u = _bf16(u, INTERPRET).to(tl.float32)
            act = _bf16(g / (1.0 + tl.exp(-g)), INTERPRET).to(tl.float32)  # F.silu's output, rounded
            cols = nb * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            tl.store(out_ptr + rows[None, :] * FFN + cols[:, None], _bf16(act * u, INTERPRET), mask=row_ok)
        else:
            ptrs = out_ptr + rows[None, :] * N + (nb * BLOCK_N + tl.arange(0, BLOCK_N))[:, None]
            if EPILOGUE == 0:
                tl.store(ptrs, _bf16(acc, INTERPRET), mask=row_ok)
            elif ATOMIC and SPLIT > 1:
                tl.atomic_add(ptrs, acc, mask=row_ok, sem="relaxed", scope="gpu")
            else:
                tl.store(ptrs + s * M * N, acc, mask=row_ok)


@jit
def _first_chunk(w_ptr, layer, t, M, N: tl.constexpr, K: tl.constexpr, SPLIT: tl.constexpr,
                 GATED: tl.constexpr, FFN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):  # fmt: skip
    # The first chunk of tile t, wrapped: a program without a tile t reads that of tile t % tiles, unused
    nb, s, mb = _tile(t % (N // BLOCK_N * SPLIT * tl.cdiv(M, BLOCK_M)), M, N, SPLIT, BLOCK_M, BLOCK_N)
    return _weight_chunk(w_ptr, layer, nb, s * (K // SPLIT), N, K, GATED, FFN, BLOCK_N, BLOCK_K)


@jit
def _first_of(KIND: tl.constexpr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, layer, pid, M, H: tl.constexpr,
              SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):  # fmt: skip
    # Product KIND's (0 q/k/v, 1 o, 2 gate/up, 3 down) first chunk for this program
    if KIND == 0:
        return _first_chunk(wqkv_ptr, layer, pid, M, 4 * H, H, 1, False, 3 * H, BLOCK_M, BLOCK_N, BLOCK_K)
    elif KIND == 1:
        return _first_chunk(wo_ptr, layer, pid, M, H, 2 * H, SPLIT, False, 3 * H, BLOCK_M, BLOCK_N, BLOCK_K)
    elif KIND == 2:
        return _first_chunk(wgu_ptr, layer, pid, M, 6 * H, H, 1, True, 3 * H, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        return _first_chunk(wd_ptr, layer, pid, M, H, 3 * H, SPLIT, False, 3 * H, BLOCK_M, BLOCK_N, BLOCK_K)


@jit
def _phase(KIND: tl.constexpr, x_ptr, qkv_ptr, o_ptr, h_ptr, d_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr,
           w_pre, layer, M, pid, nprog, H: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           INTERPRET: tl.constexpr):  # fmt: skip
    # Product KIND of `layer`. x, o, d: (parts, M, H) float32 (x: layer 0's input, its parts past the first
    # 0); qkv (M, 4H), h (M, 3H) bf16. With atomics a sum is zeroed one product after its last read
    # (o's: the last layer's gate/up; down's: this layer's q/k/v) and one before its first add.
    PARTS: tl.constexpr = 1 if ATOMIC else SPLIT
    ZERO: tl.constexpr = ATOMIC and SPLIT > 1
    if KIND == 0:  # qkv = x @ wqkv.T
        if ZERO:
            _zero(o_ptr, M * H, pid, nprog, 1024)
        src = tl.where(layer == 0, x_ptr, d_ptr)
        _product(src, wqkv_ptr, qkv_ptr, w_pre, layer, M, pid, nprog, H, PARTS, 4 * H, H, 0, 1, ATOMIC,
                 3 * H, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)  # fmt: skip
    elif KIND == 1:  # o = qkv[:, :2H] @ wo.T
        _product(qkv_ptr, wo_ptr, o_ptr, w_pre, layer, M, pid, nprog, 4 * H, 1, H, 2 * H, 2, SPLIT, ATOMIC,
                 3 * H, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)  # fmt: skip
    elif KIND == 2:  # h = silu(gate) * up of o @ wgu.T
        if ZERO:
            _zero(d_ptr, M * H, pid, nprog, 1024)
        _product(o_ptr, wgu_ptr, h_ptr, w_pre, layer, M, pid, nprog, H, PARTS, 6 * H, H, 1, 1, ATOMIC,
                 3 * H, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)  # fmt: skip
    else:  # d = h @ wd.T, the next layer's x
        _product(h_ptr, wd_ptr, d_ptr, w_pre, layer, M, pid, nprog, 3 * H, 1, H, 3 * H, 2, SPLIT, ATOMIC,
                 3 * H, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)  # fmt: skip


@jit
def _zero(ptr, n, pid, nprog, BLOCK: tl.constexpr):
    # ptr[:n] = 0, BLOCK elements a program at a time
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(ptr + offs, tl.zeros((BLOCK,), tl.float32), mask=offs < n)


@jit
def _arrive(bar_ptr):
    # Every thread's writes of this program (stores, atomics) before thread 0's release add
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")


@jit
def _load_acquire(ptr):
    # A load with acquire semantics at GPU scope (tl.atomic_load is newer than the Triton torch 2.11 brings)
    return tl.inline_asm_elementwise(
        "ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1
    )


@jit
def _wait(bar_ptr, target):
    # Until `target` arrivals in all; acquire: the writes before them are seen after it
    while _load_acquire(bar_ptr) < target:
        pass
    tl.debug_barrier()


@jit(do_not_specialize=("M", "layer_lo", "layer_hi"))
def _chain_kernel(
    x_ptr, qkv_ptr, o_ptr, h_ptr, d_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, bar_ptr, M, layer_lo, layer_hi,
    H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
    ATOMIC: tl.constexpr,
    ONLY_PHASE: tl.constexpr,  # -1: every product of layers [lo, hi), with barriers; 0-3: that product alone
    WORK: tl.constexpr,  # False: the barriers alone (no loads, no products)
    INTERPRET: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    w_pre = tl.zeros((BLOCK_N, BLOCK_K), tl.bfloat16)
    if WORK:
        w_pre = _first_of(max(ONLY_PHASE, 0), wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, layer_lo, pid, M, H, SPLIT,
                          BLOCK_M, BLOCK_N, BLOCK_K)  # fmt: skip
    for layer in range(layer_lo, layer_hi):
        for KIND in tl.static_range(4):
            if ONLY_PHASE < 0 or ONLY_PHASE == KIND:
                if WORK:
                    _phase(KIND, x_ptr, qkv_ptr, o_ptr, h_ptr, d_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr,
                           w_pre, layer, M, pid, nprog, H, SPLIT, ATOMIC, BLOCK_M, BLOCK_N, BLOCK_K,
                           INTERPRET)  # fmt: skip
                nxt = layer + (KIND + 1) // 4  # the next product's layer
                if ONLY_PHASE < 0 and nxt < layer_hi:
                    _arrive(bar_ptr)
                    # Weights depend on no one's writes: read the next product's first chunk while waiting.
                    # After the arrival, not before: its release would wait for this load to land.
                    if WORK:
                        w_pre = _first_of((KIND + 1) % 4, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, nxt, pid, M, H,
                                          SPLIT, BLOCK_M, BLOCK_N, BLOCK_K)  # fmt: skip
                    _wait(bar_ptr, (4 * (layer - layer_lo) + KIND + 1) * nprog)
    if ONLY_PHASE < 0:  # the last program out (no one spins any more) resets the counter for the next launch
        if tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") == 4 * (layer_hi - layer_lo) * nprog - 1:
            tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")


class PersistentChain:
    """The chain at ``rows`` rows under one tiling, its buffers allocated once so that ``launch`` can be
    captured in a CUDA graph: ``set_input(x)``, ``launch()``, then ``output()``. On the CPU (interpreter) each
    launch is 4 x L launches of one product each over ``INTERPRET_PROGRAMS`` programs."""

    def __init__(self, chain: Chain, rows: int, tiling: Tiling, work: bool = True) -> None:
        tiling.validate(chain.hidden)
        self.chain, self.rows, self.tiling, self.work = chain, rows, tiling, work
        dev, h, p = chain.wqkv.device, chain.hidden, tiling.parts
        self.interpret = dev.type == "cpu"
        self.x = torch.zeros(p, rows, h, device=dev)  # (parts, M, H) float32: parts past the first stay 0
        self.qkv = torch.empty(rows, 4 * h, device=dev, dtype=torch.bfloat16)
        self.o = torch.empty(p, rows, h, device=dev)  # zeroed by the kernel where it adds to it
        self.h = torch.empty(rows, 3 * h, device=dev, dtype=torch.bfloat16)
        self.d = torch.empty(p, rows, h, device=dev)
        self.bar = torch.zeros(1, device=dev, dtype=torch.int32)
        self.programs = INTERPRET_PROGRAMS if self.interpret else self._co_resident_grid()

    def _args(self, lo: int, hi: int, only_phase: int) -> tuple[tuple, dict]:
        c, t = self.chain, self.tiling
        args = (self.x, self.qkv, self.o, self.h, self.d, *c, self.bar, self.rows, lo, hi)
        meta = dict(
            H=c.hidden, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, SPLIT=t.split,
            ATOMIC=t.atomic, ONLY_PHASE=only_phase, WORK=self.work, INTERPRET=self.interpret,
            num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip
        if not self.interpret:  # the driver refuses a grid that cannot be resident at once: no deadlock
            meta["launch_cooperative_grid"] = True
        return args, meta

    def _co_resident_grid(self) -> int:
        # Compiled first, not launched: a grid larger than what fits at once would never pass a barrier
        args, meta = self._args(0, self.chain.layers, -1)
        kernel = _chain_kernel.warmup(*args, grid=(1,), **meta)
        kernel._init_handles()  # loads the binary: its register count
        device = self.chain.wqkv.device
        fit = SmLimits.of(device).programs(kernel.n_regs, kernel.metadata.shared, self.tiling.num_warps)
        if fit < self.tiling.per_sm:
            raise ValueError(
                f"{self.tiling.name}: {self.tiling.per_sm} programs a multiprocessor asked, {fit} fit "
                f"({kernel.n_regs} registers, {kernel.metadata.shared} B shared memory)"
            )
        return torch.cuda.get_device_properties(device).multi_processor_count * self.tiling.per_sm

    def set_input(self, x: torch.Tensor) -> None:
        self.x[0].copy_(x)  # (M, H)

    def launch(self) -> None:
        if not self.interpret:
            args, meta = self._args(0, self.chain.layers, -1)
            _chain_kernel[(self.programs,)](*args, **meta)
            return
        for layer in range(self.chain.layers):
            for phase in range(4):
                args, meta = self._args(layer, layer + 1, phase)
                _chain_kernel[(self.programs,)](*args, **meta)

    def output(self) -> torch.Tensor:
        return self.d.sum(0).to(torch.bfloat16)  # (M, H)


def rel_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    # as bench_kernels.check measures it: the largest difference over the largest reference value
    return (out.float() - ref.float()).abs().max().item() / max(ref.float().abs().max().item(), 1e-6)


def sweep(rows: int, smoke: bool) -> list[Tiling]:
    if smoke:
        return [
            Tiling(16, 32, 32, 4, 2, split, atomic) for split, atomic in ((1, True), (2, True), (2, False))
        ]
    bm = min(64, max(16, next_power_of_2(rows)))  # one block of rows up to 64, blocks of 64 past it
    shapes = [  # block_n, block_k, warps, stages, split, atomic, programs a multiprocessor
        (64, 64, 4, 3, 1, True, 1),
        (64, 64, 4, 3, 4, True, 1),
        (64, 64, 4, 3, 8, True, 1),  # o, down: 16 feature blocks x 8 parts = 128 tiles at one block of rows
        (64, 64, 4, 2, 4, False, 1),  # parts summed by the loads: every part's chunk in shared memory
        (64, 64, 4, 3, 8, True, 2),
        (128, 64, 8, 3, 8, True, 1),
        (32, 64, 4, 4, 8, True, 1),  # twice the tiles of q/k/v and gate/up
    ]  # (block_k 128 spills registers at 64 rows: compiled for sm_90 with Triton 3.9)
    return [Tiling(bm, *s) for s in shapes]


def measure(env: Env, chain: Chain, m: int, silu_mul: SiluMul) -> list[Row]:
    """Check, then time, at m rows: the cuBLAS chain, the persistent kernel under each tiling (the best one
    reported) and that one's barriers alone."""
    layers, wbytes = chain.layers, chain.weight_bytes
    shape = f"{'0.6b' if chain.hidden == 1024 else f'hidden {chain.hidden}'} x{layers} layers {m} rows"
    flops = m * wbytes  # 2 a weight (wbytes / 2 of them) a row
    x = torch.randn(m, chain.hidden, device=env.device, dtype=torch.bfloat16)
    # Checked over the first layers only: with no residual or norm between layers silu(gate) * up is
    # quadratic in a small input, so the activations fall towards zero over 28 layers, where no check
    # could see an error (the timings do not depend on the values).
    head = Chain(*(w[:CHECK_LAYERS] for w in chain))
    ref = chain_ref(x, head)
    # bf16 roundings compound over the layers: allow three times the bf16 reference's own distance from
    # float32 arithmetic, at least 2e-2
    tol = max(2e-2, 3 * rel_diff(ref, chain_ref(x.float(), Chain(*(w.float() for w in head)))))
    rel = check(f"cuBLAS chain m={m}", chain_ref(x, head, silu_mul), ref, tol)
    cublas = time_us(env, lambda: chain_ref(x, chain, silu_mul))
    timed = []
    for t in sweep(m, env.smoke):
        try:
            first = PersistentChain(head, m, t)
            first.set_input(x)
            first.launch()
            rel_t = check(f"persistent m={m} {t.name}", first.output(), ref, tol)
            if (
                first.bar.item() != 0
            ):  # a scalar atomic that every thread ran, say: the barriers counted wrong
                raise SystemExit(f"{t.name}: the barrier counter is {first.bar.item()} after a launch, not 0")
            run = PersistentChain(chain, m, t)
            run.set_input(x)
            timed.append((time_us(env, run.launch), rel_t, t, run.programs))
        except Exception as e:  # out of registers or shared memory, too few programs fit at once
            print(f"  m={m} {t.name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    if not timed:
        raise SystemExit(f"m={m}: no tiling ran")
    timed.sort(key=lambda r: r[0])
    us, rel_t, best, programs = timed[0]
    bars = time_us(env, PersistentChain(chain, m, best, work=False).launch)
    for us_t, _, t, _ in timed[:4]:
        print(f"  m={m:<4} {t.name:<42} {us_t:9.1f} us  {us_t / layers:6.2f} us a layer")
    print(
        f"m={m:<4} cuBLAS graph {cublas:9.1f} us ({cublas / layers:.2f} a layer)   persistent {us:9.1f} us "
        f"({us / layers:.2f} a layer, {cublas / us:.2f}x)   barriers alone {bars:8.1f} us "
        f"({bars / (4 * layers - 1):.2f} a barrier, launch included; {programs} programs)"
    )
    return [
        row("chain (cuBLAS graph)", shape, cublas, wbytes, rel, flops),
        row(f"chain (persistent, best {best.name})", shape, us, wbytes, rel_t, flops),
        row(f"chain (persistent, barriers alone, {programs} programs)", shape, bars, 0, None),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 64, 128, 256], help="decode rows (M)")
    ap.add_argument("--layers", type=int, default=28, help="layers, each with its own weights")
    ap.add_argument("--hidden", type=int, default=1024, help="H: q/k/v 4H x H, o H x 2H, gate/up 6H x H...")
    ap.add_argument("--json", type=Path, help="write the rows (llmbench docs' kernels blocks) here")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    args = ap.parse_args()
    env = Env.pick(args.smoke, warmup_ms=10, rep_ms=100)  # many tilings: short timings, medians
    if not args.smoke:
        bench_kernels.PEAK_BYTES_PER_S = bench_kernels.copy_peak(env.device)[0]
    hidden, layers, rows_list = (64, 3, [1, 3, 17]) if args.smoke else (args.hidden, args.layers, args.rows)
    torch.manual_seed(0)
    chain = Chain.random(layers, hidden, env.device)
    # the engine's SiLU-and-multiply kernel; not on the CPU, where the interpreter's bf16 casts truncate
    silu_mul = silu_and_mul_ref if args.smoke else silu_and_mul
    out = [r for m in rows_list for r in measure(env, chain, m, silu_mul)]
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in out], indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
