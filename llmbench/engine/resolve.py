"""Every "auto" of the engine's options decided in one place.

``resolve(config, facts)`` is a pure function: from the options a user gave (``EngineConfig``) and what
this machine, process and model offer (``Facts``, read once by ``read_facts``), it makes every choice left
to the engine and checks that the combination can run, raising ``ConfigError`` with what is missing.
Its ``ResolvedConfig`` holds concrete values only: it is what the engine, its tensor-parallel ranks and
the model are built from (none of them decides anything again) and what results record.

To find where a toggle is decided, read ``resolve``: one line per toggle, then the tuning knobs
(``resolve_tuning.py``); the helpers below it only check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmbench.engine.config import DEFAULT_GPU_MEMORY_UTILIZATION, ConfigError, EngineConfig, Tuning
from llmbench.engine.facts import Facts, ModelFacts, read_facts
from llmbench.engine.option_checks import AUTO
from llmbench.engine.resolve_tuning import Problems, ResolvedTuning, auto, resolve_tuning
from llmbench.models.errors import ModelError

if TYPE_CHECKING:
    import torch

    from llmbench.models.config import ModelConfig

DEFAULT_MAX_MODEL_LEN = 8192  # when not set: enough for the shipped scenarios, cheap to reserve
GRAPH_SAFE_BACKENDS = ("triton", "flash_attn")  # attention whose decode launches CUDA Graphs can capture


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
    gpu_memory_utilization: float | None  # None on a CPU
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
        d["tuning"]["prefill_graph_tokens"] = list(self.tuning.prefill_graph_tokens)
        return d


def resolve(config: EngineConfig, facts: Facts) -> ResolvedConfig:
    """Every "auto" of ``config`` decided from ``facts``; one ConfigError naming every contradiction
    found, root causes (the device, what the attention backend needs) first."""
    device = _device(config.device, facts)  # every other choice depends on it: its error comes alone
    cuda = device.startswith("cuda")
    problems = Problems()
    triton_runs = facts.triton and (cuda or facts.triton_interpret)  # on CUDA, or interpreted
    dtype = auto(config.dtype, "bfloat16" if cuda else "float32")
    backend = auto(
        config.attention_backend, "triton" if cuda and facts.triton else ("torch" if cuda else "sdpa")
    )
    for problem in _attention_backend_problems(backend, config, facts, cuda, triton_runs, dtype):
        problems.add(problem)
    triton_kernels = auto(config.triton_kernels, cuda and facts.triton)
    if triton_kernels and not triton_runs:
        problems.add(
            "triton_kernels=True needs the triton package and a CUDA device (or TRITON_INTERPRET=1 on the CPU)"
        )
    cuda_graph = auto(config.cuda_graph, cuda and backend in GRAPH_SAFE_BACKENDS)
    problems.check(_check_cuda_graph, cuda_graph, cuda, backend, fallback=None)
    kv_cache_dtype = auto(config.kv_cache_dtype, dtype)
    problems.check(_check_kv_cache, kv_cache_dtype, dtype, backend, config.tuning, fallback=None)
    prefix_cache = auto(config.prefix_cache, config.paged_kv)
    if prefix_cache and not config.paged_kv:
        problems.add("prefix_cache=True shares KV blocks between requests: it needs paged_kv=True")
    async_scheduling = auto(config.async_scheduling, cuda)  # on the CPU nothing would overlap
    problems.check(_check_tp, config.tp, facts, device, fallback=None)
    for problem in _pool_budget_problems(config, cuda):
        problems.add(problem)
    # a GPU's share only: on a CPU kv_cache_memory (or its default) sizes the pool, and nothing reads it
    gpu_memory_utilization = (
        auto(config.gpu_memory_utilization, DEFAULT_GPU_MEMORY_UTILIZATION) if cuda else None
    )
    problems.check(_check_weights_fit, config, facts, device, dtype, gpu_memory_utilization, fallback=None)
    max_model_len = problems.check(
        _max_model_len, config.max_model_len, facts.model, fallback=config.max_model_len or 0
    )
    if not cuda and max_model_len:
        problems.check(_check_cpu_pool, config, facts, max_model_len, dtype, kv_cache_dtype, fallback=None)
    if backend in GRAPH_SAFE_BACKENDS and config.block_size & (config.block_size - 1):
        problems.add(
            f"block_size must be a power of two with attention_backend={backend!r}, got {config.block_size}"
        )
    tuning = resolve_tuning(
        config,
        facts,
        problems,
        device=device,
        backend=backend,
        triton_kernels=triton_kernels,
        cuda_graph=cuda_graph,
    )
    problems.raise_any()
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
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_memory=config.kv_cache_memory,
        num_kv_blocks=config.num_kv_blocks,
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=max_model_len,
        tuning=tuning,
    )


# -- checks (each called from resolve only) -----------------------------------------


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


def _attention_backend_problems(
    backend: str, config: EngineConfig, facts: Facts, cuda: bool, triton_runs: bool, dtype: str
) -> list[str]:
    """What the attention backend lacks here: a missing device or package alone (the rest would follow
    from it), else every option it cannot run with."""
    if backend == "triton" and not triton_runs:
        return [
            "attention_backend='triton' needs the triton package and a CUDA device "
            "(or TRITON_INTERPRET=1 to run its kernels on the CPU, slowly)"
        ]
    if backend != "flash_attn":
        return []
    if not cuda:
        return ["attention_backend='flash_attn' needs a CUDA device"]
    if not facts.flash_attn:
        return [
            "attention_backend='flash_attn' needs flash-attn installed (pip install 'llmbench[flash]'); "
            "available here: torch, sdpa" + (", triton" if facts.triton else "")
        ]
    found = []
    if dtype not in ("float16", "bfloat16"):
        found.append(
            f"attention_backend='flash_attn' runs in float16 or bfloat16 only (flash-attn has no {dtype} "
            "kernels): set dtype='bfloat16' or choose another attention backend"
        )
    if not config.paged_kv:
        found.append("attention_backend='flash_attn' reads a paged KV cache: it needs paged_kv=True")
    return found


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


def _pool_budget_problems(config: EngineConfig, cuda: bool) -> list[str]:
    """Each device's KV pool has its own budget, and num_kv_blocks replaces it: an option set where it
    cannot apply (whatever its value: set is set), or set beside the one that would override it, would be
    ignored."""
    found = []
    budget = "kv_cache_memory" if not cuda else "gpu_memory_utilization"
    if not cuda and config.gpu_memory_utilization is not None:
        found.append(
            f"gpu_memory_utilization={config.gpu_memory_utilization} sizes the KV pool from a GPU's memory: on "
            "the CPU, kv_cache_memory (or num_kv_blocks) sizes it"
        )
    if cuda and config.kv_cache_memory is not None:
        found.append(
            "kv_cache_memory sizes the CPU's KV pool: on a GPU, gpu_memory_utilization (or num_kv_blocks) sizes it"
        )
    if config.num_kv_blocks is not None and getattr(config, budget) is not None:
        found.append(
            f"num_kv_blocks={config.num_kv_blocks} and {budget}={getattr(config, budget)} both size the KV pool, "
            f"and num_kv_blocks would override {budget}: drop {budget} to keep {config.num_kv_blocks} blocks, "
            f"or drop num_kv_blocks to size the pool from {budget}"
        )
    return found


def _check_weights_fit(
    config: EngineConfig, facts: Facts, device: str, dtype: str, gpu_memory_utilization: float | None
) -> None:
    """The weights must fit where they go, before any is loaded: on the CPU the memory the host has free
    now (every rank of a CPU run shares it), on a GPU its share (gpu_memory_utilization) of each rank's."""
    import torch

    weights = facts.model.num_params * getattr(torch, dtype).itemsize
    if device.startswith("cuda"):
        room = None if facts.device_memory is None else facts.device_memory * gpu_memory_utilization
        weights //= config.tp
        where = f"each GPU's {gpu_memory_utilization:g} share of {_gib(facts.device_memory or 0)}"
    else:
        room, where = facts.host_memory_available, "the memory this machine has free now"
    if room is None or not weights or weights <= room:
        return
    cuda = device.startswith("cuda")
    ways = [
        *(["dtype='bfloat16'"] if dtype == "float32" else []),
        "a smaller model",
        *(["a larger tp"] if cuda else []),
    ]
    raise ConfigError(
        f"{facts.model.name} in {dtype} needs {_gib(weights)} of weights{' per GPU' if cuda and config.tp > 1 else ''}, "
        f"more than {where} ({_gib(room)}): use {', '.join(ways[:-1])} or {ways[-1]}"
    )


def _check_cpu_pool(
    config: EngineConfig, facts: Facts, max_model_len: int, dtype: str, kv_cache_dtype: str
) -> None:
    """A CPU's KV pool is sized by arithmetic alone (engine/kv_cache.py): it must hold one max_model_len
    sequence and, with the weights, fit in the memory the host has free now, before anything loads."""
    import torch

    from llmbench.engine.kv_cache import block_bytes, cpu_blocks

    m = facts.model
    if not (m.num_layers and m.head_dim):
        return
    size = 1 if kv_cache_dtype != dtype else getattr(torch, dtype).itemsize
    heads = max(m.num_key_value_heads // config.tp, 1)  # a rank's; each CPU rank holds a pool
    per_block = block_bytes(m.num_layers, config.block_size, heads, m.head_dim, torch.uint8) * size
    blocks = config.num_kv_blocks or cpu_blocks(
        config.kv_cache_memory, config.max_num_seqs, config.block_size, max_model_len, per_block
    )
    pool = blocks * per_block * config.tp
    weights = m.num_params * getattr(torch, dtype).itemsize
    room = facts.host_memory_available
    if room is not None and weights <= room < pool + weights:  # weights alone: _check_weights_fit
        raise ConfigError(
            f"the KV pool of {blocks:,} blocks of {config.block_size} tokens ({_gib(pool)}"
            f"{f' over {config.tp} ranks' if config.tp > 1 else ''}) and the weights ({_gib(weights)}) need "
            f"more than the memory this machine has free now ({_gib(room)}): lower "
            + (
                "num_kv_blocks"
                if config.num_kv_blocks
                else "kv_cache_memory"
                if config.kv_cache_memory is not None
                else "max_num_seqs or max_model_len (or set a smaller kv_cache_memory)"
            )
        )


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _check_cuda_graph(cuda_graph: bool, cuda: bool, backend: str) -> None:
    if cuda_graph and not cuda:
        raise ConfigError("cuda_graph=True needs a CUDA device: CUDA Graphs cannot run on the CPU")
    if cuda_graph and backend not in GRAPH_SAFE_BACKENDS:
        raise ConfigError(
            f"cuda_graph=True needs a graph-safe attention backend ('triton' or 'flash_attn'), got {backend!r}"
        )


def _check_tp(tp: int, facts: Facts, device: str) -> None:
    if facts.launcher == "torchrun" and facts.world_size != tp:  # at tp=1 too: each would run it all
        raise ConfigError(
            f"torchrun started {facts.world_size} processes (WORLD_SIZE) but tp={tp}: they must be equal "
            f"(set tp={facts.world_size}, or start {tp} processes)"
        )
    if tp == 1:
        return
    first = int(device.partition(":")[2] or 0)  # spawned rank r runs on GPU first + r (engine/tp.py)
    if device.startswith("cuda") and facts.launcher != "torchrun" and first + tp > facts.cuda_devices:
        raise ConfigError(
            f"tp={tp} on device={device!r} takes GPUs {first}..{first + tp - 1}; this machine has "
            f"{facts.cuda_devices} (0..{facts.cuda_devices - 1}): lower tp"
            + (" or start from an earlier GPU" if first else "")
        )
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


def _max_model_len(asked: int | None, model: ModelFacts) -> int:
    if asked is None:
        return min(model.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
    if asked > model.max_position_embeddings:
        raise ConfigError(
            f"max_model_len={asked} exceeds the model's max_position_embeddings ({model.max_position_embeddings})"
        )
    return asked


class ModelNotFoundError(ConfigError, ModelError):
    """A model name that names nothing runnable: an engine option's error for the callers that check the
    options, and a model error (no "engine options:" before it) for a person, as ``model`` is no option
    of ``engine:`` in a scenario."""


def find_model(model: str) -> tuple[ModelConfig, Path | None]:
    """The model's config (and its folder, None for a preset); an unknown one is a ModelNotFoundError."""
    from llmbench.models.registry import UnknownModelError, resolve_model

    try:
        return resolve_model(model)
    except UnknownModelError as exc:
        raise ModelNotFoundError(str(exc)) from None


def resolve_here(config: EngineConfig) -> ResolvedConfig:
    """``config`` as an engine built now, in this process, would run it."""
    model_config, _ = find_model(config.model)
    return resolve(config, read_facts(ModelFacts.of(config.model, model_config)))
