"""Builds the model and its KV pool on one device, and runs one scheduled step through it.

A step: flatten the batch into token ids, positions and attention metadata; forward (eagerly, compiled,
by replaying a CUDA Graph for decode batches, or for other steps by replaying graphs of everything but
attention); compute logits only at positions that sample.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

import torch

from llmbench.distributed import Communicator, single_rank
from llmbench.engine import kv_cache, warmup
from llmbench.engine.cuda_graph import CUDAGraphRunner
from llmbench.engine.outputs import StartupStats
from llmbench.engine.prefill_graph import PrefillGraphRunner
from llmbench.engine.ranges import enable_nvtx, phase
from llmbench.engine.resolve import ResolvedConfig
from llmbench.engine.step_inputs import StepArrays
from llmbench.engine.step_upload import StepInputs, StepUploader
from llmbench.engine.tracer import Tracer
from llmbench.engine.work import RankWeights, rank_weights
from llmbench.kernels import sample as draw_kernel
from llmbench.kernels import token_fill
from llmbench.kernels._triton import set_programmatic_launch
from llmbench.kernels.kv_quant import is_fp8, kv_dtype
from llmbench.layers.attention.backends import make_backend
from llmbench.layers.attention.metadata import AttentionMetadata
from llmbench.layers.parallel import TPGroup
from llmbench.models.config import ModelConfig
from llmbench.models.fused_decode import DecodePlan, fuse_decode
from llmbench.models.llama import BuildOptions
from llmbench.models.loader import iter_checkpoint, load_weights
from llmbench.models.piecewise import PiecewiseForward
from llmbench.models.random_weights import random_checkpoint
from llmbench.models.registry import build_model


class Executed(NamedTuple):
    logits: torch.Tensor  # (N, V) of the sampling rows, model dtype
    graph_bucket: int | None
    graph_padding: int
    sample_rows: tuple[torch.Tensor, torch.Tensor] | None  # for Sampler.sample
    ids: torch.Tensor | None = None  # (N,) int64: the rows' tokens, drawn inside the step's CUDA Graph


class ModelRunner:
    def __init__(
        self,
        config: ResolvedConfig,
        model_config: ModelConfig,
        folder: Path | None,
        max_model_len: int,
        comm: Communicator | None = None,
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.max_model_len = max_model_len
        self.block_size = config.block_size
        self.device = torch.device(config.device)
        if self.device.type == "cuda":
            if self.device.index is None:  # memory queries want an explicit index
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
        self.startup = StartupStats()
        # the tensor-parallel group's communicator (engine/tp.py builds it), a single rank's by default
        self.comm = comm = comm if comm is not None else single_rank()
        self.tp = tp = TPGroup(comm.rank, comm.size, comm)
        if tp.size > 1:  # what the group was built with, not what was asked for
            self.startup.all_reduce = comm.name
            self.startup.all_reduce_norm = comm.fuses_norm
            self.startup.all_reduce_matmul = comm.fuses_product
        self.last_ids: torch.Tensor | None = None  # the last step's samples (asynchronous scheduling)
        set_programmatic_launch(config.tuning.programmatic_launch_rows)  # the warm-up and graphs too
        self._load_model(folder)
        self._size_kv()
        if config.torch_compile:
            start = time.perf_counter()
            self._forward = torch.compile(
                self.runnable.forward, dynamic=True, mode=config.tuning.compile_mode
            )
        else:
            self._forward = self.runnable.forward
        self._allocate_kv()
        if config.torch_compile:
            warmup.compile_steps(self)
            self.startup.compile_time = time.perf_counter() - start
        if self.device.type == "cuda":
            start = time.perf_counter()
            warmup.kernel_variants(self)
            self.startup.kernel_warmup_time = time.perf_counter() - start
        self._capture_graphs()
        # Every warm-up above may compile (the kernel warm-up's own small pools are new shapes): steady
        # state starts here.
        self._graphs_after_warmup = _dynamo_graph_count() if config.torch_compile else 0
        self.tracer = Tracer(self.model, self.device, compiled=config.torch_compile)
        enable_nvtx(self.device)

    def _load_model(self, folder: Path | None) -> None:
        """The model built with the resolved attention backend and kernels, its weights loaded (random ones
        for a preset), and what decode steps run: it, or it with fused seams (models/fused_decode.py)."""
        config, model_config, tp = self.config, self.model_config, self.tp
        dtype = config.torch_dtype
        start = time.perf_counter()
        tuning = config.tuning
        backend = make_backend(
            config.attention_backend, tuning.decode_split_tokens or None, tuning.prefill_narrow_tiles_up_to
        )
        if config.torch_compile:
            # Attention reads Python-side metadata; keeping it out of the compiled graphs avoids a guard
            # (and a recompile) per batch shape. The rest of each layer is compiled between these breaks.
            backend.forward = torch._dynamo.disable(backend.forward)  # type: ignore[method-assign]
            if backend.attends_from_cache:
                backend.forward_qkv = torch._dynamo.disable(backend.forward_qkv)  # type: ignore[attr-defined]
        opts = BuildOptions(
            backend, max_positions=self.max_model_len, tp=tp, use_triton=config.triton_kernels
        )
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(self.device):
                self.model = build_model(model_config, opts)
        finally:
            torch.set_default_dtype(previous)
        if folder is None:
            tensors = (
                (name, "random weights", t)
                for name, t in random_checkpoint(model_config, config.seed, self.device)
            )
            load_weights(self.model, tensors, f"preset {config.model}")
        else:
            load_weights(self.model, iter_checkpoint(folder), str(folder))
        self.model.eval()
        # decode steps' kernels and fusions as resolved: the model, or it with fused seams (models/fused_decode.py)
        self.decode_plan = DecodePlan.of(config.tuning.skinny_matmul_rows, config.tuning.skinny_fusion)
        self.runnable = fuse_decode(self.model, self.decode_plan, self.comm)
        self.startup.weights_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.startup.load_time = time.perf_counter() - start

    def _size_kv(self) -> None:
        """The KV cache's shape per block: heads, dtype, scales, bytes; what a rank holds of the weights."""
        config, model_config, dtype = self.config, self.model_config, self.config.torch_dtype
        attn = self.model.model.layers[0].self_attn
        self.kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.inputs = StepUploader(config, self.device, self.kv_heads, self.head_dim)
        self.num_layers = model_config.num_hidden_layers
        self.kv_dtype = kv_dtype(config.kv_cache_dtype, dtype)
        self.kv_scale = 1.0 if config.tuning.kv_cache_scale is None else float(config.tuning.kv_cache_scale)
        # A float8 pool without given scales sets them from the first real step that stores K/V.
        self.kv_calibrate = is_fp8(self.kv_dtype) and config.tuning.kv_cache_scale is None
        self.block_bytes = kv_cache.block_bytes(
            self.num_layers, self.block_size, self.kv_heads, self.head_dim, self.kv_dtype
        )
        self.max_blocks_per_seq = -(-self.max_model_len // self.block_size)
        self.rank_weights: RankWeights = rank_weights(
            self.model, self.tp.size, self.block_bytes // self.block_size
        )

    def _allocate_kv(self) -> None:
        """The KV pool: as many blocks as the options and the memory left give (the same on every rank)."""
        config, comm = self.config, self.comm
        peak = warmup.peak_memory(self) if self.device.type == "cuda" else 0
        num_blocks = kv_cache.num_blocks_for(config, self.max_model_len, self.block_bytes, peak)
        if self.tp.size > 1:  # every rank must hold the same blocks: agree on the smallest pool
            agreed = torch.tensor([num_blocks], device=self.device if self.device.type == "cuda" else "cpu")
            torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN, group=comm.group)
            num_blocks = int(agreed.item())
        self.kv_pool, self.kv_caches = kv_cache.allocate(
            self.num_layers, num_blocks, self.block_size, self.kv_heads, self.head_dim, self.kv_dtype,
            self.device, self.kv_scale,
        )  # fmt: skip
        if config.cuda_graph:
            self.kv_pool.zero_()  # padded CUDA Graph rows read block 0: keep it finite
        self.num_blocks = num_blocks
        self.inputs.kv = self.kv_caches[0]  # its layout picks the decode kernel's tiles
        self.startup.kv_num_blocks = num_blocks
        self.startup.kv_block_bytes = self.block_bytes
        self.startup.kv_cache_bytes = num_blocks * self.block_bytes
        self.startup.kv_cache_dtype = config.kv_cache_dtype if is_fp8(self.kv_dtype) else config.dtype
        self.startup.kv_bytes_per_token = self.block_bytes // self.block_size  # this rank's heads
        self.startup.kv_capacity_tokens = num_blocks * self.block_size

    def _capture_graphs(self) -> None:
        """The decode steps' CUDA Graphs per batch bucket, and the prefill steps' per token count."""
        config = self.config
        self.graphs: CUDAGraphRunner | None = None
        if config.cuda_graph:
            self.graphs = CUDAGraphRunner(
                self._logits_forward,
                list(config.tuning.cuda_graph_buckets),
                self.max_blocks_per_seq,
                self.max_model_len,
                self.device,
                ordered=self.inputs.order_pays if config.tuning.decode_longest_first else None,
                uniform=self.inputs.uniform_differs if config.tuning.decode_uniform_tiling else None,
                draw=draw_kernel.sample if config.tuning.graph_sampling else None,
                max_samples=config.max_num_seqs,
                fill=token_fill.fill_tokens if config.triton_kernels else token_fill.fill_tokens_ref,
            )
            self._capture(self.graphs, "capturing the decode CUDA Graphs", "cuda_graph=False")
            self.startup.graph_capture_time = self.graphs.capture_time
            self.startup.graph_memory_bytes = self.graphs.memory_bytes
            self.startup.graph_buckets = list(self.graphs.buckets)
        self.prefill_graphs: PrefillGraphRunner | None = None
        if config.tuning.prefill_graph_tokens:
            self.prefill_graphs = PrefillGraphRunner(
                PiecewiseForward(self.model, self.kv_caches),
                list(config.tuning.prefill_graph_tokens),
                self.device,
            )
            self._capture(
                self.prefill_graphs, "capturing the prefill CUDA Graphs", "tuning.prefill_graphs=False"
            )
            self.startup.graph_capture_time += self.prefill_graphs.capture_time
            self.startup.graph_memory_bytes += self.prefill_graphs.memory_bytes

    def _capture(self, graphs: CUDAGraphRunner | PrefillGraphRunner, what: str, off: str) -> None:
        try:
            graphs.capture()
        except torch.OutOfMemoryError as exc:  # what the KV pool left was not enough
            raise kv_cache.out_of_memory(what, off, self.config, self.startup.kv_cache_bytes) from exc

    @property
    def kv_scales(self) -> torch.Tensor | None:
        """A float8 pool's scales, (2, L, Hk) float32 (K then V), copied; None for a pool in the model dtype."""
        if not self.kv_caches[0].quantised:
            return None
        return torch.stack(
            [
                torch.stack([kv.k_scale for kv in self.kv_caches]),
                torch.stack([kv.v_scale for kv in self.kv_caches]),
            ]
        )

    # -- forward ----------------------------------------------------------------------------------

    def _logits_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata):
        hidden = self._forward(input_ids, positions, meta, self.kv_caches)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def share_sampled(self, ids: torch.Tensor | None, n: int) -> None:
        """Keep a step's sampled ids (rank 0's ``ids``; other ranks receive them) for the next step's
        fill. Under tensor parallelism a broadcast on the device: rank 0 never waits for it."""
        if self.tp.size == 1 or n == 0:  # (every rank knows n: nothing to send for a step without samples)
            self.last_ids = ids
            return
        buf = ids if self.tp.rank == 0 else torch.empty(n, dtype=torch.int64, device=self.device)
        torch.distributed.broadcast(buf, src=0, group=self.comm.group)
        self.last_ids = buf

    def barrier(self) -> None:
        """Wait until every tensor-parallel rank gets here (after each wrote its trace)."""
        if self.tp.size > 1:
            torch.distributed.barrier(group=self.comm.group)

    def release_graphs(self) -> None:
        """Drop the CUDA Graphs (before a tensor-parallel group is torn down; see CUDAGraphRunner)."""
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None
        if self.prefill_graphs is not None:
            self.prefill_graphs.release()
            self.prefill_graphs = None

    def recompiles(self) -> int:
        """Graphs torch.compile built after the warm-up: 0 means no recompilation in steady state."""
        return _dynamo_graph_count() - self._graphs_after_warmup if self.config.torch_compile else 0

    # -- one step ---------------------------------------------------------------------------------

    def to_inputs(self, step: StepArrays) -> StepInputs:
        """The step's inputs on the device (``StepUploader.upload``), with the last step's samples."""
        return self.inputs.upload(step, self.last_ids)

    @torch.inference_mode()
    def execute(self, step: StepArrays, draw: bool = False) -> Executed:
        """Run a step; return the logits of the sampling rows (N, V) in the model dtype, the graph bucket
        (or None) and its padding, the device copies of the step's sampling rows, and with ``draw`` (the
        step's rows need no cut: ``Sampler.draws_in_graph``) their ids where the step's CUDA Graph drew them.

        Rows named by ``step.fill_rows`` (asynchronous scheduling) take their token from the previous
        step's samples (``share_sampled``), still on the device: no wait for the host.
        Under tensor parallelism every rank runs this with the same ``step``; the collectives inside the
        model keep them in lockstep and rank 0 alone samples."""
        n = len(step.query_lens)
        # this process's launches are this engine's (another engine may have run a step in between)
        set_programmatic_launch(self.config.tuning.programmatic_launch_rows)
        calibrate = self.kv_calibrate  # this step sets the float8 scales (never inside a graph)
        use_graph = (
            self.graphs is not None
            and max(step.query_lens) == 1
            and self.graphs.bucket_for(n) is not None
            and not calibrate
        )
        if use_graph:
            assert self.graphs is not None
            return self._replay(self.graphs, step, draw)
        inputs = self.to_inputs(step)
        if calibrate:
            inputs.meta.kv_calibrate = True
            self.kv_calibrate = False
        pieces = self.prefill_graphs
        with phase("forward"):
            if pieces is not None and not calibrate and pieces.bucket_for(len(step.input_ids)) is not None:
                hidden, _ = pieces.run(inputs.input_ids, inputs.positions, inputs.meta)
            else:
                hidden = self._forward(inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches)
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            return Executed(logits, None, 0, inputs.sample_rows)

    def _replay(self, graphs: CUDAGraphRunner, step: StepArrays, draw: bool) -> Executed:
        """A decode step from its CUDA Graph: its inputs sent to the graph's buffer in one copy."""
        n = len(step.query_lens)
        k = len(step.logits_indices)  # the rows that sample: every row, in the usual decode step
        draw = draw and k == n and graphs.draws
        with phase("copy_to_device"):
            bucket = graphs.load(step, self.last_ids, self.inputs.decode_order(step), draw)
        with phase("graph_replay"):
            logits, ids = graphs.replay(bucket, n, self.inputs.uniform(step), draw)
            if k != n:
                logits = logits[graphs.logits_rows(bucket, k)]
        rows = None
        if ids is None and step.sample_params is not None:  # a draw after the replay
            rows = graphs.sample_rows(bucket, k)
        return Executed(logits, bucket, bucket - n, rows, ids)


def _dynamo_graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
