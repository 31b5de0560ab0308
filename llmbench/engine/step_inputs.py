"""One step's batch flattened into host arrays: what every tensor-parallel rank needs to run it.

Built once per step by rank 0 from the scheduled sequences (plain numpy, so it pickles cheaply to other
ranks); each rank's model runner turns it into device tensors and attention metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmbench.engine.sequence import Sequence


@dataclass
class StepArrays:
    input_ids: np.ndarray  # (T,) int64
    positions: np.ndarray  # (T,) int64
    slot_mapping: np.ndarray  # (T,) int64
    query_start_loc: np.ndarray  # (B + 1,) int32
    seq_lens: np.ndarray  # (B,) int64, context after this step
    block_tables: np.ndarray  # (B, widest table in the batch) int32
    logits_indices: np.ndarray  # (N,) int64: rows whose logits are sampled
    query_lens: list[int]  # (B,)
    # Asynchronous scheduling: input rows whose token is the previous step's sample, still on the device
    # (``fill_src``: its row among those sampled ids), and whether this step's samples are shared with
    # every tensor-parallel rank for the next step's fill.
    fill_rows: np.ndarray | None = None  # (K,) int64
    fill_src: np.ndarray | None = None  # (K,) int64
    share_ids: bool = False


def build_step(seqs: list[Sequence], num_new_tokens: list[int], block_size: int) -> StepArrays:
    """Flatten a batch. Runs every step: host work here is on the hot path."""
    bs = block_size
    n = len(seqs)
    width = max(len(s.block_table) for s in seqs)
    tables = np.zeros((n, width), dtype=np.int32)
    for i, s in enumerate(seqs):
        tables[i, : len(s.block_table)] = s.block_table
    if max(num_new_tokens) == 1:  # decode-shaped: one token per sequence, no per-token loops
        pos = np.fromiter((s.num_computed_tokens for s in seqs), dtype=np.int64, count=n)
        input_ids = np.fromiter(
            (s.token_ids[p] for s, p in zip(seqs, pos.tolist(), strict=True)), dtype=np.int64, count=n
        )
        slots = tables[np.arange(n), pos // bs].astype(np.int64) * bs + pos % bs
        seq_lens = pos + 1
        query_start = np.arange(n + 1, dtype=np.int32)
        sampling = np.fromiter(
            (p + 1 == s.num_tokens for s, p in zip(seqs, pos.tolist(), strict=True)), dtype=bool, count=n
        )
        logits_idx = np.flatnonzero(sampling)
        positions = pos
    else:
        ids: list[int] = []
        slot_list: list[int] = []
        lens: list[int] = []
        logits_list: list[int] = []
        total = 0
        for seq, k in zip(seqs, num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            end = start + k
            ids.extend(seq.token_ids[start:end])
            table = seq.block_table
            p = start
            while p < end:  # one range per block the new tokens touch
                block_end = min(end, (p // bs + 1) * bs)
                base = table[p // bs] * bs - (p // bs) * bs
                slot_list.extend(range(base + p, base + block_end))
                p = block_end
            total += k
            lens.append(end)
            if end == seq.num_tokens:
                logits_list.append(total - 1)
        input_ids = np.asarray(ids, dtype=np.int64)
        slots = np.asarray(slot_list, dtype=np.int64)
        seq_lens = np.asarray(lens, dtype=np.int64)
        query_start = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(num_new_tokens, out=query_start[1:])
        logits_idx = np.asarray(logits_list, dtype=np.int64)
        starts = np.fromiter((s.num_computed_tokens for s in seqs), dtype=np.int64, count=n)
        positions = np.concatenate([np.arange(a, b) for a, b in zip(starts.tolist(), lens, strict=True)])
    return StepArrays(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slots,
        query_start_loc=query_start,
        seq_lens=seq_lens,
        block_tables=tables,
        logits_indices=logits_idx,
        query_lens=list(num_new_tokens),
    )
