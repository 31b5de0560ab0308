"""Engine options: one frozen dataclass, validated where it enters.

Every optimisation toggle of DESIGN.md is a field here with a real "off" path. ``None`` on a
device-dependent toggle means "the best choice for the device"; the resolved value (never ``None``)
is what the engine runs with and what results record. A toggle asked for explicitly on a device
that cannot honour it is an error that says why, never a silent no-op.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from llmbench.kernels import skinny_matmul

ATTENTION_BACKENDS = ("torch", "sdpa", "triton", "flash_attn")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class ConfigError(ValueError):
    """An engine option is unknown, out of range, or cannot apply on the chosen device."""


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def flash_attn_available() -> bool:
    for name in ("flash_attn.cute", "flash_attn"):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def triton_usable(device: str) -> bool:
    """Triton runs on CUDA, or anywhere under its interpreter (TRITON_INTERPRET=1)."""
    import os

    if not triton_available():
        return False
    return device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class EngineConfig:
    model: str = "qwen3-tiny"
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0

    # toggles
    paged_kv: bool = True
    prefix_cache: bool | None = None
    continuous_batching: bool = True
    chunked_prefill: bool = True
    attention_backend: str | None = None
    triton_kernels: bool | None = None
    torch_compile: bool = False
    compile_mode: str = "default"
    cuda_graph: bool | None = None
    cuda_graph_buckets: tuple[int, ...] | None = None
    tp: int = 1
    # Schedule and launch step N+1 before reading step N's tokens; None: on for CUDA, off on the CPU
    # (where host and "device" are the same cores, nothing overlaps).
    async_scheduling: bool | None = None
    # KV cache element type: "auto" (the model dtype) or a float8 format, quantised on store and dequantised
    # on load with one scale per layer and KV head (kernels/kv_quant.py).
    kv_cache_dtype: str = "auto"
    # float8 caches: None sets the scales from the first prefill's K/V (with headroom), a number fixes
    # every scale to it (stored value = real value / scale).
    kv_cache_scale: float | None = None

    # memory and batch knobs
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None  # bytes; the CPU budget for the KV pool
    num_kv_blocks: int | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    # Triton decode attention: cut contexts into slices of this many tokens (a multiple of 64), which
    # evens out batches of mixed lengths; None: equal slices per sequence, chosen from the batch shape.
    decode_split_tokens: int | None = None
    # Tensor parallelism: "nccl" (torch.distributed), "symm_mem" (one-shot over NVLink for small
    # messages, NCCL for the rest; CUDA, one host: engine/symm_all_reduce.py) or "auto" (symm_mem where
    # it applies, nccl elsewhere; the engine records the one it used in its startup stats).
    tp_all_reduce: str = "auto"
    # Linear layers: inputs of up to this many rows (decode at small batches) take the skinny Triton
    # matmul (kernels/skinny_matmul.py), larger ones cuBLAS; 0: cuBLAS always. None: the default from the
    # H200 sweep with triton_kernels, 0 without.
    skinny_matmul_rows: int | None = None
    # What the skinny matmul does on its input's loads: "all" (the RMSNorm before it, with the residual
    # add, and the SiLU-and-multiply before the down projection), "silu" (the latter only), "none", or
    # "auto": "all" for hidden sizes up to 2048, "silu" above (models/llama.py; numbers in BENCHMARKS.md).
    skinny_fusion: str = "auto"
    # tp > 1: each all-reduce of a decode step done together with the RMSNorm after it, in one Triton
    # kernel over symmetric memory (kernels/allreduce_norm.py); None: wherever it can apply.
    tp_fuse_norm: bool | None = None
    # tp > 1, with tp_fuse_norm: at one-row decode steps each row-parallel product (o_proj, down_proj) sums
    # itself over the ranks in its own kernel, each rank writing its partial sums into every rank's
    # memory, and the norm after it is done on the next product's loads
    # (kernels/skinny_allreduce.py). None: wherever it can apply.
    tp_fuse_matmul: bool | None = None
    # Programmatic dependent launch of the decode step's Triton kernels (Hopper and later): each may start
    # while the one before runs; the skinny matmul prefetches its weights into L2 meanwhile
    # (kernels/_triton.py). Off unless asked for.
    pdl: bool = False

    @classmethod
    def from_options(cls, model: str, **options: Any) -> EngineConfig:
        known = {f.name for f in dataclasses.fields(cls)} - {"model"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(
                f"Unknown engine option(s): {', '.join(unknown)}. Valid options: {', '.join(sorted(known))}"
            )
        if options.get("cuda_graph_buckets") is not None:
            options["cuda_graph_buckets"] = tuple(int(b) for b in options["cuda_graph_buckets"])
        return cls(model=model, **options).resolved()

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def resolved(self) -> EngineConfig:
        """Fill every ``None``/``auto`` from the device and check that the combination can run."""
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if not (device == "cpu" or device.startswith("cuda")):
            raise ConfigError(f"Unsupported device: {device!r}. Supported: ['auto', 'cpu', 'cuda', 'cuda:N']")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} was asked for, but torch sees no CUDA device")
        cuda = device.startswith("cuda")

        dtype = self.dtype
        if dtype == "auto":
            dtype = "bfloat16" if cuda else "float32"
        if dtype not in DTYPES:
            raise ConfigError(f"Unsupported dtype: {dtype!r}. Supported: {['auto', *DTYPES]}")

        backend = self.attention_backend
        if backend is None:
            backend = "triton" if cuda and triton_available() else ("sdpa" if not cuda else "torch")
        if backend not in ATTENTION_BACKENDS:
            raise ConfigError(
                f"Unsupported attention backend: {backend!r}. Supported: {list(ATTENTION_BACKENDS)}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"Unsupported kv_cache_dtype: {self.kv_cache_dtype!r}. Supported: {list(KV_CACHE_DTYPES)}"
            )
        if self.kv_cache_dtype != "auto" and backend == "flash_attn":
            raise ConfigError(
                f"kv_cache_dtype={self.kv_cache_dtype!r} stores float8 K/V, which the flash_attn backend cannot "
                "read: choose attention_backend 'triton', 'sdpa' or 'torch', or kv_cache_dtype='auto'"
            )
        if self.kv_cache_scale is not None:
            if self.kv_cache_dtype == "auto":
                raise ConfigError(
                    "kv_cache_scale sets the scales of a float8 KV cache: it needs kv_cache_dtype "
                    f"{' or '.join(repr(d) for d in KV_CACHE_DTYPES[1:])}"
                )
            if not self.kv_cache_scale > 0:
                raise ConfigError(f"kv_cache_scale must be a positive number, got {self.kv_cache_scale}")
        if backend == "triton" and not triton_usable(device):
            raise ConfigError(
                "attention_backend='triton' needs the triton package and a CUDA device "
                "(or TRITON_INTERPRET=1 to run its kernels on the CPU, slowly)"
            )
        if backend == "flash_attn" and dtype not in ("float16", "bfloat16"):
            raise ConfigError(
                f"attention_backend='flash_attn' runs in float16 or bfloat16 only (flash-attn has no {dtype} "
                "kernels): set dtype='bfloat16' or choose another attention backend"
            )
        if backend == "flash_attn":
            if not cuda:
                raise ConfigError("attention_backend='flash_attn' needs a CUDA device")
            if not flash_attn_available():
                raise ConfigError(
                    "attention_backend='flash_attn' needs flash-attn installed (pip install 'llmbench[flash]'); "
                    "available here: torch, sdpa" + (", triton" if triton_available() else "")
                )
            if not self.paged_kv:
                raise ConfigError(
                    "attention_backend='flash_attn' reads a paged KV cache: it needs paged_kv=True"
                )

        triton_kernels = self.triton_kernels
        if triton_kernels is None:
            triton_kernels = cuda and triton_available()
        if triton_kernels and not triton_usable(device):
            raise ConfigError(
                "triton_kernels=True needs the triton package and a CUDA device (or TRITON_INTERPRET=1 on the CPU)"
            )

        cuda_graph = self.cuda_graph
        if cuda_graph is None:
            cuda_graph = cuda and backend in ("triton", "flash_attn")
        if cuda_graph and not cuda:
            raise ConfigError("cuda_graph=True needs a CUDA device: CUDA Graphs cannot run on the CPU")
        if cuda_graph and backend not in ("triton", "flash_attn"):
            raise ConfigError(
                f"cuda_graph=True needs a graph-safe attention backend ('triton' or 'flash_attn'), got {backend!r}"
            )

        prefix_cache = self.prefix_cache
        if prefix_cache is None:
            prefix_cache = self.paged_kv
        if prefix_cache and not self.paged_kv:
            raise ConfigError("prefix_cache=True shares KV blocks between requests: it needs paged_kv=True")

        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(
                f"Unsupported compile_mode: {self.compile_mode!r}. Supported: {list(COMPILE_MODES)}"
            )
        if self.block_size < 1 or (
            backend in ("triton", "flash_attn") and self.block_size & (self.block_size - 1)
        ):
            raise ConfigError(f"block_size must be a positive power of two, got {self.block_size}")
        if self.decode_split_tokens is not None:
            if self.decode_split_tokens < 1 or self.decode_split_tokens % 64:
                raise ConfigError(
                    f"decode_split_tokens must be a positive multiple of 64, got {self.decode_split_tokens}"
                )
            if backend != "triton":
                raise ConfigError(
                    f"decode_split_tokens tunes the Triton decode kernel: it needs attention_backend='triton', "
                    f"got {backend!r}"
                )
        skinny_rows = self.skinny_matmul_rows
        if skinny_rows is None:
            skinny_rows = SKINNY_MATMUL_ROWS if triton_kernels else 0
        elif not 0 <= skinny_rows <= skinny_matmul.MAX_ROWS:
            raise ConfigError(f"skinny_matmul_rows must be in 0..{skinny_matmul.MAX_ROWS}, got {skinny_rows}")
        elif skinny_rows and not triton_kernels:
            raise ConfigError(
                f"skinny_matmul_rows={skinny_rows} asks for a Triton kernel: it needs triton_kernels=True "
                "(or skinny_matmul_rows=0)"
            )
        if self.skinny_fusion not in SKINNY_FUSIONS:
            raise ConfigError(
                f"Unsupported skinny_fusion: {self.skinny_fusion!r}. Supported: {list(SKINNY_FUSIONS)}"
            )
        if self.skinny_fusion in ("all", "silu") and not skinny_rows:
            raise ConfigError(
                f"skinny_fusion={self.skinny_fusion!r} fuses into the skinny matmul, which is off "
                "(skinny_matmul_rows=0 or triton_kernels=False)"
            )
        if self.tp_all_reduce not in TP_ALL_REDUCE:
            raise ConfigError(
                f"Unsupported tp_all_reduce: {self.tp_all_reduce!r}. Supported: {list(TP_ALL_REDUCE)}"
            )
        if self.tp_all_reduce == "symm_mem" and not (cuda and self.tp > 1):
            raise ConfigError(
                "tp_all_reduce='symm_mem' reads the other GPUs' memory over NVLink: it needs tp > 1 on CUDA "
                f"devices (got tp={self.tp} on {device!r})"
            )
        fuse_norm = self.tp_fuse_norm
        missing = _unmet(
            ("tp > 1", self.tp > 1),
            ("a CUDA device", cuda),
            ("triton_kernels=True", triton_kernels),
            ("tp_all_reduce 'symm_mem' or 'auto'", self.tp_all_reduce != "nccl"),
            ("torch_compile=False", not self.torch_compile),
            (
                "skinny_fusion other than 'all' (that fuses the norms into the matmuls)",
                self.skinny_fusion != "all",
            ),
        )
        if fuse_norm is None:
            fuse_norm = not missing
        elif fuse_norm and missing:
            raise ConfigError(
                "tp_fuse_norm=True does each tensor-parallel all-reduce with the RMSNorm after it in one "
                f"Triton kernel over the GPUs' shared memory: it needs {', '.join(missing)}"
            )
        fuse_matmul = self.tp_fuse_matmul
        missing = _unmet(
            ("tp_fuse_norm (the all-reduce fused with the norm, and what that needs)", bool(fuse_norm)),
            ("skinny_matmul_rows >= 1 (the skinny matmul, whose kernel it extends)", skinny_rows >= 1),
            ("pdl=False", not self.pdl),
        )
        if fuse_matmul is None:
            fuse_matmul = not missing
        elif fuse_matmul and missing:
            raise ConfigError(
                "tp_fuse_matmul=True sums each row-parallel product of a one-row decode step over the GPUs "
                f"in the product's own kernel: it needs {', '.join(missing)}"
            )
        if self.pdl:
            from llmbench.kernels._triton import pdl_supported

            why = _unmet(
                ("a CUDA device", cuda),
                ("triton_kernels=True", triton_kernels),
                ("torch_compile=False", not self.torch_compile),
            )
            if why:
                raise ConfigError(
                    "pdl=True launches the decode step's Triton kernels with programmatic dependent launch: "
                    f"it needs {', '.join(why)}"
                )
            unsupported = pdl_supported()
            if unsupported is None and torch.cuda.get_device_capability(device)[0] < 9:
                unsupported = (
                    f"{torch.cuda.get_device_name(device)} is older than Hopper (compute capability 9.0)"
                )
            if unsupported:
                raise ConfigError(f"pdl=True cannot apply here: {unsupported}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "tp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ConfigError(f"num_kv_blocks must be at least 1, got {self.num_kv_blocks}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if self.cuda_graph_buckets is not None and (
            not self.cuda_graph_buckets or min(self.cuda_graph_buckets) < 1
        ):
            raise ConfigError(
                f"cuda_graph_buckets must be positive batch sizes, got {self.cuda_graph_buckets}"
            )

        return dataclasses.replace(
            self,
            device=device,
            dtype=dtype,
            attention_backend=backend,
            triton_kernels=bool(triton_kernels),
            cuda_graph=bool(cuda_graph),
            prefix_cache=bool(prefix_cache),
            async_scheduling=cuda if self.async_scheduling is None else bool(self.async_scheduling),
            skinny_matmul_rows=skinny_rows,
            tp_fuse_norm=bool(fuse_norm),
            tp_fuse_matmul=bool(fuse_matmul),
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["cuda_graph_buckets"] is not None:
            d["cuda_graph_buckets"] = list(d["cuda_graph_buckets"])
        return d


def _unmet(*conditions: tuple[str, bool]) -> list[str]:
    """The names of the (name, met) conditions not met, in order: what an error says is missing."""
    return [name for name, met in conditions if not met]


TP_ALL_REDUCE = ("nccl", "symm_mem", "auto")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
SKINNY_FUSIONS = ("auto", "all", "silu", "none")
SKINNY_MATMUL_ROWS = 1  # where the skinny kernel beat cuBLAS on every layer of the H200 sweep


def toggle_names() -> tuple[str, ...]:
    """The optimisation switches an ablation may flip."""
    return (
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
        "tp_fuse_norm",
        "tp_fuse_matmul",
        "pdl",
    )
