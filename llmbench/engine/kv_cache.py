"""Size and allocate the KV pool.

``block_bytes = 2 * num_layers * block_size * kv_heads_per_rank * head_dim * dtype_size``, where the dtype
is the cache's (``kv_cache_dtype``: the model's, or one byte for float8, so the same memory holds twice
the blocks of a bf16 pool). The number of blocks comes, in order of precedence, from ``num_kv_blocks``;
on CUDA from ``total_memory * gpu_memory_utilization`` minus this process's peak (weights and
activations, measured by a warm-up forward); on the CPU from ``kv_cache_memory`` (default: what
``max_num_seqs`` full-length sequences need, at most 1 GiB). A float8 pool also holds its scales, one
float32 per layer, KV head and K or V (``layers/attention/kv.py``); they are not counted in blocks. Each
layer's scales are tensors of their own, not views at different offsets of one: torch.compile guards on
a view's offset, and would compile a layer again wherever an offset happens to equal some size.

A float8 pool holds its V pages laid out by token (``kernels/kv_layout.py``: what lets the attention
kernels feed float8 V to the tensor cores without reading it a byte at a time) and is zeroed when made:
the kernels load whole pages of V, and the tokens past a sequence's end must be finite.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from llmbench.engine.config import ConfigError
from llmbench.engine.resolve import ResolvedConfig
from llmbench.kernels.kv_layout import by_token_view
from llmbench.kernels.kv_quant import is_fp8
from llmbench.layers.attention.kv import LayerKV

_CPU_DEFAULT_CAP = 1 << 30  # bytes: the default CPU pool never takes more than this
_CUDA_HEADROOM = 256 << 20  # bytes left free for the allocator's fragmentation and CUDA Graph pools


class KVCacheError(ConfigError):
    """The memory the options leave cannot hold what the engine needs (the KV pool, its CUDA Graphs)."""


def out_of_memory(what: str, off: str, config: ResolvedConfig, kv_bytes: int) -> KVCacheError:
    """The error for ``what`` running out of GPU memory after the KV pool took ``kv_bytes``: how to
    leave it more (``off``: the option that does without it)."""
    return KVCacheError(
        f"{what} ran out of GPU memory once the KV pool held {kv_bytes / 2**30:.1f} GiB: lower "
        f"gpu_memory_utilization (now {config.gpu_memory_utilization}) or set num_kv_blocks, or set {off}"
    )


def block_bytes(num_layers: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    return 2 * num_layers * block_size * kv_heads * head_dim * dtype.itemsize


def num_blocks_for(config: ResolvedConfig, max_model_len: int, bytes_per_block: int, peak_bytes: int) -> int:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    blocks_per_seq = -(-max_model_len // config.block_size)
    if config.is_cuda:
        free, total = torch.cuda.mem_get_info()  # the runner has made its device current
        budget = min(total * config.gpu_memory_utilization - peak_bytes, free) - _CUDA_HEADROOM
        n = int(budget // bytes_per_block)
        if n < blocks_per_seq:
            raise KVCacheError(
                f"the KV pool would hold {max(n, 0)} blocks of {config.block_size} tokens, fewer than one "
                f"max_model_len={max_model_len} sequence needs ({blocks_per_seq}): raise gpu_memory_utilization "
                "or lower max_model_len"
            )
        return n
    return cpu_blocks(
        config.kv_cache_memory, config.max_num_seqs, config.block_size, max_model_len, bytes_per_block
    )


def cpu_blocks(
    kv_cache_memory: int | None, max_num_seqs: int, block_size: int, max_model_len: int, bytes_per_block: int
) -> int:
    """The CPU pool's blocks when num_kv_blocks does not give them: arithmetic only, so that ``resolve``
    checks it before anything is loaded (``kv_cache_memory`` too small for one sequence: a KVCacheError)."""
    blocks_per_seq = -(-max_model_len // block_size)
    if kv_cache_memory is not None:
        n = int(kv_cache_memory // bytes_per_block)
        if n < blocks_per_seq:
            raise KVCacheError(
                f"kv_cache_memory={kv_cache_memory:,} bytes holds {n} blocks of {block_size} tokens "
                f"({bytes_per_block:,} bytes each), fewer than one max_model_len={max_model_len} sequence needs "
                f"({blocks_per_seq}, {blocks_per_seq * bytes_per_block:,} bytes): raise kv_cache_memory or lower "
                "max_model_len"
            )
        return n
    return max(blocks_per_seq, min(max_num_seqs * blocks_per_seq, _CPU_DEFAULT_CAP // bytes_per_block))


class KVPool(NamedTuple):
    data: torch.Tensor  # K then V, (2, L, num_blocks, ...): each layer's pages, one block after another
    layers: list[LayerKV]  # per layer: views of the data, and a float8 pool's (Hk,) scales


def allocate(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device,
    scale: float = 1.0,
) -> KVPool:
    """One slab for the whole pool; a float8 one zeroed, V laid out by token, and every scale set to
    ``scale``; on a CPU every pool is zeroed (its pages then count in the process's memory from the start:
    untouched ones would not, and the run's memory figures would hold a float8 pool and not a bf16 one).
    A slab the device cannot hold is a ``KVCacheError`` naming the options that size it."""
    shape = (2, num_layers, num_blocks, block_size * kv_heads * head_dim)
    zeroed = is_fp8(dtype) or torch.device(device).type == "cpu"
    try:
        pool = (torch.zeros if zeroed else torch.empty)(shape, dtype=dtype, device=device)
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not isinstance(exc, torch.OutOfMemoryError) and "allocate" not in str(exc):
            raise
        size = math.prod(shape) * dtype.itemsize
        raise KVCacheError(
            f"the KV pool of {num_blocks} blocks of {block_size} tokens ({size / 2**30:,.1f} GiB) does not "
            f"fit in {torch.device(device).type} memory: lower num_kv_blocks, kv_cache_memory, block_size or "
            "max_num_seqs (or gpu_memory_utilization on a GPU)"
        ) from None
    if not is_fp8(dtype):
        pool = pool.view(2, num_layers, num_blocks, block_size, kv_heads, head_dim)
        return KVPool(pool, [LayerKV(pool[0, i], pool[1, i]) for i in range(num_layers)])

    def layer(i: int) -> LayerKV:
        k = pool[0, i].view(num_blocks, block_size, kv_heads, head_dim)
        v = by_token_view(pool[1, i], block_size, kv_heads, head_dim)
        return LayerKV(k, v, scales(), scales())

    def scales() -> torch.Tensor:
        return torch.full((kv_heads,), scale, dtype=torch.float32, device=device)

    return KVPool(pool, [layer(i) for i in range(num_layers)])
