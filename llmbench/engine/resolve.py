"""Every "auto" of the engine's options decided in one place.

``resolve(config, facts)`` is a pure function: from the options a user gave (``EngineConfig``) and what
this machine, process and model offer (``Facts``, read once by ``read_facts``), it makes every choice left
to the engine and checks that the combination can run, raising ``ConfigError`` with what is missing.
Its ``ResolvedConfig`` holds concrete values only: it is what the engine, its tensor-parallel ranks and
the model are built from (none of them decides anything again) and what results record.

To find where a toggle is decided, read ``resolve``: one line per toggle, then the tuning knobs
(``_resolve_tuning``); the helpers below it only check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmbench.engine.config import ConfigError, EngineConfig, Tuning
from llmbench.engine.facts import Facts, ModelFacts, read_facts
from llmbench.engine.option_checks import AUTO

if TYPE_CHECKING:
    import torch

    from llmbench.models.config import ModelConfig

DEFAULT_MAX_MODEL_LEN = 8192  # when not set: enough for the shipped scenarios, cheap to reserve
SKINNY_MATMUL_ROWS = 1  # where the skinny kernel beat cuBLAS on every layer of the H200 sweep
# skinny_fusion "auto" fuses the RMSNorms into the matmul up to this hidden size: each program of the
# fused kernel sums the whole row's squares for itself, which paid at hidden size 1024 (qwen3-0.6b, -2.7%
# per token on an H200) and cost at 4096 (qwen3-8b, +1.6%).
NORM_FUSION_MAX_HIDDEN = 2048
GRAPH_SAFE_BACKENDS = ("triton", "flash_attn")  # attention whose decode launches CUDA Graphs can capture


@dataclass(frozen=True)
class ResolvedTuning:
    """``Tuning`` with every choice made (see its docstring for the meanings)."""

    cuda_graph_buckets: tuple[int, ...]  # () when cuda_graph is off
    decode_split_tokens: int  # 0: equal slices per sequence, chosen per step
    decode_longest_first: bool
    graph_sampling: bool
    skinny_matmul_rows: int  # 0: cuBLAS always
    skinny_fusion: str  # "all" | "silu" | "none"
    tp_all_reduce: str  # "nccl" (gloo on the CPU) | "symm_mem" | "none" (tp=1)
    tp_fuse_norm: bool
    tp_fuse_matmul: bool
    compile_mode: str
    # a float8 KV cache's fixed scale; None: set per layer and head from the first prefill (a measurement,
    # like the KV pool's size)
    kv_cache_scale: float | None


@dataclass(frozen=True)
class ResolvedConfig:
    """``EngineConfig`` with every choice made: what runs, and what results record."""

    model: str
    device: str  # "cpu" | "cuda" | "cuda:N" (each rank's own GPU once placed)
    dtype: str
    seed: int
    paged_kv: bool
    prefix_cache: bool
    continuous_batching: bool
    chunked_prefill: bool
    attention_backend: str
    triton_kernels: bool
    torch_compile: bool
    cuda_graph: bool
    async_scheduling: bool
    tp: int
    kv_cache_dtype: str  # the model's dtype, or "fp8_e4m3" / "fp8_e5m2"
    gpu_memory_utilization: float
    # The KV pool's sizes: None sizes it at start-up from the memory budget (gpu_memory_utilization on
    # CUDA, the CPU default otherwise); the startup stats record the blocks it got.
    kv_cache_memory: int | None
    num_kv_blocks: int | None
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    tuning: ResolvedTuning

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tuning"]["cuda_graph_buckets"] = list(self.tuning.cuda_graph_buckets)
        return d


def resolve(config: EngineConfig, facts: Facts) -> ResolvedConfig:
    """Every "auto" of ``config`` decided from ``facts``; ConfigError if the combination cannot run."""
    device = _device(config.device, facts)
    cuda = device.startswith("cuda")
    triton_runs = facts.triton and (cuda or facts.triton_interpret)  # on CUDA, or interpreted
    dtype = _auto(config.dtype, "bfloat16" if cuda else "float32")
    backend = _auto(
        config.attention_backend, "triton" if cuda and facts.triton else ("torch" if cuda else "sdpa")
    )
    kv_cache_dtype = _auto(config.kv_cache_dtype, dtype)
    _check_kv_cache(kv_cache_dtype, dtype, backend, config.tuning)
    _check_attention_backend(backend, config, facts, cuda, triton_runs, dtype)
    triton_kernels = _auto(config.triton_kernels, cuda and facts.triton)
    if triton_kernels and not triton_runs:
        raise ConfigError(
            "triton_kernels=True needs the triton package and a CUDA device (or TRITON_INTERPRET=1 on the CPU)"
        )
    cuda_graph = _auto(config.cuda_graph, cuda and backend in GRAPH_SAFE_BACKENDS)
    _check_cuda_graph(cuda_graph, cuda, backend)
    prefix_cache = _auto(config.prefix_cache, config.paged_kv)
    if prefix_cache and not config.paged_kv:
        raise ConfigError("prefix_cache=True shares KV blocks between requests: it needs paged_kv=True")
    async_scheduling = _auto(config.async_scheduling, cuda)  # on the CPU nothing would overlap
    _check_tp(config.tp, facts)
    max_model_len = _max_model_len(config.max_model_len, facts.model)
    if backend in GRAPH_SAFE_BACKENDS and config.block_size & (config.block_size - 1):
        raise ConfigError(
            f"block_size must be a power of two with attention_backend={backend!r}, got {config.block_size}"
        )
    tuning = _resolve_tuning(
        config,
        facts,
        device=device,
        backend=backend,
        triton_kernels=triton_kernels,
        cuda_graph=cuda_graph,
    )
    return ResolvedConfig(
        model=config.model,
        device=device,
        dtype=dtype,
        seed=config.seed,
        paged_kv=config.paged_kv,
        prefix_cache=prefix_cache,
        continuous_batching=config.continuous_batching,
        chunked_prefill=config.chunked_prefill,
        attention_backend=backend,
        triton_kernels=triton_kernels,
        torch_compile=config.torch_compile,
        cuda_graph=cuda_graph,
        async_scheduling=async_scheduling,
        tp=config.tp,
        kv_cache_dtype=kv_cache_dtype,
        gpu_memory_utilization=config.gpu_memory_utilization,
        kv_cache_memory=config.kv_cache_memory,
        num_kv_blocks=config.num_kv_blocks,
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=max_model_len,
        tuning=tuning,
    )


def _resolve_tuning(
    config: EngineConfig, facts: Facts, *, device: str, backend: str, triton_kernels: bool, cuda_graph: bool
) -> ResolvedTuning:
    """The tuning knobs, given the toggles they tune."""
    t: Tuning = config.tuning
    cuda = device.startswith("cuda")
    skinny_rows = _auto(t.skinny_matmul_rows, SKINNY_MATMUL_ROWS if triton_kernels else 0)
    if skinny_rows and not triton_kernels:
        raise ConfigError(
            f"tuning.skinny_matmul_rows={skinny_rows} asks for a Triton kernel: it needs triton_kernels=True "
            "(or tuning.skinny_matmul_rows=0)"
        )
    if t.decode_split_tokens and backend != "triton":
        raise ConfigError(
            "tuning.decode_split_tokens tunes the Triton decode kernel: it needs attention_backend='triton', "
            f"got {backend!r}"
        )
    longest_first = _switch(
        t.decode_longest_first,
        "tuning.decode_longest_first=True orders the Triton decode kernel's work",
        ("attention_backend 'triton'", backend == "triton"),
    )
    graph_sampling = _switch(
        t.graph_sampling,
        "tuning.graph_sampling=True draws decode steps' tokens inside their CUDA Graphs",
        ("cuda_graph=True", cuda_graph),
        ("triton_kernels=True (the draw is a Triton kernel)", triton_kernels),
    )
    all_reduce = _all_reduce(t.tp_all_reduce, config.tp, device, facts)
    fuse_norm = _switch(
        t.tp_fuse_norm,
        "tuning.tp_fuse_norm=True does each tensor-parallel all-reduce with the RMSNorm after it in one "
        "Triton kernel over the GPUs' shared memory",
        ("tp > 1", config.tp > 1),
        ("a CUDA device", cuda),
        ("triton_kernels=True", triton_kernels),
        ("the one-shot all-reduce (tuning.tp_all_reduce 'symm_mem' or 'auto')", all_reduce == "symm_mem"),
        ("torch_compile=False", not config.torch_compile),
        (
            "tuning.skinny_fusion other than 'all' (that fuses the norms into the matmuls)",
            t.skinny_fusion != "all",
        ),
    )
    fuse_matmul = _switch(
        t.tp_fuse_matmul,
        "tuning.tp_fuse_matmul=True sums each row-parallel product of a one-row decode step over the GPUs "
        "in the product's own kernel",
        ("tuning.tp_fuse_norm (the all-reduce fused with the norm, and what that needs)", fuse_norm),
        ("tuning.skinny_matmul_rows >= 1 (the skinny matmul, whose kernel it extends)", skinny_rows >= 1),
    )
    fusion = t.skinny_fusion
    if fusion == AUTO:  # the norms go with the all-reduce instead where tp_fuse_norm takes them
        small = facts.model.hidden_size <= NORM_FUSION_MAX_HIDDEN
        fusion = "none" if not skinny_rows else ("all" if small and not fuse_norm else "silu")
    elif fusion != "none" and not skinny_rows:
        raise ConfigError(
            f"tuning.skinny_fusion={fusion!r} fuses into the skinny matmul, which is off "
            "(tuning.skinny_matmul_rows=0 or triton_kernels=False)"
        )
    buckets = t.cuda_graph_buckets or default_buckets(config.max_num_seqs)
    return ResolvedTuning(
        cuda_graph_buckets=tuple(sorted(set(buckets))) if cuda_graph else (),
        decode_split_tokens=t.decode_split_tokens,
        decode_longest_first=longest_first,
        graph_sampling=graph_sampling,
        skinny_matmul_rows=skinny_rows,
        skinny_fusion=fusion,
        tp_all_reduce=all_reduce,
        tp_fuse_norm=fuse_norm,
        tp_fuse_matmul=fuse_matmul,
        compile_mode=t.compile_mode,
        kv_cache_scale=t.kv_cache_scale,
    )


def default_buckets(max_num_seqs: int) -> list[int]:
    """CUDA Graph batch sizes: fine steps where padding would cost most (small batches), then every 16."""
    small = [b for b in (1, 2, 4, 8) if b <= max_num_seqs]
    return sorted(set(small + list(range(16, max_num_seqs + 1, 16)) + [max_num_seqs]))


# -- checks (each called from resolve or _resolve_tuning only) -----------------------------------------


def _auto(asked: Any, default: Any) -> Any:
    return default if asked is None or asked == AUTO else asked


def _switch(asked: bool | None, what: str, *needs: tuple[str, bool]) -> bool:
    """An automatic switch: on where all it needs is there; asked for where something is missing, an
    error naming each missing condition in order."""
    missing = [name for name, met in needs if not met]
    if asked is None:
        return not missing
    if asked and missing:
        raise ConfigError(f"{what}: it needs {', '.join(missing)}")
    return asked


def _device(asked: str, facts: Facts) -> str:
    if asked == AUTO:
        return "cuda" if facts.cuda_devices else "cpu"
    if asked.startswith("cuda"):
        if not facts.cuda_devices:
            raise ConfigError(f"device={asked!r} was asked for, but torch sees no CUDA device")
        index = int(asked.partition(":")[2] or 0)
        if index >= facts.cuda_devices:
            raise ConfigError(
                f"device={asked!r}: torch sees {facts.cuda_devices} CUDA device(s), "
                f"cuda:0 to cuda:{facts.cuda_devices - 1}"
            )
    return asked


def _check_attention_backend(
    backend: str, config: EngineConfig, facts: Facts, cuda: bool, triton_runs: bool, dtype: str
) -> None:
    if backend == "triton" and not triton_runs:
        raise ConfigError(
            "attention_backend='triton' needs the triton package and a CUDA device "
            "(or TRITON_INTERPRET=1 to run its kernels on the CPU, slowly)"
        )
    if backend != "flash_attn":
        return
    if dtype not in ("float16", "bfloat16"):
        raise ConfigError(
            f"attention_backend='flash_attn' runs in float16 or bfloat16 only (flash-attn has no {dtype} "
            "kernels): set dtype='bfloat16' or choose another attention backend"
        )
    if not cuda:
        raise ConfigError("attention_backend='flash_attn' needs a CUDA device")
    if not facts.flash_attn:
        raise ConfigError(
            "attention_backend='flash_attn' needs flash-attn installed (pip install 'llmbench[flash]'); "
            "available here: torch, sdpa" + (", triton" if facts.triton else "")
        )
    if not config.paged_kv:
        raise ConfigError("attention_backend='flash_attn' reads a paged KV cache: it needs paged_kv=True")


def _check_kv_cache(kv_cache_dtype: str, dtype: str, backend: str, tuning: Tuning) -> None:
    fp8 = kv_cache_dtype != dtype
    if fp8 and backend == "flash_attn":
        raise ConfigError(
            f"kv_cache_dtype={kv_cache_dtype!r} stores float8 K/V, which the flash_attn backend cannot read: "
            "choose attention_backend 'triton', 'sdpa' or 'torch', or kv_cache_dtype='auto'"
        )
    if tuning.kv_cache_scale is not None and not fp8:
        raise ConfigError(
            "tuning.kv_cache_scale sets the scales of a float8 KV cache: it needs kv_cache_dtype "
            "'fp8_e4m3' or 'fp8_e5m2'"
        )


def _check_cuda_graph(cuda_graph: bool, cuda: bool, backend: str) -> None:
    if cuda_graph and not cuda:
        raise ConfigError("cuda_graph=True needs a CUDA device: CUDA Graphs cannot run on the CPU")
    if cuda_graph and backend not in GRAPH_SAFE_BACKENDS:
        raise ConfigError(
            f"cuda_graph=True needs a graph-safe attention backend ('triton' or 'flash_attn'), got {backend!r}"
        )


def _check_tp(tp: int, facts: Facts) -> None:
    if tp == 1:
        return
    m = facts.model
    if m.num_attention_heads % tp:
        why = f"tp={tp} does not divide the {m.num_attention_heads} attention heads"
    elif m.num_key_value_heads % tp and tp % m.num_key_value_heads:
        why = f"tp={tp} neither divides nor is a multiple of the {m.num_key_value_heads} key/value heads"
    elif m.intermediate_size % tp:
        why = f"tp={tp} does not divide the MLP width {m.intermediate_size}"
    else:
        why = None
    if why:
        raise ConfigError(f"{why} of {m.name}")
    if facts.launcher == "torchrun" and facts.world_size != tp:
        raise ConfigError(
            f"torchrun started {facts.world_size} processes (WORLD_SIZE) but tp={tp}: they must be equal "
            f"(set tp={facts.world_size}, or start {tp} processes)"
        )


def _max_model_len(asked: int | None, model: ModelFacts) -> int:
    if asked is None:
        return min(model.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
    if asked > model.max_position_embeddings:
        raise ConfigError(
            f"max_model_len={asked} exceeds the model's max_position_embeddings ({model.max_position_embeddings})"
        )
    return asked


def _all_reduce(asked: str, tp: int, device: str, facts: Facts) -> str:
    """ "none" at tp=1; the one-shot "symm_mem" where the ranks can share GPU memory; "nccl" otherwise."""
    cuda = device.startswith("cuda")
    if asked == "symm_mem":
        if not (cuda and tp > 1):
            raise ConfigError(
                "tuning.tp_all_reduce='symm_mem' reads the other GPUs' memory over NVLink: it needs tp > 1 on "
                f"CUDA devices (got tp={tp} on {device!r})"
            )
        if facts.launcher == "torchrun" and not facts.ranks_share_memory:
            raise ConfigError(
                f"tuning.tp_all_reduce='symm_mem' needs every rank on one host (NVLink); torchrun placed "
                f"{facts.local_world_size} of {facts.world_size} ranks here: use tuning.tp_all_reduce='nccl' "
                "across hosts"
            )
        if not facts.ranks_share_memory:
            raise ConfigError(
                "tuning.tp_all_reduce='symm_mem' can be set up once per process (PyTorch numbers its "
                "symmetric-memory exchanges per process, and this engine's new ranks would start again from "
                "the first): start this engine in a new process, or use tuning.tp_all_reduce='nccl' or 'auto'"
            )
        return "symm_mem"
    if tp == 1:
        return "none"
    if asked == "nccl":
        return "nccl"
    return "symm_mem" if cuda and facts.ranks_share_memory else "nccl"


def find_model(model: str) -> tuple[ModelConfig, Path | None]:
    """The model's config (and its folder, None for a preset); an unknown one is a ConfigError."""
    from llmbench.models.registry import UnknownModelError, resolve_model

    try:
        return resolve_model(model)
    except UnknownModelError as exc:
        raise ConfigError(str(exc)) from None


def resolve_here(config: EngineConfig) -> ResolvedConfig:
    """``config`` as an engine built now, in this process, would run it."""
    model_config, _ = find_model(config.model)
    return resolve(config, read_facts(ModelFacts.of(config.model, model_config)))
