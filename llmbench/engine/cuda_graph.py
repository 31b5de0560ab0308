"""Decode steps replayed from CUDA Graphs captured once per batch-size bucket.

A decode batch of n sequences runs in the graph of the smallest bucket >= n; the padded rows write no
K/V (slot -1), attend over one token of block 0 (zeroed at allocation) and their logits are dropped.
All buckets share one memory pool, captured largest first so the smaller graphs reuse its memory.
A bucket whose decode attention takes other tiles for contexts of about one length
(Tuning.decode_uniform_tiling) has a graph for each tiling; the host picks one a step.

With a ``draw`` (Tuning.graph_sampling) each graph ends in the sampling draw of its rows, from static
buffers of per-row scales and seed keys that a step fills (or zeroes, for a greedy step): the step's ids
come out of the replay, with no launch of their own on the host. A step that needs a cut before its draw
(top-k, top-p, min-p) samples from the logits after the replay instead, and the graph's draw goes unused.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

import torch

from llmbench.engine.step_counters import note_graph_capture
from llmbench.layers.attention.metadata import AttentionMetadata


class CUDAGraphRunner:
    def __init__(
        self,
        forward: Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor],
        buckets: list[int],
        max_blocks_per_seq: int,
        max_seq_len: int,
        device: torch.device,
        ordered: Callable[[int], bool] | None = None,
        uniform: Callable[[int], bool] | None = None,
        draw: Callable[..., torch.Tensor] | None = None,
    ) -> None:
        self.forward = forward  # (input_ids, positions, meta) -> logits (B, V)
        # (logits, scale, threshold, seed_keys, positions) -> ids: kernels/sample.py's signature
        self.draw = draw
        self.buckets = sorted(set(buckets))
        self.max_bs = self.buckets[-1]
        self.max_seq_len = max_seq_len
        n = self.max_bs
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        # The rows longest first (Tuning.decode_longest_first) in the buckets ``ordered`` names, given by
        # the host each step (in batch order when too few rows for it to pay); padded rows go last.
        self.ordered = ordered or (lambda batch: False)
        self.identity = torch.arange(n, dtype=torch.int64, device=device)
        self.order = self.identity.clone()
        # The buckets ``uniform`` names get a second graph, with the tiles for contexts of about one length.
        self.uniform = uniform or (lambda batch: False)
        # the draw's rows: log2(e) / T (0: greedy) and (seed key, position of the sampled token)
        self.scale = torch.zeros(n, dtype=torch.float32, device=device)
        self.sample_keys = torch.zeros(2, n, dtype=torch.int64, device=device)
        self._scale_is_zero = True
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}  # by (bucket, uniform tiling)
        self.outputs: dict[tuple[int, bool], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.capture_time = 0.0
        self.memory_bytes = 0

    def _meta(self, bs: int, uniform: bool) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs],
            query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs],
            max_query_len=1,
            max_seq_len=self.max_seq_len,
            query_lens_cpu=[1] * bs,
            seq_lens_cpu=[self.max_seq_len] * bs,
            decode_order=self.order[:bs] if self.ordered(bs) else None,
            decode_uniform=uniform,
        )

    @property
    def draws(self) -> bool:
        return self.draw is not None

    def step(self, bs: int, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What a graph of bucket ``bs`` does, from the static buffers: the logits, and the ids drawn."""
        logits = self.forward(self.input_ids[:bs], self.positions[:bs], meta)
        if self.draw is None:
            return logits, None
        keys = self.sample_keys[:, :bs]
        return logits, self.draw(logits, self.scale[:bs], None, keys[0], keys[1])

    def keys(self) -> list[tuple[int, bool]]:
        """The graphs to capture, largest first: (bucket, with the tiles for contexts of about one length)."""
        return [
            (bs, u)
            for bs in reversed(self.buckets)
            for u in ((False, True) if self.uniform(bs) else (False,))
        ]

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        pool = None
        for key in self.keys():
            bs = key[0]
            meta = self._meta(*key)
            self.step(bs, meta)  # warm-up: kernels compiled, autotuned
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[key] = self.step(bs, meta)
            if pool is None:
                pool = graph.pool()
            self.graphs[key] = graph
            note_graph_capture()
        torch.cuda.synchronize()
        self.memory_bytes = torch.cuda.memory_reserved() - before
        self.capture_time = time.perf_counter() - start

    def release(self) -> None:
        """Free every graph and its pool. Graphs that captured NCCL collectives hold the communicator:
        they must go before the process group is torn down, or NCCL's teardown waits for them forever
        (pytorch/pytorch#115388)."""
        torch.cuda.synchronize()
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.outputs.clear()

    def bucket_for(self, batch_size: int) -> int | None:
        return smallest_holding(self.buckets, batch_size)

    def run(
        self,
        input_ids: torch.Tensor,  # (n,)
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        seq_lens: torch.Tensor,  # (n,) int32
        block_tables: torch.Tensor,  # (n, max_blocks_per_seq) int32
        order: torch.Tensor | None = None,  # (n,) int64: the rows longest first, where that pays
        uniform: bool = False,  # contexts of about one length: that tiling's graph, where the bucket has one
        draw: bool = False,  # return the ids the graph draws (needs a ``draw``)
        sample_rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """The rows' logits (n, V), their ids if ``draw`` (else None), and the bucket replayed.
        ``sample_rows``: the draw's (n,) scales and (2, n) seed keys and positions; None: greedy rows."""
        n = input_ids.shape[0]
        bs = self.bucket_for(n)
        assert bs is not None, "batch larger than the largest CUDA Graph bucket"
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        self.block_tables[:n, : block_tables.shape[1]].copy_(block_tables, non_blocking=True)
        ordered = self.ordered(bs)
        if ordered:
            self.order[:n].copy_(order if order is not None else self.identity[:n], non_blocking=True)
        if bs > n:
            self.slot_mapping[n:bs].fill_(-1)
            self.seq_lens[n:bs].fill_(1)
            self.block_tables[n:bs].zero_()
            if ordered:
                self.order[n:bs].copy_(self.identity[n:bs])
        assert self.draw is not None or not draw, "a draw asked of graphs captured without one"
        if draw and sample_rows is not None:
            self.scale[:n].copy_(sample_rows[0], non_blocking=True)
            self.sample_keys[:, :n].copy_(sample_rows[1], non_blocking=True)
            self._scale_is_zero = False
        elif self.draw is not None and not self._scale_is_zero:
            # greedy rows (padded rows' ids are dropped), or a draw no one reads: the argmax, its cheapest form
            self.scale.zero_()
            self._scale_is_zero = True
        key = (bs, uniform and self.uniform(bs))
        self.graphs[key].replay()
        logits, ids = self.outputs[key]
        return logits[:n], ids[:n] if draw else None, bs


def smallest_holding(buckets: list[int], n: int) -> int | None:
    """The smallest of the sorted ``buckets`` that is at least ``n``; None past the largest."""
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else None
