"""Engine options as a user writes them, checked where they enter.

``EngineConfig`` holds what a user of llmbench studies: the model and device, the optimisation toggles
(each with a real "off" path) and the memory and batch knobs. Choices that tune how an optimisation is
carried out (kernel tiles, graph buckets, which all-reduce, which fusions) sit in its nested ``Tuning``.
``auto`` (or None) leaves a choice to the engine; ``resolve`` (engine/resolve.py) makes every such
choice from this config and the facts of the machine, and its ``ResolvedConfig`` is what runs and what
results record.

``check_options`` checks a mapping of options (types, ranges, choices) and returns every problem at once,
each named by its path (``tuning.skinny_fusion``): ``EngineConfig.from_options`` (the ``LLM`` keywords)
and the scenario loader (``engine:``, ``--set engine.x=``, ``ablate --toggle NAME=A,B``) both call it.
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from llmbench.engine.option_checks import AUTO, ENGINE_CHECKS, TUNING_CHECKS, Check, Invalid
from llmbench.suggest import did_you_mean

DEFAULT_COMPILE_MODE = "default"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # what gpu_memory_utilization "auto" gives on a GPU

# The optimisations (the README's toggle table): what ``ablate --toggle NAME`` flips.
TOGGLES = (
    "paged_kv",
    "prefix_cache",
    "continuous_batching",
    "chunked_prefill",
    "attention_backend",
    "triton_kernels",
    "torch_compile",
    "cuda_graph",
    "async_scheduling",
    "tp",
    "kv_cache_dtype",
)


class OptionProblem(NamedTuple):
    """One bad option: its path (``max_num_seqs``, ``tuning.skinny_fusion``) and what is allowed."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(ValueError):
    """Engine options that are malformed, out of range, or cannot apply on this machine or model."""

    def __init__(self, message: str, problems: tuple[OptionProblem, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems

    @classmethod
    def listing(cls, problems: list[OptionProblem]) -> ConfigError:
        """One error naming every problem, one a line."""
        return cls("\n".join(str(p) for p in problems), tuple(problems))


@dataclass(frozen=True)
class Tuning:
    """How the optimisations are carried out: the defaults (``auto``) are what the measurements chose;
    set one to study or reproduce a choice. ``auto`` / None is decided by ``resolve``.

    cuda_graph_buckets: batch sizes that get a CUDA Graph (a decode batch runs in the smallest one that
        holds it). auto: 1, 2, 4, 8, then every 16 up to max_num_seqs.
    decode_split_tokens: Triton decode attention cuts each context into slices of this many tokens (a
        multiple of 64), which evens out batches of mixed lengths. 0 (and auto): equal slices per
        sequence, chosen per step from the batch's shape. Needs attention_backend 'triton'.
    decode_longest_first: Triton decode attention takes a large batch's sequences longest context
        first, so that a batch of mixed lengths does not end with a few long ones running alone.
        auto: on with attention_backend 'triton'.
    decode_uniform_tiling: Triton decode attention over a float8 cache gives a decode batch whose contexts
        are about one length (the shortest at least half the longest) the tiling measured fastest on such
        batches, and other batches the one measured fastest on mixed lengths; CUDA Graphs capture both
        for the batch sizes where they differ. auto: on with attention_backend 'triton'.
    mixed_step_decodes: in a step that mixes prompt chunks with decodes, Triton attention takes the
        decodes with its decode kernel (as a decode step would, longest first where that pays) and the
        chunks with its prefill kernel: two launches a layer. off: the prefill kernel takes them all, each
        decode a tile of up to 128 query rows of its own. auto: on with attention_backend 'triton'.
    graph_sampling: the draw of a decode step's tokens (greedy and temperature rows; a step whose
        requests ask for top-k, top-p or min-p samples after the graph) inside its CUDA Graph, so that it
        costs no launches on the host. auto: on with cuda_graph and triton_kernels.
    prefill_graphs: prefill and mixed steps of up to max_num_batched_tokens tokens run their forward from
        CUDA Graphs as well: all of it but attention, cut at each layer's attention into pieces captured
        per bucket of token counts (prefill_graph_tokens; a step runs in the smallest that holds it, its
        padded rows storing no K/V), with the host launching attention between them. An eager step's host launches about ten kernels a layer, which costs it about as long as the
        device takes to run them. auto: on with cuda_graph, triton_kernels, attention_backend 'triton' or
        'flash_attn', tp=1 and torch_compile off.
    prefill_narrow_tiles_up_to: Triton prefill attention over a cache of the model's dtype takes tiles of
        64 query rows and 64 keys in a step whose longest query is at most this many tokens, and tiles of
        128 rows and 128 keys (which pay on long prompts) in a step with a longer one. 0: the wide tiles
        wherever the queries fill them. auto: PREFILL_NARROW_TILES_UP_TO (engine/resolve_tuning.py) with
        attention_backend 'triton', else 0.
    prefill_graph_tokens: with prefill_graphs, the token counts that get graphs (a step runs in the smallest
        that holds it, eagerly above the largest). auto: 16, 32, 64, ... up to max_num_batched_tokens, and
        max_num_batched_tokens itself.
    programmatic_launch_rows: the Triton kernels (norms, rotary and KV store, attention, activation, the
        draw) over up to this many rows (a decode step's sequences, other steps' tokens; in a mixed step
        the decode kernel counts its decodes) are launched with programmatic dependent launch: each is placed on the GPU while the kernel before it
        drains and waits there for its inputs, instead of being launched once that kernel has finished;
        CUDA Graphs keep it. 0: never. auto: PROGRAMMATIC_LAUNCH_ROWS (engine/resolve_tuning.py) on NVIDIA
        GPUs of compute capability 9.0 (Hopper) and later, with triton_kernels, torch_compile off and a
        Triton that has it; else 0.
    skinny_matmul_rows: linear layers take the skinny Triton matmul for inputs of up to this many rows
        (0..256; decode at small batches; from two rows on its products run on the tensor cores, above 64
        rows in blocks of rows), cuBLAS above; 0: cuBLAS always. auto: as many rows as
        programmatic_launch_rows covers, at most SKINNY_MATMUL_ROWS (engine/resolve_tuning.py), at tp=1
        for hidden sizes up to SKINNY_ROWS_MAX_HIDDEN (1024); else 1 with triton_kernels; else 0.
    skinny_fusion: what the skinny matmul does on its input's loads at one-row steps (more rows take its
        tensor-core products with nothing fused, which measured faster): 'all' (the RMSNorm before it,
        with the residual add, and the SiLU-and-multiply before the down projection), 'silu' (the latter
        only), 'none'. auto: 'all' for hidden sizes up to 2048 (unless tp_fuse_norm takes the norms), else
        'silu'.
    tp_all_reduce: the all-reduce between tensor-parallel ranks: 'nccl' (torch.distributed: NCCL on
        GPUs, gloo on the CPU) or 'symm_mem' (one-shot over NVLink for small messages, NCCL for the rest;
        GPUs of one host). auto: 'symm_mem' where the ranks can share GPU memory, else 'nccl'. Resolved,
        torch.distributed's reads as what runs it: 'nccl' on GPUs, 'gloo' on the CPU.
    tp_fuse_norm: tp > 1: each all-reduce of a decode step done together with the RMSNorm after it, in
        one Triton kernel over the GPUs' shared memory. auto: wherever it can apply.
    tp_fuse_matmul: tp > 1, with tp_fuse_norm: at one-row decode steps each row-parallel product
        (o_proj, down_proj) sums itself over the ranks in its own kernel. auto: wherever it can apply.
    compile_mode: the torch.compile mode when torch_compile is on: default, reduce-overhead (CUDA
        Graphs: a GPU only), max-autotune, max-autotune-no-cudagraphs. auto: default.
    kv_cache_scale: a float8 KV cache's scales (stored value = real value / scale), the same for every
        layer and head. auto: set per layer and KV head from the first prefill's K/V, with headroom.
    """

    cuda_graph_buckets: tuple[int, ...] | None = None
    decode_split_tokens: int | None = None
    decode_longest_first: bool | None = None
    decode_uniform_tiling: bool | None = None
    mixed_step_decodes: bool | None = None
    graph_sampling: bool | None = None
    prefill_graphs: bool | None = None
    prefill_graph_tokens: tuple[int, ...] | None = None
    prefill_narrow_tiles_up_to: int | None = None
    programmatic_launch_rows: int | None = None
    skinny_matmul_rows: int | None = None
    skinny_fusion: str = AUTO
    tp_all_reduce: str = AUTO
    tp_fuse_norm: bool | None = None
    tp_fuse_matmul: bool | None = None
    compile_mode: str = AUTO
    kv_cache_scale: float | None = None

    def __post_init__(self) -> None:
        _check_fields(self, TUNING_CHECKS, "tuning.")


@dataclass(frozen=True)
class EngineConfig:
    """The engine's options; every one a keyword of ``LLM`` with a default. ``auto`` (or None) lets
    the engine choose for the device (``resolve``); a toggle asked for where it cannot apply is an error.

    model: a preset name (``llmbench models``) or a folder with config.json and *.safetensors.
    device: auto (CUDA when torch sees a GPU, else cpu), cpu, cuda or cuda:N.
    dtype: auto (bfloat16 on CUDA, float32 on the CPU), float32, float16 or bfloat16.
    seed: the seed of a preset's random weights, and of the draws of sampled requests that carry no seed.

    Optimisation toggles:
    paged_kv: block-paged KV pool with block tables (off: one contiguous max_model_len slab per sequence).
    prefix_cache: share full KV blocks of identical prefixes across requests (needs paged_kv). auto: on
        with paged_kv.
    continuous_batching: requests join and leave the batch every step (off: static batches).
    chunked_prefill: long prompts split under the per-step token budget, mixed with decodes.
    attention_backend: triton, flash_attn (when installed), sdpa, or the torch reference. auto: triton on
        CUDA, sdpa on the CPU.
    triton_kernels: fused Triton RMSNorm(+residual), RoPE, SiLU-and-multiply, KV store (off: plain torch
        ops). auto: on for CUDA with Triton installed.
    torch_compile: torch.compile on the model's step functions (Tuning.compile_mode).
    cuda_graph: decode steps replayed from CUDA Graphs captured per batch-size bucket
        (Tuning.cuda_graph_buckets), and other steps' forward but attention from graphs per token-count
        bucket (Tuning.prefill_graphs). auto: on for CUDA with a graph-safe attention backend.
    async_scheduling: step N+1 scheduled and launched before step N's ids reach the host. auto: on for
        CUDA (on the CPU host and device are the same cores: nothing overlaps).
    tp: tensor-parallel degree (NCCL between GPUs, gloo on the CPU).
    kv_cache_dtype: what the KV cache holds: auto (the model's dtype), fp8_e4m3 or fp8_e5m2 (quantised on
        store, dequantised on load, with one scale per layer and KV head: Tuning.kv_cache_scale); a float8
        pool holds twice the tokens of a bfloat16 one in the same memory.

    Memory and batch knobs:
    gpu_memory_utilization: the share of the GPU's memory the engine may use (0 < x <= 1); the KV pool
        gets what weights, activations and graphs leave. auto: 0.9. Set on the CPU, an error.
    kv_cache_memory: bytes of the CPU's KV pool (a count, or a size: 512MiB, 4GB), at least one
        max_model_len sequence's. auto: what max_num_seqs full-length sequences need, at most 1 GiB. Set
        on a GPU, an error.
    num_kv_blocks: the KV pool's size in blocks, instead of a memory budget: set together with
        kv_cache_memory or gpu_memory_utilization, an error (one of the two would go unused). auto:
        from the budget.
    block_size: tokens per KV block (a power of two with the triton and flash_attn backends).
    max_num_seqs: sequences in one batch at most.
    max_num_batched_tokens: tokens in one step at most (the chunked-prefill budget).
    max_model_len: prompt plus output tokens of one request at most. auto: the model's
        max_position_embeddings, at most 8192.

    tuning: a ``Tuning`` (or a mapping of its fields): how the optimisations are carried out.
    """

    model: str = "qwen3-tiny"
    device: str = AUTO
    dtype: str = AUTO
    seed: int = 0

    # optimisation toggles
    paged_kv: bool = True
    prefix_cache: bool | None = None
    continuous_batching: bool = True
    chunked_prefill: bool = True
    attention_backend: str = AUTO
    triton_kernels: bool | None = None
    torch_compile: bool = False
    cuda_graph: bool | None = None
    async_scheduling: bool | None = None
    tp: int = 1
    kv_cache_dtype: str = AUTO

    # memory and batch knobs
    gpu_memory_utilization: float | None = None
    kv_cache_memory: int | None = None
    num_kv_blocks: int | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None

    tuning: Tuning = dataclasses.field(default_factory=Tuning)

    def __post_init__(self) -> None:
        if not isinstance(self.tuning, Tuning):
            object.__setattr__(self, "tuning", _tuning_from(self.tuning))
        _check_fields(self, ENGINE_CHECKS, "")

    @classmethod
    def from_options(cls, model: str | os.PathLike[str] = "qwen3-tiny", **options: Any) -> EngineConfig:
        """The config of ``LLM(model, **options)``: every problem with the options in one ConfigError."""
        values, problems = check_options(options)
        if isinstance(model, os.PathLike):  # a folder given as a Path
            model = os.fspath(model)
        if not isinstance(model, str) or not model:
            problems.insert(0, OptionProblem("model", f"expected a preset name or a folder, got {model!r}"))
        if problems:
            raise ConfigError.listing(problems)
        return cls(model=model, **values)


def check_options(options: Mapping[Any, Any], prefix: str = "") -> tuple[dict[str, Any], list[OptionProblem]]:
    """``options`` (EngineConfig's fields but ``model``, with ``tuning`` a mapping or a ``Tuning``) checked:
    the values normalised (``auto`` -> None where None means auto, ``tuning`` a ``Tuning``) and every
    problem found, each path prefixed with ``prefix`` (``engine.``)."""
    values: dict[str, Any] = {}
    problems: list[OptionProblem] = []
    for key, value in options.items():
        path = f"{prefix}{key}"
        if key == "tuning":
            tuning, found = _check_tuning(value, f"{path}.")
            problems += found
            if not found:
                values["tuning"] = Tuning(**tuning)
        elif key in ENGINE_CHECKS:
            _check_one(ENGINE_CHECKS[key], value, path, values, problems, key)
        elif key in TUNING_CHECKS:
            problems.append(OptionProblem(path, f"a tuning knob: set it under tuning ({prefix}tuning.{key})"))
        else:
            valid = ", ".join(sorted([*ENGINE_CHECKS, "tuning"]))
            near = did_you_mean(key, [*ENGINE_CHECKS, "tuning"])
            problems.append(OptionProblem(path, f"unknown engine option{near}; valid: {valid}"))
    return values, problems


def check_option(name: str, value: Any, prefix: str = "") -> tuple[Any, list[OptionProblem]]:
    """One option by its dotted name (``max_num_seqs``, ``tuning.skinny_matmul_rows``): the value
    normalised, and its problems (an unknown name is one)."""
    values, problems = check_options(nest({name: value}), prefix)
    if problems:
        return value, problems
    if name.startswith("tuning."):
        return getattr(values["tuning"], name.split(".", 1)[1]), []
    return values[name], []


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted names made nested: ``{"tuning.skinny_fusion": "none"}`` -> ``{"tuning": {...}}``."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        head, dot, rest = name.partition(".")
        if dot:
            inner = out.get(head)
            out[head] = {**(dict(inner) if isinstance(inner, Mapping) else {}), **nest({rest: value})}
        else:
            out[name] = value
    return out


def with_option(options: Mapping[str, Any], name: str, value: Any) -> dict[str, Any]:
    """``options`` with the option at dotted ``name`` set to ``value`` (the rest of ``tuning`` kept)."""
    out = dict(options)
    head, dot, rest = name.partition(".")
    if not dot:
        out[name] = value
        return out
    inner = out.get(head)
    if isinstance(inner, Tuning):
        inner = dataclasses.asdict(inner)
    out[head] = with_option(inner if isinstance(inner, Mapping) else {}, rest, value)
    return out


def toggle_names() -> tuple[str, ...]:
    """The optimisation switches an ablation may flip by name alone."""
    return TOGGLES


def knob_names() -> tuple[str, ...]:
    """Every other option an ablation may vary, given its values (``NAME=A,B``); tuning knobs dotted."""
    engine = [name for name in ENGINE_CHECKS if name not in TOGGLES]
    return (*engine, *(f"tuning.{name}" for name in TUNING_CHECKS))


def flippable_knobs() -> tuple[str, ...]:
    """Tuning knobs that are on/off switches (their check takes true and false as they are): ``ablate
    --toggle tuning.NAME`` flips them like toggles."""
    return tuple(f"tuning.{name}" for name, check in TUNING_CHECKS.items() if _is_switch(check))


def _is_switch(check: Check) -> bool:
    try:
        return check(True) is True and check(False) is False
    except Invalid:
        return False


def _check_one(
    check: Check, value: Any, path: str, values: dict[str, Any], problems: list[OptionProblem], key: str
) -> None:
    try:
        values[key] = check(value)
    except Invalid as exc:
        problems.append(OptionProblem(path, str(exc)))


def _check_tuning(value: Any, prefix: str) -> tuple[dict[str, Any], list[OptionProblem]]:
    if isinstance(value, Tuning):
        value = dataclasses.asdict(value)
    if value is None:
        return {}, []
    if not isinstance(value, Mapping):
        knobs = ", ".join(TUNING_CHECKS)
        return {}, [
            OptionProblem(prefix.rstrip("."), f"expected a mapping of tuning knobs ({knobs}), got {value!r}")
        ]
    values: dict[str, Any] = {}
    problems: list[OptionProblem] = []
    for key, knob in value.items():
        if key in TUNING_CHECKS:
            _check_one(TUNING_CHECKS[key], knob, f"{prefix}{key}", values, problems, key)
        elif key in ENGINE_CHECKS:  # one level too deep: ``engine.tuning.cuda_graph``
            where = f"{prefix.removesuffix('tuning.')}{key}"
            problems.append(
                OptionProblem(
                    f"{prefix}{key}", f"an engine option: set it under engine ({where}), not tuning"
                )
            )
        else:
            problems.append(
                OptionProblem(
                    f"{prefix}{key}",
                    f"unknown tuning knob{did_you_mean(key, TUNING_CHECKS)}; valid: {', '.join(sorted(TUNING_CHECKS))}",
                )
            )
    return values, problems


def _tuning_from(value: Any) -> Tuning:
    values, problems = _check_tuning(value, "tuning.")
    if problems:
        raise ConfigError.listing(problems)
    return Tuning(**values)


def _check_fields(config: Any, checks: dict[str, Check], prefix: str) -> None:
    """A dataclass built directly (not through ``from_options``): its fields checked and normalised."""
    values: dict[str, Any] = {}
    problems: list[OptionProblem] = []
    for name, check in checks.items():
        _check_one(check, getattr(config, name), f"{prefix}{name}", values, problems, name)
    if problems:
        raise ConfigError.listing(problems)
    for name, value in values.items():
        object.__setattr__(config, name, value)
