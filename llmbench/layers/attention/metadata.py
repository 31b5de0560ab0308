"""Per-step batch metadata handed to every attention layer (passed, never a global).

A step's tokens are laid out flat: sequence i owns query rows
``query_start_loc[i]:query_start_loc[i+1]`` and, after this step, ``seq_lens[i]`` tokens of context
(cached prefix + earlier chunks + this step's tokens). The new tokens of a sequence are the last
``query_len`` positions of its context, so causality is ``key_pos <= seq_len - query_len + q_row``.

KV cache layout, per layer: ``(num_blocks, block_size, num_kv_heads, head_dim)`` for K and for V
(flash-attn's paged layout; a float8 pool's V is seen so but laid out by token in memory:
``kernels/kv_layout.py``). ``slot_mapping[t] = block_id * block_size + offset`` is where token t's
K/V go; -1 marks a padded token whose K/V must not be written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (T,) int64
    query_start_loc: torch.Tensor  # (B + 1,) int32
    seq_lens: torch.Tensor  # (B,) int32
    block_tables: torch.Tensor  # (B, max_blocks_per_seq) int32
    max_query_len: int
    max_seq_len: int
    # Host copies, so reference backends loop without device syncs.
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    # A float8 KV cache's first prefill: each layer sets its scales from this step's K/V before storing
    # them (layers/attention/kv.py).
    kv_calibrate: bool = False
    # Decode steps large enough for it to pay: the rows by context length, longest first
    # (Tuning.decode_longest_first), from the host; the Triton decode kernel takes its rows in this order.
    decode_order: torch.Tensor | None = None
    # Decode steps whose contexts are about one length (Tuning.decode_uniform_tiling), from the host: the
    # Triton decode kernel takes the tiles measured fastest on such batches.
    decode_uniform: bool = False
    # The leading rows the decode kernel takes: every row of a decode-only step, a mixed step's leading
    # decodes (Tuning.mixed_step_decodes; the scheduler puts running sequences first), else 0.
    num_decodes: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def leading_decodes(query_lens: list[int]) -> int:
    """How many of a step's sequences, from the first, have one query row each."""
    for i, n in enumerate(query_lens):
        if n != 1:
            return i
    return len(query_lens)
