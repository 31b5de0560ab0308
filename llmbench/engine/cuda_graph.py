"""Decode steps replayed from CUDA Graphs captured once per batch-size bucket.

A decode batch of n sequences runs in the graph of the smallest bucket >= n; the padded rows write no
K/V (slot -1), attend over one token of block 0 (zeroed at allocation) and their logits are dropped.
All buckets share one memory pool, captured largest first so the smaller graphs reuse its memory.
A bucket whose decode attention takes other tiles for contexts of about one length
(Tuning.decode_uniform_tiling) has a graph for each tiling; the host picks one a step.

A bucket's graphs read their inputs from one buffer that a step fills with one copy from the host
(engine/graph_inputs.py). Under asynchronous scheduling a row's token is the last step's sample, still on
the device: the graph takes it from ``last`` itself.

With a ``draw`` (Tuning.graph_sampling) each graph ends in the sampling draw of its rows, with the per-row
scales and seed keys the step sent (zero scales for greedy rows: the argmax), and leaves the ids in
``last``: the step's ids come out of the replay, with no launch of their own on the host. A step that
needs a cut before its draw (top-k, top-p, min-p) samples from the logits after the replay instead, and the
graph's draw goes unused.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

import numpy as np
import torch

from llmbench.engine.graph_inputs import GraphInputs
from llmbench.engine.step_counters import note_graph_capture
from llmbench.engine.step_inputs import StepArrays
from llmbench.kernels.token_fill import fill_tokens_ref
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
        max_samples: int = 0,
        fill: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = fill_tokens_ref,
    ) -> None:
        self.forward = forward  # (input_ids, positions, meta) -> logits (B, V)
        # (logits, scale, threshold, seed_keys, positions, out=) -> ids: kernels/sample.py's signature
        self.draw = draw
        self.fill = fill  # (input_ids, fill, last) -> ids: kernels/token_fill.py's signature
        self.buckets = sorted(set(buckets))
        self.max_bs = self.buckets[-1]
        self.max_seq_len = max_seq_len
        # each bucket's inputs: one buffer a step fills with one copy (engine/graph_inputs.py)
        self.inputs = {bs: GraphInputs(bs, max_blocks_per_seq, device) for bs in self.buckets}
        self.query_start_loc = torch.arange(self.max_bs + 1, dtype=torch.int32, device=device)
        # The last step's sampled ids, where the graphs take the tokens of the rows they fill: a graph
        # that draws leaves its ids here; ids sampled elsewhere are copied in first. Any step's (at most
        # ``max_samples`` rows, one a sequence) fit.
        self.last = torch.zeros(max(self.max_bs, max_samples), dtype=torch.int64, device=device)
        # The rows longest first (Tuning.decode_longest_first) in the buckets ``ordered`` names, given by
        # the host each step (in batch order when too few rows for it to pay); padded rows go last.
        self.ordered = ordered or (lambda batch: False)
        # The buckets ``uniform`` names get a second graph, with the tiles for contexts of about one length.
        self.uniform = uniform or (lambda batch: False)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}  # by (bucket, uniform tiling)
        self.outputs: dict[tuple[int, bool], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._rows: dict[tuple[tuple[int, bool], int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.capture_time = 0.0
        self.memory_bytes = 0

    def _meta(self, bs: int, uniform: bool) -> AttentionMetadata:
        t = self.inputs[bs].t
        return AttentionMetadata(
            slot_mapping=t.slot_mapping,
            query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=t.seq_lens,
            block_tables=t.block_tables,
            max_query_len=1,
            max_seq_len=self.max_seq_len,
            query_lens_cpu=[1] * bs,
            seq_lens_cpu=[self.max_seq_len] * bs,
            decode_order=t.order if self.ordered(bs) else None,
            decode_uniform=uniform,
        )

    @property
    def draws(self) -> bool:
        return self.draw is not None

    def step(self, bs: int, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What a graph of bucket ``bs`` does, from its static inputs: the rows take the tokens ``fill``
        names from ``last``, then the forward; returns the logits, and the ids drawn (a view of ``last``)."""
        t = self.inputs[bs].t
        logits = self.forward(self.fill(t.input_ids, t.fill, self.last), t.positions, meta)
        if self.draw is None:
            return logits, None
        keys = t.sample_keys
        return logits, self.draw(logits, t.draw_scale, None, keys[0], keys[1], out=self.last[:bs])

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
        self._rows.clear()

    def bucket_for(self, batch_size: int) -> int | None:
        return smallest_holding(self.buckets, batch_size)

    def load(
        self,
        step: StepArrays,
        last_ids: torch.Tensor | None,
        order: np.ndarray | None = None,
        draw: bool = False,
    ) -> int:
        """Send a decode step's inputs to the buffer of the bucket that holds it; returns that bucket.
        ``last_ids``: the last step's samples, which the rows ``step.fill_rows`` take their tokens from;
        ``order``: the rows longest first (None: the batch's order); ``draw``: the graph's draw will be the
        step's (every row samples and needs no cut)."""
        n = len(step.query_lens)
        bs = self.bucket_for(n)
        assert bs is not None, "batch larger than the largest CUDA Graph bucket"
        if step.fill_rows is not None:
            assert last_ids is not None, "a fill needs the last samples"
            if last_ids.data_ptr() != self.last.data_ptr():  # not a graph's draw: bring them in
                self.last[: last_ids.shape[0]].copy_(last_ids, non_blocking=True)
        self.inputs[bs].load(step, order if self.ordered(bs) else None, draw and self.draw is not None)
        return bs

    def replay(
        self, bs: int, n: int, uniform: bool = False, draw: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Replay bucket ``bs``'s graph over the step ``load`` sent: the ``n`` rows' logits (n, V), and
        their ids if ``draw`` (the graph's draw is the step's), else None. ``uniform``: the graph with the
        tiles for contexts of about one length, where the bucket has one."""
        assert self.draw is not None or not draw, "a draw asked of graphs captured without one"
        key = (bs, uniform and self.uniform(bs))
        self.graphs[key].replay()
        logits, ids = self._outputs(key, n)
        return logits, ids if draw else None

    def _outputs(self, key: tuple[int, bool], n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A replay's logits and ids for its first ``n`` rows (kept: a view is a torch call each time)."""
        out = self._rows.get((key, n))
        if out is None:
            logits, ids = self.outputs[key]
            out = self._rows[(key, n)] = (logits[:n], None if ids is None else ids[:n])
        return out

    def sample_rows(self, bs: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (4, k) settings and (2, k) seed keys and positions of the last step of bucket ``bs``, for a
        draw after the replay (Sampler.sample)."""
        t = self.inputs[bs].t
        return t.sample_params[:, :k], t.sample_keys[:, :k]

    def logits_rows(self, bs: int, k: int) -> torch.Tensor:
        """(k,) the rows that sample, of the last step of bucket ``bs`` that not every row samples in."""
        return self.inputs[bs].t.logits_rows[:k]


def smallest_holding(buckets: list[int], n: int) -> int | None:
    """The smallest of the sorted ``buckets`` that is at least ``n``; None past the largest."""
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else None
