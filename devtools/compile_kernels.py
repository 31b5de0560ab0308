"""Compile every Triton kernel of llmbench.kernels for an NVIDIA GPU, on any machine, with no GPU.

The CPU interpreter (TRITON_INTERPRET=1) runs a kernel's Python line by line, so it lets through what
only the compiler checks: a variable that an ``if`` block redefines with another shape, a constexpr
used as a runtime value, a layout the backend cannot lower. This script calls each kernel's wrapper on
CPU tensors of the engine's real shapes with the launches intercepted, then compiles every distinct
launch (same signature, constexprs and launch options) through Triton's whole pipeline, down to a
cubin for the target (ptxas ships with Triton), without running anything.

    python devtools/compile_kernels.py               # sm_90 (H100/H200), bf16, float32, fp16; exit 1 on a failure
    python devtools/compile_kernels.py --arch 100 --dtype bf16   # another compute capability, one dtype
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, not interpreted ones: before triton loads
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 is its default

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

try:
    import triton  # noqa: E402
    from triton.backends.compiler import GPUTarget  # noqa: E402
    from triton.compiler import ASTSource  # noqa: E402
    from triton.runtime.jit import JITFunction  # noqa: E402
except ImportError:  # pragma: no cover - the CLI says so below
    triton = None

from llmbench.kernels import _triton, triton_decode  # noqa: E402
from llmbench.kernels import sample as sample_module  # noqa: E402
from llmbench.kernels._triton import runs_ptx  # noqa: E402
from llmbench.kernels.activation import silu_and_mul  # noqa: E402
from llmbench.kernels.allreduce_norm import allreduce_norm  # noqa: E402
from llmbench.kernels.attention_prologue import attention_prologue  # noqa: E402
from llmbench.kernels.kv_layout import v_by_token  # noqa: E402
from llmbench.kernels.kv_store import store_kv  # noqa: E402
from llmbench.kernels.rmsnorm import rms_norm  # noqa: E402
from llmbench.kernels.rotary import apply_rotary  # noqa: E402
from llmbench.kernels.sample import sample  # noqa: E402
from llmbench.kernels.sample_cut import cut_threshold  # noqa: E402
from llmbench.kernels.skinny_allreduce import skinny_matmul_allreduce  # noqa: E402
from llmbench.kernels.skinny_matmul import (  # noqa: E402
    skinny_matmul,
    skinny_norm_matmul,
    skinny_silu_matmul,
)
from llmbench.kernels.triton_decode import decode_attention  # noqa: E402
from llmbench.kernels.triton_prefill import prefill_attention  # noqa: E402

TRITON_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "i1",
    torch.uint8: "u8",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e5m2: "fp8e5",
}
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "launch_pdl")

# (name, q heads, kv heads, head_dim, hidden, intermediate, q/k norm): the presets' shapes, and the
# per-GPU shards of qwen3-8b at tp=2 (GQA 4) and a llama-style model without q/k norm.
SHAPES = [
    ("qwen3-0.6b", 16, 8, 128, 1024, 3072, True),
    ("qwen3-8b", 32, 8, 128, 4096, 12288, True),
    ("qwen3-8b tp=2", 16, 4, 128, 4096, 6144, True),
    ("llama head_dim 64", 32, 8, 64, 2048, 8192, False),
]
PAGE_SIZE = 16  # EngineConfig.block_size's default; 256 below as well (the kernels take any power of two)


class Launch:
    """One intercepted ``kernel[grid](...)`` call, reduced to what compiling it needs."""

    def __init__(self, kernel: Any, args: tuple, kwargs: dict) -> None:
        params = kernel.params
        values = dict(zip((p.name for p in params), args, strict=False))
        values.update({k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS})
        self.kernel = kernel
        self.options = {k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS}
        # parameters the call left at their defaults: torch.compile's inductor builds a user kernel's
        # launcher from the arguments given, and on the GPU one short fails ("missing ... '_grid_2'")
        self.defaulted = tuple(p.name for p in params if p.name not in values)
        self.signature: dict[str, str] = {}
        self.constexprs: dict[tuple[int, ...], Any] = {}
        # What a launch on a GPU tells the compiler (Triton's specialisation): integers equal to 1 as
        # constants, 16-byte aligned pointers and integers divisible by 16, except those the kernel asks
        # not to specialise on (or, pointers, not on their alignment). It decides, for one, whether loads
        # are vectorised.
        self.attrs: dict[tuple[int, ...], list] = {}
        for i, p in enumerate(params):
            value = values[p.name] if p.name in values else p.default  # a parameter left at its default
            one = type(value) is int and value == 1 and not p.do_not_specialize
            if p.is_constexpr or one:
                # an integer 1 is a constant to a launch's compile too (Triton's specialisation)
                self.signature[p.name] = "constexpr"
                self.constexprs[(i,)] = value
            else:
                self.signature[p.name] = runtime_type(p.name, value)
                aligned = (
                    value.data_ptr() % 16 == 0
                    if isinstance(value, torch.Tensor)
                    else not isinstance(value, bool) and isinstance(value, int) and value % 16 == 0
                )
                if (
                    aligned
                    and not p.do_not_specialize
                    and not getattr(p, "do_not_specialize_on_alignment", False)
                ):
                    self.attrs[(i,)] = [["tt.divisibility", 16]]

    @property
    def key(self) -> tuple:
        return (
            self.kernel.fn.__qualname__,
            tuple(self.signature.items()),
            tuple(sorted((k, repr(v)) for k, v in self.constexprs.items())),
            tuple(sorted(self.options.items())),
        )

    def describe(self) -> str:
        names = [p.name for p in self.kernel.params]
        consts = ", ".join(f"{names[i[0]]}={v}" for i, v in self.constexprs.items())
        return f"{self.kernel.fn.__name__}[{consts}] {self.options}"


def runtime_type(name: str, value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + TRITON_DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"argument {name}: cannot give a Triton type to {type(value).__name__}")


def capture(calls: Callable[[], None], programmatic: bool = False) -> list[Launch]:
    """Run ``calls`` with every Triton launch recorded instead of run, the wrappers taking the CPU
    tensors for a GPU's (their inline PTX paths included); with ``programmatic``, every kernel that takes
    it launched with programmatic dependent launch."""
    launches: list[Launch] = []
    original = JITFunction.run
    wrappers = (sample_module, triton_decode, _triton)

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launches.append(Launch(self, args, kwargs))

    JITFunction.run = record
    for module in wrappers:
        module.runs_ptx = lambda t: True
    _triton.set_programmatic_launch(1 << 30 if programmatic else 0)
    try:
        calls()
    finally:
        JITFunction.run = original
        _triton.set_programmatic_launch(0)
        for module in wrappers:
            module.runs_ptx = runs_ptx
    return launches


def engine_calls(dtype: torch.dtype = torch.bfloat16) -> None:
    """Each wrapper at the shapes and in the modes the engine uses (prefill, decode, split-KV)."""
    t = lambda *shape, dt=dtype: torch.zeros(shape, dtype=dt)  # noqa: E731
    for _, hq, hk, d, hidden, inter, qk_norm in SHAPES:
        T = 64
        silu_and_mul(t(T, 2 * inter))
        rms_norm(t(T, hidden), t(hidden), 1e-6)
        rms_norm(t(T, hidden), t(hidden), 1e-6, residual=t(T, hidden))
        for rows, world in ((1, 2), (T, 2), (T, 4)):  # tp decode: the all-reduce fused with the next norm
            addrs = t(world, dt=torch.int64)
            for residual in (None, t(rows, hidden)):
                allreduce_norm(addrs, addrs, 1, (rows, hidden), dtype, residual, t(hidden), 1e-6)
        qkv = (hq + 2 * hk) * d
        for rows in (1, 2, 8, 16, 64):  # decode at small batches: the skinny matmuls, plain and fused
            skinny_matmul(t(rows, hidden), t(qkv, hidden))
            skinny_silu_matmul(t(rows, 2 * inter), t(hidden, inter))
            skinny_norm_matmul(t(rows, hidden), None, t(hidden), 1e-6, t(qkv, hidden))
            skinny_norm_matmul(t(rows, hidden), t(rows, hidden), t(hidden), 1e-6, t(2 * inter, hidden))
            for world in (2, 4):  # tp decode: o_proj, down_proj with the all-reduce; the next product normed
                addrs = t(world, dt=torch.int64)
                for residual in (None, t(rows, hidden)):
                    skinny_matmul_allreduce(t(rows, hq * d // world), t(hidden, hq * d // world), None, addrs, 1,
                                            residual)  # fmt: skip
                skinny_matmul_allreduce(t(rows, 2 * inter // world), t(hidden, inter // world), None, addrs, 1,
                                        t(rows, hidden), gated=True)  # fmt: skip
                squares = t(rows, -(-hidden // 512), dt=torch.float32)
                skinny_norm_matmul(
                    t(rows, hidden), None, t(hidden), 1e-6, t(qkv // world, hidden), squares=squares
                )
        cos_sin = t(4096, d, dt=torch.float32)
        positions = t(T, dt=torch.int64)
        apply_rotary(t(T, hq, d), t(T, hk, d), positions, cos_sin)
        for page in (PAGE_SIZE, 256):
            cache = t(64, page, hk, d)
            slots = t(T, dt=torch.int64)
            store_kv(t(T, hk, d), t(T, hk, d), cache, cache, slots)
            norm = (t(d), t(d)) if qk_norm else (None, None)
            attention_prologue(
                t(T, (hq + 2 * hk) * d), positions, cos_sin, *norm, 1e-6, cache, cache, slots, hq, hk
            )
            for B in (1, 256):  # split-KV (a batch of one) and unsplit (a full batch)
                tables = t(B, 4096 // page, dt=torch.int32)
                lens = t(B, dt=torch.int64)
                decode_attention(t(B, hq, d), cache, cache, tables, lens, d**-0.5)
            if page == PAGE_SIZE:  # a full batch taken longest first (the engine's default there)
                decode_attention(
                    t(256, hq, d), cache, cache, tables, lens, d**-0.5, order=t(256, dt=torch.int64)
                )
            decode_attention(t(8, hq, d), cache, cache, t(8, 4096 // page, dt=torch.int32), t(8, dt=torch.int64),
                             d**-0.5, split_tokens=256)  # fmt: skip
            for B, query_len in ((1, 2048), (4, 256), (64, 1)):  # a long prompt, chunks, a decode-only batch
                starts = torch.arange(B + 1, dtype=torch.int32) * query_len
                prefill_attention(t(B * query_len, hq, d), cache, cache, t(B, 4096 // page, dt=torch.int32), starts,
                                  t(B, dt=torch.int64), query_len, d**-0.5)  # fmt: skip


def fp8_kv_calls() -> None:
    """The KV store, the prologue and attention over float8 caches (kv_cache_dtype), bf16 model."""
    t = lambda *shape, dt=torch.bfloat16: torch.zeros(shape, dtype=dt)  # noqa: E731
    for _, hq, hk, d, *_, qk_norm in SHAPES:
        T = 64
        scales = (t(hk, dt=torch.float32), t(hk, dt=torch.float32))
        positions = t(T, dt=torch.int64)
        slots = t(T, dt=torch.int64)
        norm = (t(d), t(d)) if qk_norm else (None, None)
        for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
            cache = t(64, PAGE_SIZE, hk, d, dt=fp8)
            for v_cache in (v_by_token(cache), cache):  # the pool's layout (V by token), and V laid out as K
                store_kv(t(T, hk, d), t(T, hk, d), cache, v_cache, slots, *scales)
                attention_prologue(t(T, (hq + 2 * hk) * d), positions, t(4096, d, dt=torch.float32), *norm, 1e-6,
                                   cache, v_cache, slots, hq, hk, *scales)  # fmt: skip
                for B in (1, 256):
                    tables = t(B, 4096 // PAGE_SIZE, dt=torch.int32)
                    decode_attention(t(B, hq, d), cache, v_cache, tables, t(B, dt=torch.int64), d**-0.5,
                                     k_scale=scales[0], v_scale=scales[1])  # fmt: skip
                for B, query_len in ((1, 2048), (64, 1)):
                    starts = torch.arange(B + 1, dtype=torch.int32) * query_len
                    prefill_attention(t(B * query_len, hq, d), cache, v_cache, t(B, 4096 // PAGE_SIZE, dt=torch.int32),
                                      starts, t(B, dt=torch.int64), query_len, d**-0.5, k_scale=scales[0],
                                      v_scale=scales[1])  # fmt: skip


def sampler_calls() -> None:
    """The sampler at Qwen3's vocabulary: a row alone and batches (split over programs or not), with and
    without a cut; the top-k/top-p/min-p threshold search in its modes."""
    V = 151_936
    for N in (1, 256, 512):  # split over 2 x 132 programs or more; 512 rows: one program each
        logits = torch.zeros(N, V, dtype=torch.bfloat16)
        scale, cut = torch.ones(N), torch.zeros(N)
        keys, positions = torch.zeros(N, dtype=torch.int64), torch.zeros(N, dtype=torch.int64)
        sample(logits, scale, None, keys, positions)
        sample(logits, scale, cut, keys, positions)
        for floor, top_p, min_p in (
            (cut, torch.ones(N), cut),
            (None, torch.ones(N), None),
            (None, None, cut),
        ):
            cut_threshold(logits, scale, floor, top_p, min_p)


def compile_all(launches: list[Launch], arch: int) -> list[tuple[Launch, str | None]]:
    """Compile each distinct launch; (launch, None) when it compiled, else (launch, the error)."""
    target = GPUTarget("cuda", arch, 32)
    unique = list({launch.key: launch for launch in launches}.values())
    results = []
    for launch in unique:
        source = ASTSource(launch.kernel, launch.signature, constexprs=launch.constexprs, attrs=launch.attrs)
        try:
            triton.compile(source, target=target, options=launch.options)
            results.append((launch, None))
        except Exception as exc:  # the compiler's message is the point: keep its last line
            lines = [line for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
            results.append((launch, f"{type(exc).__name__}: {lines[-1]}"))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arch", type=int, default=90, help="compute capability x 10 (default 90: H100/H200)"
    )
    parser.add_argument(
        "--dtype",
        default="bf16,fp32,fp16",
        help="model dtypes, comma-separated: bf16 (the GPU default), fp32 (parity tests), fp16",
    )
    args = parser.parse_args()
    names = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    dtypes = [names.get(name.strip()) for name in args.dtype.split(",")]
    if None in dtypes:
        print(
            f"error: --dtype takes bf16, fp32 or fp16, comma-separated; got {args.dtype!r}", file=sys.stderr
        )
        return 2
    if triton is None:
        print("error: needs the triton package (pip install triton)", file=sys.stderr)
        return 2
    results = compile_all(
        capture(lambda: [engine_calls(dtype) for dtype in dtypes])
        + capture(lambda: engine_calls(dtypes[0]), programmatic=True)  # as on Hopper and later
        + capture(fp8_kv_calls)
        + capture(sampler_calls)
        + capture(sampler_calls, programmatic=True),
        args.arch,
    )
    failed = [(launch, error) for launch, error in results if error]
    for launch, error in failed:
        print(f"FAILED {launch.describe()}\n    {error}")
    print(f"{len(results) - len(failed)} of {len(results)} distinct launches compiled for sm_{args.arch}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
