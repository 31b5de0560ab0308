"""Prefill and mixed steps replayed from CUDA Graphs, all of their forward but attention
(Tuning.prefill_graphs).

The forward is cut at attention (models/piecewise.py); each piece is captured once per bucket of token
counts, and a step of T tokens runs in the smallest bucket that holds it: its ids, positions and KV slots
are copied into the pieces' buffers, the padded rows get slot -1 (they store no K/V; their rows of every
product and norm are computed and dropped, and attention never reads them), and the host replays piece 0,
launches layer 0's attention, replays piece 1, and so on. The graphs share one memory pool, captured
largest bucket first; only the buffers and each bucket's output outlive a piece, so the pool holds about
one piece's temporaries at the largest bucket.
"""

from __future__ import annotations

import time

import torch

from llmbench.engine.cuda_graph import smallest_holding
from llmbench.engine.step_counters import note_graph_capture
from llmbench.layers.attention.metadata import AttentionMetadata
from llmbench.models.piecewise import PieceBuffers, PiecewiseForward


class PrefillGraphRunner:
    def __init__(self, pieces: PiecewiseForward, buckets: list[int], device: torch.device) -> None:
        self.pieces = pieces
        self.buckets = sorted(set(buckets))
        self.buffers = PieceBuffers.allocate(pieces.model, self.buckets[-1], device)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # by bucket: the final norm's output (bucket, hidden)
        self.capture_time = 0.0
        self.memory_bytes = 0
        self.replays = 0  # steps run from the graphs

    def bucket_for(self, tokens: int) -> int | None:
        return smallest_holding(self.buckets, tokens)

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()
        buf, pieces = self.buffers, self.pieces
        buf.slot_mapping.fill_(-1)  # nothing is stored while capturing
        for bucket in reversed(self.buckets):
            for i in range(pieces.num_pieces):  # warm-up: kernels compiled for these shapes
                pieces.piece(i, buf, bucket)
            torch.cuda.synchronize()
            graphs = []
            for i in range(pieces.num_pieces):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = pieces.piece(i, buf, bucket)
                graphs.append(graph)
                note_graph_capture()
            assert out is not None
            self.graphs[bucket], self.outputs[bucket] = graphs, out
        torch.cuda.synchronize()
        self.memory_bytes = torch.cuda.memory_reserved() - before
        self.capture_time = time.perf_counter() - start

    def release(self) -> None:
        torch.cuda.synchronize()
        for graphs in self.graphs.values():
            for graph in graphs:
                graph.reset()
        self.graphs.clear()
        self.outputs.clear()

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, int]:
        """The step's final hidden states (T, hidden), and the bucket it ran in."""
        tokens = input_ids.shape[0]
        bucket = self.bucket_for(tokens)
        assert bucket is not None, "a step larger than the largest prefill graph bucket"
        buf = self.buffers
        buf.input_ids[:tokens].copy_(input_ids, non_blocking=True)
        buf.positions[:tokens].copy_(positions, non_blocking=True)
        buf.slot_mapping[:tokens].copy_(meta.slot_mapping, non_blocking=True)
        if bucket > tokens:
            buf.slot_mapping[tokens:bucket].fill_(-1)
        graphs = self.graphs[bucket]
        for i, graph in enumerate(graphs[:-1]):
            graph.replay()
            self.pieces.attend(i, buf, tokens, meta)
        graphs[-1].replay()
        self.replays += 1
        return self.outputs[bucket][:tokens], bucket
