"""One step's batch flattened into host arrays: what every tensor-parallel rank needs to run it.

Built once per step by rank 0 from the scheduled sequences (plain numpy, so it pickles cheaply to other
ranks); each rank's model runner turns it into device tensors and attention metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from llmbench.engine.scheduler import BatchCounts
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
    # (``fill_src``: its row among those sampled ids).
    fill_rows: np.ndarray | None = None  # (K,) int64
    fill_src: np.ndarray | None = None  # (K,) int64
    # Sampling (engine/sampler.py ``Sampler.rows``), only while some request samples: per sampling row,
    # its settings and its seed key and token position. Rank 0 alone reads them.
    sample_params: np.ndarray | None = None  # (4, N) float32
    sample_keys: np.ndarray | None = None  # (2, N) int64


class BlockTables:
    """Every running sequence's block table kept as a row of one int32 matrix, written as the table
    grows (a block every ``block_size`` tokens), so a step's (B, width) table is one gather rather than
    B conversions of Python lists: at 256 sequences of ~60 blocks those took most of a step's host time.

    A table the block manager replaces (admission, preemption) is a new list object: its row is
    rewritten from the start. Rows past a table's length stay zero."""

    def __init__(self, max_blocks_per_seq: int) -> None:
        self.matrix = np.zeros((64, max_blocks_per_seq), dtype=np.int32)
        self._rows: dict[str, list] = {}  # request id -> [row, the table list mirrored, entries written]
        self._free: list[int] = list(range(63, -1, -1))

    def gather(self, seqs: list[Sequence]) -> np.ndarray:
        """(B, widest table of the batch) int32."""
        rows, idx, width = self._rows, [], 0
        for seq in seqs:
            table = seq.block_table
            entry = rows.get(seq.request_id)
            if entry is None:
                entry = rows[seq.request_id] = [self._take_row(), table, 0]
            elif entry[1] is not table:  # replaced: start the row again
                self.matrix[entry[0], : entry[2]] = 0
                entry[1], entry[2] = table, 0
            n = len(table)
            if entry[2] < n:
                self.matrix[entry[0], entry[2] : n] = table[entry[2] :]
                entry[2] = n
            idx.append(entry[0])
            if n > width:
                width = n
        return self.matrix[idx, :width]

    def forget(self, request_id: str) -> None:
        entry = self._rows.pop(request_id, None)
        if entry is not None:
            self.matrix[entry[0], : entry[2]] = 0
            self._free.append(entry[0])

    def _take_row(self) -> int:
        if not self._free:
            rows = self.matrix.shape[0]
            self.matrix = np.concatenate([self.matrix, np.zeros_like(self.matrix)])
            self._free = list(range(2 * rows - 1, rows - 1, -1))
        return self._free.pop()


def build_step(
    seqs: list[Sequence],
    num_new_tokens: list[int],
    block_size: int,
    mirror: BlockTables | None = None,
    counts: BatchCounts | None = None,
) -> StepArrays:
    """Flatten a batch. Runs every step: host work here is on the hot path. ``mirror``: the engine's
    running tables (without one, e.g. for warm-up batches, the tables are copied row by row); ``counts``:
    the batch's counters already read (``ScheduledBatch.counts``)."""
    bs = block_size
    n = len(seqs)
    if counts is None:
        counts = BatchCounts.of(seqs, num_new_tokens)
    if mirror is not None:
        tables = mirror.gather(seqs)
    else:
        tables = np.zeros((n, max(len(s.block_table) for s in seqs)), dtype=np.int32)
        for i, s in enumerate(seqs):
            tables[i, : len(s.block_table)] = s.block_table
    starts = counts.computed
    if max(num_new_tokens) == 1:  # decode-shaped: one token per sequence, its position where it starts
        query_start = np.arange(n + 1, dtype=np.int32)
        row, positions = query_start[:-1], starts
        input_ids = np.fromiter(
            (s.token_ids[p] for s, p in zip(seqs, starts.tolist(), strict=True)), dtype=np.int64, count=n
        )
    else:  # every token's sequence and position, in numpy (8k tokens a step)
        new = counts.new
        query_start = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(new, out=query_start[1:])
        row = np.repeat(np.arange(n), new)
        positions = np.arange(int(query_start[-1]), dtype=np.int64) - np.repeat(
            query_start[:-1] - starts, new
        )
        spans = zip(seqs, starts.tolist(), (starts + new).tolist(), strict=True)
        input_ids = np.fromiter(
            chain.from_iterable(s.token_ids[a:b] for s, a, b in spans),
            dtype=np.int64,
            count=int(query_start[-1]),
        )
    slots = tables[row, positions // bs].astype(np.int64) * bs + positions % bs
    seq_lens = starts + counts.new
    logits_idx = (query_start[1:] - 1).astype(np.int64)[counts.samples]  # rows that reach their last token
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
