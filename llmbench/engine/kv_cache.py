"""Size and allocate the KV pool.

``block_bytes = 2 * num_layers * block_size * kv_heads_per_rank * head_dim * dtype_size``. The number of
blocks comes, in order of precedence, from ``num_kv_blocks``; on CUDA from
``total_memory * gpu_memory_utilization`` minus this process's peak (weights and activations, measured
by a warm-up forward); on the CPU from ``kv_cache_memory`` (default: what ``max_num_seqs`` full-length
sequences need, at most 1 GiB).
"""

from __future__ import annotations

import torch

from llmbench.engine.resolve import ResolvedConfig

_CPU_DEFAULT_CAP = 1 << 30  # bytes: the default CPU pool never takes more than this
_CUDA_HEADROOM = 256 << 20  # bytes left free for the allocator's fragmentation and CUDA Graph pools


class KVCacheError(RuntimeError):
    pass


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
    want = config.max_num_seqs * blocks_per_seq
    if config.kv_cache_memory is not None:
        return max(1, int(config.kv_cache_memory // bytes_per_block))
    return max(blocks_per_seq, min(want, _CPU_DEFAULT_CAP // bytes_per_block))


def allocate(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    # One slab for the whole pool: (2, L, num_blocks, block_size, Hk, D); per-layer K and V are views.
    pool = torch.empty(2, num_layers, num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device)
    return pool, [(pool[0, i], pool[1, i]) for i in range(num_layers)]
