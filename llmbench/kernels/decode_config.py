"""How the Triton decode kernel (``triton_decode.py``) is cut to a batch: its tiles, its split count and the
order its programs take the sequences in, decided on the host from shapes and, where the engine knows
them, the contexts' lengths. Every choice here was measured (the docstrings name the sweep) and is plain
Python, so that the engine can make it before a step and the tests can check it without a GPU.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from llmbench.kernels._triton import num_sms

MAX_SPLITS = 128  # the warm-up compiles the merge kernel for up to this many slices
SLICE_TILE = 64  # slices of a fixed length (split_tokens) are whole tiles of this many tokens


class DecodeConfig(NamedTuple):
    block_n: int  # context tokens per tile
    num_warps: int
    num_stages: int
    fp8_to: str = "q"  # a float8 cache's tiles become "q" (q's dtype) or "fp16" (16-bit q) before the dots
    programs_per_sm: int = 8  # split-KV cuts contexts until the grid has about this many a multiprocessor
    tail_n: int = 0  # > 0: a slice's whole block_n tiles unmasked, then the rest in tiles of this many tokens


WIDE_PROGRAMS_PER_SM = 8  # a batch with at least this many programs a multiprocessor is "wide"
UNIFORM_SHORTEST = 0.5  # a batch whose shortest context is at least this part of its longest is "uniform"


def default_decode_config(
    head_dim: int,
    dtype: torch.dtype,
    fp8: bool = False,
    v_tokens: bool = False,
    wide: bool = False,
    uniform: bool = False,
) -> DecodeConfig:
    """For q's ``dtype``, over a float8 cache if ``fp8`` (with V laid out by token if ``v_tokens``), for a
    ``wide`` batch (``is_wide``) or not, of contexts about one length (``is_uniform``) or not. Tuned on an
    H200 with devtools/bench_kernels.py --tune decode / decode-fp8 (bf16, 16/8 heads x 128, B=64 x 4096): 64-token tiles, 4 warps, 3 stages reach 97-98% of
    4.25 TB/s at page sizes 16 and 128; over float8 in the pool's layout, 128-token tiles, 2 warps, 2
    stages: 195 µs. Over float8 by token, --tune decode-batches (the batches a run drains through, 16 to
    256 sequences of contexts 204-2048, longest first, each tiling at 1, 2, 4 and 8 slices): below "wide",
    64-token tiles converted to float16, 2 warps, 3 stages, cut to about 12 programs a multiprocessor, take
    54 µs at B=64 and 71 at B=96, against 68 and 76 for the 128-token tiles cut to 4 a multiprocessor that
    --tune decode-fp8 chose at uniform lengths; a wide batch (--tune decode-fp8-mixed, B=256) is fastest
    with one warp: 154 µs (89%). On contexts of about one length (``uniform``) one warp is faster below
    wide too: --tune decode-fp8-tails (4,096 tokens) takes 147 µs at B=64 in 2 slices and 269 at B=128 in
    one, against 179 and 342 with two warps (128-token tiles: 144 and 274); --tune decode-fp8-spread (16, 64
    and 128 sequences, the longest of 2,048 or 4,096 tokens) has one warp 10-22% faster where every
    context is as long, 3-9% where the shortest is half the longest, and two warps faster by 5-10% at 64
    and 128 sequences where it is a quarter (``UNIFORM_SHORTEST``). bf16 is cut to about 8 programs a
    multiprocessor: 91 µs at B=64 against 104 in one slice (4 a multiprocessor), within 2% of the best
    tiling at every batch size."""
    if dtype == torch.float32:
        return DecodeConfig(block_n=32, num_warps=4, num_stages=2)  # halves shared memory per stage
    if fp8 and v_tokens:
        return DecodeConfig(64, 1 if wide or uniform else 2, 3, fp8_to="fp16", programs_per_sm=12)
    if fp8:
        # V laid out as K (tests, tuning): the tiling and split target it was tuned with
        return DecodeConfig(block_n=128, num_warps=2, num_stages=2, fp8_to="fp16", programs_per_sm=4)
    return DecodeConfig(block_n=64, num_warps=4, num_stages=3)


def is_wide(batch: int, num_kv_heads: int, device: torch.device) -> bool:
    """Whether a decode batch has programs enough (one per sequence and KV head) for the wide tiles of
    ``default_decode_config``: its short contexts then keep many small programs in flight a multiprocessor."""
    return batch * num_kv_heads >= WIDE_PROGRAMS_PER_SM * num_sms(device)


def is_uniform(shortest: int, longest: int) -> bool:
    """Whether a decode batch of these shortest and longest contexts has them about one length
    (``default_decode_config``'s ``uniform``)."""
    return shortest >= UNIFORM_SHORTEST * longest


def uniform_tiling_differs(
    batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, fp8: bool, v_tokens: bool,
    device: torch.device,
) -> bool:  # fmt: skip
    """Whether a decode batch of this size takes other tiles when its contexts are about one length."""
    layout = (head_dim, dtype, fp8, v_tokens, is_wide(batch, num_kv_heads, device))
    return default_decode_config(*layout, uniform=True) != default_decode_config(*layout)


def choose_num_splits(
    batch: int, num_kv_heads: int, max_context: int, config: DecodeConfig, device: torch.device
) -> int:
    """Context slices per sequence: about ``config.programs_per_sm`` programs a multiprocessor, at least one
    tile per slice, at most ``MAX_SPLITS``.

    Measured on an H200 (bf16, 16/8 heads, head_dim 128, contexts 204-2048, --tune decode-batches): B=16
    takes 30 µs in 8 slices against 32 in 4, B=64 91 in 2 against 104 unsplit, B=96 and more are fastest
    unsplit. One sequence of 4,096 tokens: 13 µs in 32-64 slices against 115 unsplit.
    """
    wanted = config.programs_per_sm * num_sms(device) // (batch * num_kv_heads)
    n = max(1, min(wanted, max_context // config.block_n, MAX_SPLITS))
    return 1 << (n.bit_length() - 1)  # a power of two at most n: few reduce-kernel variants


def longest_first(seq_lens: torch.Tensor) -> torch.Tensor:
    """(B,) int64: the batch's rows by context length, longest first (``decode_attention``'s ``order``)."""
    return torch.argsort(seq_lens, descending=True)


def order_pays(batch: int, num_kv_heads: int, device: torch.device) -> bool:
    """Whether taking the longest contexts first can shorten a decode launch: only with more programs
    (at least one per sequence and KV head) than multiprocessors, so that some start late."""
    return batch > 1 and batch * num_kv_heads > num_sms(device)
