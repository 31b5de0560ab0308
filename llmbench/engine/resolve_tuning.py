"""The tuning knobs' choices (``Tuning`` -> ``ResolvedTuning``), given the toggles they tune: ``resolve``
(``resolve.py``) decides the toggles and hands them here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from llmbench.engine.config import DEFAULT_COMPILE_MODE, ConfigError, EngineConfig, Tuning
from llmbench.engine.facts import Facts
from llmbench.engine.option_checks import AUTO

# The skinny matmul by default: at one row wherever Triton kernels run (it beat cuBLAS on every layer of
# the H200 sweep); up to as many rows as programmatic launch covers, at most SKINNY_MATMUL_ROWS, at tp=1
# and hidden sizes up to SKINNY_ROWS_MAX_HIDDEN, the cases measured on an H200 (BENCHMARKS.md, "The skinny
# matmul at a few rows"): on qwen3-0.6b (hidden size 1024) a decode step of 8, 16, 32 and 64 sequences
# takes 11%, 13%, 4.5% and 3% less time than with cuBLAS's products; on qwen3-8b (4096) one of 16 and 64
# sequences 2.5% and 6% more; in between (2048: qwen3-1.7b) it is not measured, so one row.
SKINNY_MATMUL_ROWS = 64  # by default; the kernel takes up to SKINNY_MATMUL_MAX_ROWS
SKINNY_ROWS_MAX_HIDDEN = 1024
# skinny_fusion "auto" fuses the RMSNorms into the matmul up to this hidden size: each program of the
# fused kernel sums the whole row's squares for itself, which paid at hidden size 1024 (qwen3-0.6b, -2.7%
# per token on an H200) and cost at 4096 (qwen3-8b, +1.6%).
NORM_FUSION_MAX_HIDDEN = 2048
# Programmatic dependent launch up to this many rows: on an H200 (BENCHMARKS.md, "Programmatic dependent
# launch") it shortens a one-sequence decode step by about 8% and changes nothing measurable on its own at
# 8 or 64 rows or on the nano-vllm workload, launched so up to 128 or 256 rows; the skinny matmul's
# tensor-core products need it to beat cuBLAS's (above), so it covers the rows those take.
PROGRAMMATIC_LAUNCH_ROWS = 64
# The Triton prefill kernel's 64-row tiles up to this longest query (tokens): on an H200 they are as fast
# as the 128-row ones or faster wherever the longest query is at most 1,024 tokens, slower from 4,096
# (BENCHMARKS.md, "The prefill kernel on the workload's prompt steps").
PREFILL_NARROW_TILES_UP_TO = 1024


T = TypeVar("T")


class Problems:
    """The contradictions ``resolve`` finds, gathered so that one ConfigError names them all, one a line,
    in the order found: ``resolve`` checks the root causes (the device, what the attention backend needs)
    before what depends on them."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, message: str) -> None:
        if message not in self.found:
            self.found.append(message)

    def check(self, step: Callable[..., T], *args: Any, fallback: T) -> T:
        """``step(*args)``; where it raises ConfigError, its message kept and ``fallback`` returned, so that
        the checks after it still run."""
        try:
            return step(*args)
        except ConfigError as exc:
            self.add(str(exc))
            return fallback

    def raise_any(self) -> None:
        if self.found:
            raise ConfigError("\n".join(self.found))


@dataclass(frozen=True)
class ResolvedTuning:
    """``Tuning`` with every choice made (see its docstring for the meanings)."""

    cuda_graph_buckets: tuple[int, ...]  # () when cuda_graph is off
    decode_split_tokens: int  # 0: equal slices per sequence, chosen per step
    decode_longest_first: bool
    decode_uniform_tiling: bool
    mixed_step_decodes: bool
    graph_sampling: bool
    prefill_graphs: bool
    prefill_graph_tokens: tuple[int, ...]  # () when prefill_graphs is off
    prefill_narrow_tiles_up_to: int  # 0: wide tiles wherever the queries fill them
    programmatic_launch_rows: int  # 0: never
    skinny_matmul_rows: int  # 0: cuBLAS always
    skinny_fusion: str  # "all" | "silu" | "none"
    tp_all_reduce: str  # "nccl" | "gloo" (torch.distributed's: 'nccl' asked on the CPU) | "symm_mem" | "none"
    tp_fuse_norm: bool
    tp_fuse_matmul: bool
    compile_mode: str
    # a float8 KV cache's fixed scale; None: set per layer and head from the first prefill (a measurement,
    # like the KV pool's size)
    kv_cache_scale: float | None


def resolve_tuning(
    config: EngineConfig,
    facts: Facts,
    problems: Problems,
    *,
    device: str,
    backend: str,
    triton_kernels: bool,
    cuda_graph: bool,
) -> ResolvedTuning:
    """The tuning knobs, given the toggles they tune; each knob that cannot apply added to ``problems``."""
    t: Tuning = config.tuning
    cuda = device.startswith("cuda")
    programmatic_rows = problems.check(
        _programmatic_rows, t.programmatic_launch_rows, config, facts, cuda, triton_kernels, fallback=0
    )
    several = config.tp == 1 and programmatic_rows > 1 and facts.model.hidden_size <= SKINNY_ROWS_MAX_HIDDEN
    rows_default = min(programmatic_rows, SKINNY_MATMUL_ROWS) if several else 1
    skinny_rows = auto(t.skinny_matmul_rows, rows_default if triton_kernels else 0)
    if skinny_rows and not triton_kernels:
        problems.add(
            f"tuning.skinny_matmul_rows={skinny_rows} asks for a Triton kernel: it needs triton_kernels=True "
            "(or tuning.skinny_matmul_rows=0)"
        )
        skinny_rows = 0
    for knob, kernel in (("decode_split_tokens", "decode"), ("prefill_narrow_tiles_up_to", "prefill")):
        if getattr(t, knob) is not None and backend != "triton":
            problems.add(
                f"tuning.{knob} tunes the Triton {kernel} kernel: it needs attention_backend='triton', "
                f"got {backend!r}"
            )

    def switch(asked: bool | None, what: str, *needs: tuple[str, bool]) -> bool:
        return problems.check(decide_switch, asked, what, *needs, fallback=False)

    longest_first = switch(
        t.decode_longest_first,
        "tuning.decode_longest_first=True orders the Triton decode kernel's work",
        ("attention_backend 'triton'", backend == "triton"),
    )
    uniform_tiling = switch(
        t.decode_uniform_tiling,
        "tuning.decode_uniform_tiling=True picks the Triton decode kernel's tiling by the batch's lengths",
        ("attention_backend 'triton'", backend == "triton"),
    )
    mixed_decodes = switch(
        t.mixed_step_decodes,
        "tuning.mixed_step_decodes=True attends a mixed step's decodes with the Triton decode kernel",
        ("attention_backend 'triton'", backend == "triton"),
    )
    graph_sampling = switch(
        t.graph_sampling,
        "tuning.graph_sampling=True draws decode steps' tokens inside their CUDA Graphs",
        ("cuda_graph=True", cuda_graph),
        ("triton_kernels=True (the draw is a Triton kernel)", triton_kernels),
    )
    prefill_graphs = switch(
        t.prefill_graphs,
        "tuning.prefill_graphs=True runs prefill and mixed steps from CUDA Graphs cut at attention",
        ("cuda_graph=True", cuda_graph),
        ("triton_kernels=True (the pieces end in the fused attention prologue)", triton_kernels),
        ("attention_backend 'triton' or 'flash_attn'", backend in ("triton", "flash_attn")),
        ("tp=1", config.tp == 1),
        ("torch_compile=False", not config.torch_compile),
    )
    fallback = "none" if config.tp == 1 else ("nccl" if cuda else "gloo")
    all_reduce = problems.check(_all_reduce, t.tp_all_reduce, config.tp, device, facts, fallback=fallback)
    fuse_norm = switch(
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
    fuse_matmul = switch(
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
        problems.add(
            f"tuning.skinny_fusion={fusion!r} fuses into the skinny matmul, which is off "
            "(tuning.skinny_matmul_rows=0 or triton_kernels=False)"
        )
    _unused(
        problems,
        (
            "tuning.cuda_graph_buckets sets the batch sizes that get a decode CUDA Graph",
            bool(t.cuda_graph_buckets) and not cuda_graph,
            "cuda_graph=True",
        ),
        (
            "tuning.prefill_graph_tokens sets the token counts that get a prefill graph",
            bool(t.prefill_graph_tokens) and not prefill_graphs,
            "tuning.prefill_graphs (and what it needs)",
        ),
        (
            f"tuning.compile_mode={t.compile_mode!r} sets how torch.compile compiles",
            t.compile_mode != AUTO and not config.torch_compile,
            "torch_compile=True",
        ),
        (
            f"tuning.compile_mode={t.compile_mode!r} replays CUDA Graphs (on the CPU: default, max-autotune "
            "or max-autotune-no-cudagraphs)",
            t.compile_mode == "reduce-overhead" and config.torch_compile and not cuda,
            "a CUDA device",
        ),
        (
            f"tuning.cuda_graph_buckets={list(t.cuda_graph_buckets or ())} has batches larger than "
            f"max_num_seqs={config.max_num_seqs}, which no decode step reaches",
            cuda_graph and max(t.cuda_graph_buckets or (0,)) > config.max_num_seqs,
            f"every bucket <= {config.max_num_seqs}",
        ),
        (
            f"tuning.prefill_graph_tokens={list(t.prefill_graph_tokens or ())} has counts larger than "
            f"max_num_batched_tokens={config.max_num_batched_tokens}, which no step reaches",
            prefill_graphs and max(t.prefill_graph_tokens or (0,)) > config.max_num_batched_tokens,
            f"every count <= {config.max_num_batched_tokens}",
        ),
    )
    buckets = t.cuda_graph_buckets or default_buckets(config.max_num_seqs)
    return ResolvedTuning(
        cuda_graph_buckets=tuple(sorted(set(buckets))) if cuda_graph else (),
        decode_split_tokens=auto(t.decode_split_tokens, 0),
        decode_longest_first=longest_first,
        decode_uniform_tiling=uniform_tiling,
        mixed_step_decodes=mixed_decodes,
        graph_sampling=graph_sampling,
        prefill_graphs=prefill_graphs,
        prefill_graph_tokens=(
            tuple(sorted(set(t.prefill_graph_tokens or prefill_buckets(config.max_num_batched_tokens))))
            if prefill_graphs
            else ()
        ),
        prefill_narrow_tiles_up_to=auto(
            t.prefill_narrow_tiles_up_to, PREFILL_NARROW_TILES_UP_TO if backend == "triton" else 0
        ),
        programmatic_launch_rows=programmatic_rows,
        skinny_matmul_rows=skinny_rows,
        skinny_fusion=fusion,
        tp_all_reduce=all_reduce,
        tp_fuse_norm=fuse_norm,
        tp_fuse_matmul=fuse_matmul,
        compile_mode=auto(t.compile_mode, DEFAULT_COMPILE_MODE),
        kv_cache_scale=t.kv_cache_scale,
    )


def default_buckets(max_num_seqs: int) -> list[int]:
    """CUDA Graph batch sizes: fine steps where padding would cost most (small batches), then every 16."""
    small = [b for b in (1, 2, 4, 8) if b <= max_num_seqs]
    return sorted(set(small + list(range(16, max_num_seqs + 1, 16)) + [max_num_seqs]))


def prefill_buckets(max_tokens: int) -> list[int]:
    """Token counts of prefill and mixed steps that get CUDA Graphs: powers of two from 16 up to the
    per-step token budget, and the budget (a prefill phase's full steps fill it exactly)."""
    return sorted({b for b in (16 << k for k in range(32)) if b < max_tokens} | {max_tokens})


def auto(asked: Any, default: Any) -> Any:
    """What was asked for, or ``default`` where it was left to the engine (None or "auto")."""
    return default if asked is None or asked == AUTO else asked


def _unused(problems: Problems, *knobs: tuple[str, bool, str]) -> None:
    """A knob set for a feature that is off would change nothing: an error naming what it needs, rather
    than a value silently ignored. ``knobs``: (what it does, whether it is set in vain, what it needs)."""
    for what, in_vain, needs in knobs:
        if in_vain:
            problems.add(f"{what}: it needs {needs}")


def decide_switch(asked: bool | None, what: str, *needs: tuple[str, bool]) -> bool:
    """An automatic switch: on where all it needs is there; asked for where something is missing, an
    error naming each missing condition in order."""
    missing = [name for name, met in needs if not met]
    if asked is None:
        return not missing
    if asked and missing:
        raise ConfigError(f"{what}: it needs {', '.join(missing)}")
    return asked


def _programmatic_rows(
    asked: int | None, config: EngineConfig, facts: Facts, cuda: bool, triton_kernels: bool
) -> int:
    """Programmatic dependent launch up to PROGRAMMATIC_LAUNCH_ROWS rows where it can apply; asked for
    where it cannot, an error naming what is missing."""
    on = decide_switch(
        None if asked is None or asked == AUTO else asked > 0,
        f"tuning.programmatic_launch_rows={asked} launches Triton kernels with programmatic dependent launch",
        (
            "an NVIDIA GPU of compute capability 9.0 or later",
            cuda and not facts.rocm and (facts.capability or (0, 0)) >= (9, 0),
        ),
        ("triton_kernels=True", triton_kernels),
        ("torch_compile=False", not config.torch_compile),
        ("a Triton with grid dependency control (3.4 or later)", facts.triton_gdc),
    )
    return auto(asked, PROGRAMMATIC_LAUNCH_ROWS) if on else 0


def _all_reduce(asked: str, tp: int, device: str, facts: Facts) -> str:
    """ "none" at tp=1; the one-shot "symm_mem" where the ranks can share GPU memory; otherwise
    torch.distributed's collective, named by what runs it: "nccl" on GPUs, "gloo" on the CPU."""
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
    if asked == "nccl" and tp == 1:
        raise ConfigError(
            "tuning.tp_all_reduce='nccl' is how tensor-parallel ranks sum their partial results: it needs "
            "tp > 1 (got tp=1, one rank, nothing to sum); leave it 'auto'"
        )
    if tp == 1:
        return "none"
    if asked != "nccl" and cuda and facts.ranks_share_memory:
        return "symm_mem"
    return "nccl" if cuda else "gloo"
