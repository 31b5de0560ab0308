"""The decode step's linear layers at a few rows: cuBLAS (F.linear) against the skinny Triton kernel.

Every product runs inside a CUDA graph (as in the engine's decode steps), over enough copies of the
weight that none stays in the L2 cache, so each figure is a read from HBM (``bench_kernels.time_us``). With ``--sweep`` the
kernel's tile sizes are swept and the best per shape printed beside today's rule (``tiles_for``); with
``--pdl`` the skinny kernel's calls are launched as the engine launches a step's chain of Triton kernels,
with programmatic dependent launch, each placed on the GPU while the one before drains; ``--json`` writes
the kernel benchmarks' rows (``llmbench docs`` shows them with a kernels block).

    python devtools/bench_gemv.py                     # qwen3-8b at tp=1 and tp=2, qwen3-0.6b; rows 1, 2, 4, 8
    python devtools/bench_gemv.py --sweep --rows 1 --json gemv.json
    python devtools/bench_gemv.py --sweep --rows 8 16 64 --shapes 0.6b.qkv 0.6b.o 0.6b.gate_up 0.6b.down
    python devtools/bench_gemv.py --sweep --pdl --rows 128 256 --shapes 0.6b.qkv 0.6b.o 0.6b.gate_up 0.6b.down
    TRITON_INTERPRET=1 python devtools/bench_gemv.py --smoke --sweep --rows 1 3   # exercises this script
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmbench.kernels._triton import set_programmatic_launch  # noqa: E402
from llmbench.kernels.skinny_matmul import MAX_ROWS, Tiles, skinny_matmul, tiles_for  # noqa: E402
from llmbench.kernels.skinny_tiles import SHARED_BUDGET, WHOLE_ROWS  # noqa: E402

from bench_kernels import Env, check, time_us  # noqa: E402  (this script's folder)

SHAPES = {  # name: (N, K) of each decode-step linear layer
    "8b.qkv": (6144, 4096),
    "8b.o": (4096, 4096),
    "8b.gate_up": (24576, 4096),
    "8b.down": (4096, 12288),
    "8b-tp2.qkv": (3072, 4096),
    "8b-tp2.o": (4096, 2048),
    "8b-tp2.gate_up": (12288, 4096),
    "8b-tp2.down": (4096, 6144),
    "0.6b.qkv": (4096, 1024),
    "0.6b.o": (1024, 2048),
    "0.6b.gate_up": (6144, 1024),
    "0.6b.down": (1024, 3072),
}
FLUSH_BYTES = 600e6  # copies of the weight per graph: several times the L2 cache


def time_per_call(env: Env, fn, weights) -> float:
    """Median seconds per call of fn(w), from one CUDA graph that calls it once per weight copy."""
    calls = [lambda w=w: fn(w) for w in weights]
    return time_us(env, calls[0], more=calls[1:]) / 1e6


def sweep_tiles(rows: int, k: int) -> list[Tiles]:
    if rows > WHOLE_ROWS:  # blocks of rows per program, the tensor cores
        grid = itertools.product((16, 32, 64, 128), (64, 128), (64, 128), (4, 8), (3, 4))
        return [
            Tiles(bn, bk, warps, stages, dot=True, block_m=bm)
            for bn, bm, bk, warps, stages in grid
            if (bn + bm) * bk * 2 * stages <= SHARED_BUDGET
            and bm < 2 * rows
            and not (bn == 16 and warps == 8)
        ]
    if rows > 1:  # the tensor-core form (``Tiles.dot``), as the engine takes it from two rows on
        grid = itertools.product((16, 32, 64), (64, 128, 256), (4, 8), (3, 4))
        return [
            Tiles(bn, bk, warps, stages, dot=True)
            for bn, bk, warps, stages in grid
            if bk <= max(64, 1 << (k - 1).bit_length()) and not (bn == 16 and warps == 8)
        ]
    out = []
    for bn, bk, warps, stages in itertools.product((2, 4, 8, 16), (128, 256, 512, 1024), (4, 8), (1, 2, 3)):
        if bk > max(128, 1 << (k - 1).bit_length()) or bn * bk > 16384 or bn * bk < 32 * warps:
            continue
        out.append(Tiles(bn, bk, warps, stages))
    return out


def tiles_name(t: Tiles) -> str:
    rows = f"m{t.block_m} " if t.block_m else ""
    return f"{rows}n{t.block_n} k{t.block_k} w{t.num_warps} s{t.num_stages}"


def kernel_rows(
    name: str,
    n: int,
    k: int,
    rows: int,
    cublas: float,
    rule: float,
    best: tuple[float, Tiles] | None,
    itemsize: int = 2,
    pdl: bool = False,
) -> list[dict]:
    """One shape's measurements (seconds) in the kernel benchmarks' format (``llmbench docs`` kernels
    blocks): cuBLAS, the skinny kernel with ``tiles_for``'s tiles and, swept, with the best ones. GB/s is
    the weight's read rate."""
    launch = ", PDL" if pdl else ""
    timed = [("cuBLAS", cublas), (f"skinny, tiles_for{launch}", rule)]
    if best is not None:
        t = best[1]
        form = "tensor cores" if t.dot else "broadcast"
        timed.append((f"skinny, best {tiles_name(t)} {form}{launch}", best[0]))
    return [
        {
            "kernel": f"{name} ({variant})",
            "shape": f"{rows} rows N={n} K={k}",
            "time_us": seconds * 1e6,
            "gb_per_s": n * k * itemsize / seconds / 1e9,
            "frac_peak": None,
            "tflops": 2 * rows * n * k / seconds / 1e12,
            "max_rel_diff": None,
        }
        for variant, seconds in timed
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--sweep", action="store_true", help="every tile size, best one reported")
    ap.add_argument("--pdl", action="store_true", help="the skinny kernel with programmatic dependent launch")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    args = ap.parse_args()
    env = Env.pick(args.smoke)
    if args.pdl:
        set_programmatic_launch(MAX_ROWS)  # a no-op where Triton has no grid dependency control
    shapes = {"smoke": (48, 96)} if args.smoke else {name: SHAPES[name] for name in args.shapes}
    torch.manual_seed(0)
    rows_out = []
    print(
        f"{'shape':>15} {'rows':>4} {'cuBLAS us':>9} {'TB/s':>5} {'triton us':>9} {'TB/s':>5} {'ratio':>6}  tiles"
    )
    for name, (n, k) in shapes.items():
        nbytes = n * k * env.dtype.itemsize
        copies = 2 if args.smoke else max(2, int(FLUSH_BYTES // nbytes))
        weights = [env.t(n, k) / k**0.5 for _ in range(copies)]
        for rows in args.rows:
            x = env.t(rows, k)
            check(f"{name} rows={rows}", skinny_matmul(x, weights[0]), F.linear(x, weights[0]), 2e-2)
            cublas = time_per_call(env, lambda w, x=x: F.linear(x, w), weights)
            candidates = [tiles_for(rows, n, k)] + (sweep_tiles(rows, k) if args.sweep else [])
            timed = []
            for t in candidates:
                try:
                    timed.append(
                        (time_per_call(env, lambda w, x=x, t=t: skinny_matmul(x, w, tiles=t), weights), t)
                    )
                except Exception as e:  # a tile size the compiler cannot fit (registers, shared memory)
                    print(f"  {t}: {type(e).__name__}: {str(e)[:100]}")
            rule = timed[0][0]
            best, tiles = min(timed, key=lambda p: p[0])
            if args.sweep:
                for seconds, t in sorted(timed, key=lambda p: p[0])[1:4]:
                    print(f"{'':>15} {rows:>4} {'':>9} {'':>5} {seconds * 1e6:>9.2f}  {tiles_name(t)}")
            print(
                f"{name:>15} {rows:>4} {cublas * 1e6:>9.2f} {nbytes / cublas / 1e12:>5.2f} "
                f"{best * 1e6:>9.2f} {nbytes / best / 1e12:>5.2f} {cublas / best:>5.2f}x  {tuple(tiles)}"
                + (f"  (rule {rule * 1e6:.2f} us)" if args.sweep else "")
            )
            swept = (best, tiles) if args.sweep else None
            rows_out += kernel_rows(name, n, k, rows, cublas, rule, swept, env.dtype.itemsize, args.pdl)
        del weights
    if args.json:
        args.json.write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
