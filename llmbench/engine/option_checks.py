"""What each engine option accepts: its type, range or choices, and the message that says so.

A check takes the value as given (from Python, or parsed from YAML) and returns it normalised (``auto``
-> None where None means "decided by the engine", a list of buckets -> a tuple) or raises ``Invalid``
with what is allowed: ``expected an integer >= 1, got 'abc'``, ``unsupported 'float13'; supported: ...``.
``engine/config.py`` applies them (``check_options``); ``resolve`` checks combinations.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

AUTO = "auto"
ATTENTION_BACKENDS = ("torch", "sdpa", "triton", "flash_attn")
DTYPES = ("float32", "float16", "bfloat16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
TP_ALL_REDUCE = ("nccl", "symm_mem")
SKINNY_FUSIONS = ("all", "silu", "none")
KV_CACHE_DTYPES = ("fp8_e4m3", "fp8_e5m2")  # besides auto (the model's dtype): kernels/kv_quant.py
SKINNY_MATMUL_MAX_ROWS = 256  # kernels/skinny_matmul.py MAX_ROWS: larger inputs always go to cuBLAS
DECODE_SPLIT_MULTIPLE = 64  # kernels/decode_config.py: SLICE_TILE, whole tiles of 64 tokens


class Invalid(Exception):
    """A value that does not fit its option; the message says what is allowed."""


Check = Callable[[Any], Any]  # the value normalised, or Invalid


def _is_auto(value: Any) -> bool:
    return value is None or value == AUTO


def _boolean(auto: bool = False) -> Check:
    allowed = "true, false or auto" if auto else "true or false"

    def check(value: Any) -> Any:
        if isinstance(value, bool):
            return value
        if auto and _is_auto(value):
            return None
        raise Invalid(f"expected {allowed}, got {value!r}")

    return check


MAX_BLOCK_SIZE = 1 << 16  # tokens a KV block: past any context a block could usefully page
MAX_NUM_SEQS = 1 << 20  # sequences in flight: past what any pool holds (and the graph buckets list)
MAX_TOKENS = 1 << 24  # tokens of a context or a step: past any model's positions and any step's memory
MAX_KV_BLOCKS = (1 << 31) - 1  # the block tables hold int32 block ids
MAX_BYTES = 1 << 50  # a KV budget: a pebibyte, past any machine's memory


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(low: int, high: int | None = None, auto: bool = False) -> Check:
    allowed = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
    if auto:
        allowed += " or auto"

    def check(value: Any) -> Any:
        if auto and _is_auto(value):
            return None
        if isinstance(value, float) and value.is_integer():  # 1e9, as YAML writes a large count
            value = int(value)
        if not _is_int(value) or value < low or (high is not None and value > high):
            raise Invalid(f"expected {allowed}, got {value!r}")
        return value

    return check


_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?(?:e\d+)?)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)


def _byte_size(value: Any) -> Any:
    """Bytes as a count (1e9 too) or a size with its unit: ``512MiB``, ``4 GiB``, ``1.5GB`` (KB, MB, GB, TB
    are powers of 1000; KiB, MiB, GiB, TiB of 1024)."""
    if _is_auto(value):
        return None
    count = value
    if isinstance(value, str) and (m := _SIZE.fullmatch(value)):
        unit = (m[2] or "").lower()
        if unit:  # a size: the nearest byte (4.1GB is 4.1 * 1e9 to the float's last bit)
            count = round(float(m[1]) * (1024 if unit.endswith("i") else 1000) ** ("kmgt".index(unit[0]) + 1))
        else:
            count = float(m[1])
    if isinstance(count, float) and count.is_integer():
        count = int(count)
    if not _is_int(count) or not 1 <= count <= MAX_BYTES:
        raise Invalid(
            f"expected a number of bytes (an integer in 1..{MAX_BYTES:,} (1 PiB), or a size such as 512MiB "
            f"or 4GB) or auto, got {value!r}"
        )
    return count


def _fraction(value: Any) -> Any:
    if _is_auto(value):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise Invalid(f"expected a number in (0, 1] or auto, got {value!r}")
    return float(value)


def _positive_number(auto: bool = False) -> Check:
    allowed = "a finite number > 0" + (" or auto" if auto else "")

    def check(value: Any) -> Any:
        if auto and _is_auto(value):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise Invalid(f"expected {allowed}, got {value!r}")
        return float(value)

    return check


def _choice(options: tuple[str, ...], auto: bool = False) -> Check:
    allowed = (AUTO, *options) if auto else options

    def check(value: Any) -> Any:
        if auto and value is None:
            return AUTO
        if not isinstance(value, str) or value not in allowed:
            raise Invalid(f"unsupported {value!r}; supported: {', '.join(allowed)}")
        return value

    return check


_CUDA_DEVICE = re.compile(r"^cuda(:\d+)?$")


def _device(value: Any) -> Any:
    if value is None:
        return AUTO
    if not isinstance(value, str) or not (value in (AUTO, "cpu") or _CUDA_DEVICE.match(value)):
        raise Invalid(f"unsupported {value!r}; supported: auto, cpu, cuda, cuda:N")
    return value


def _decode_split(value: Any) -> Any:
    if _is_auto(value):
        return None
    if not _is_int(value) or not 0 <= value <= MAX_TOKENS or value % DECODE_SPLIT_MULTIPLE:
        raise Invalid(
            f"expected 0 (slices chosen per step), a positive multiple of {DECODE_SPLIT_MULTIPLE} up to "
            f"{MAX_TOKENS:,}, or auto, got {value!r}"
        )
    return value


def _sizes(what: str, high: int) -> Check:
    """A list of ``what`` (integers in 1..high), or auto (None)."""

    def check(value: Any) -> Any:
        if _is_auto(value):
            return None
        if isinstance(value, (list, tuple)) and value and all(_is_int(b) and 1 <= b <= high for b in value):
            return tuple(value)
        raise Invalid(f"expected a list of {what} (integers in 1..{high:,}) or auto, got {value!r}")

    return check


ENGINE_CHECKS: dict[str, Check] = {
    "device": _device,
    "dtype": _choice(DTYPES, auto=True),
    "seed": _integer(0, 2**63 - 1),  # packed into a signed 64-bit integer on the device
    "paged_kv": _boolean(),
    "prefix_cache": _boolean(auto=True),
    "continuous_batching": _boolean(),
    "chunked_prefill": _boolean(),
    "attention_backend": _choice(ATTENTION_BACKENDS, auto=True),
    "triton_kernels": _boolean(auto=True),
    "torch_compile": _boolean(),
    "cuda_graph": _boolean(auto=True),
    "async_scheduling": _boolean(auto=True),
    "tp": _integer(1, 1024),
    "kv_cache_dtype": _choice(KV_CACHE_DTYPES, auto=True),
    "gpu_memory_utilization": _fraction,
    "kv_cache_memory": _byte_size,
    "num_kv_blocks": _integer(1, MAX_KV_BLOCKS, auto=True),
    "block_size": _integer(1, MAX_BLOCK_SIZE),
    "max_num_seqs": _integer(1, MAX_NUM_SEQS),
    "max_num_batched_tokens": _integer(1, MAX_TOKENS),
    "max_model_len": _integer(2, MAX_TOKENS, auto=True),
}

TUNING_CHECKS: dict[str, Check] = {
    "cuda_graph_buckets": _sizes("batch sizes", MAX_NUM_SEQS),
    "decode_split_tokens": _decode_split,
    "decode_longest_first": _boolean(auto=True),
    "decode_uniform_tiling": _boolean(auto=True),
    "mixed_step_decodes": _boolean(auto=True),
    "graph_sampling": _boolean(auto=True),
    "prefill_graphs": _boolean(auto=True),
    "prefill_graph_tokens": _sizes("token counts", MAX_TOKENS),
    "prefill_narrow_tiles_up_to": _integer(0, MAX_TOKENS, auto=True),
    "programmatic_launch_rows": _integer(0, MAX_NUM_SEQS, auto=True),
    "skinny_matmul_rows": _integer(0, SKINNY_MATMUL_MAX_ROWS, auto=True),
    "skinny_fusion": _choice(SKINNY_FUSIONS, auto=True),
    "tp_all_reduce": _choice(TP_ALL_REDUCE, auto=True),
    "tp_fuse_norm": _boolean(auto=True),
    "tp_fuse_matmul": _boolean(auto=True),
    "compile_mode": _choice(COMPILE_MODES, auto=True),
    "kv_cache_scale": _positive_number(auto=True),
}
