"""A decode step's products cut along their input features: does that beat cuBLAS at 64-256 rows?

The kernel is the engine's (llmbench/kernels/split_k.py); this sweeps its tiles. qwen3-0.6b's decode
products at a wide batch take 6-8 µs each under cuBLAS while their weights (2-12 MB)
take 1-3 µs to read (BENCHMARKS.md, "The decode step's linear layers"): the narrow ones (1,024 outputs)
give cuBLAS few output tiles to spread over 132 multiprocessors. Here each program takes a tile of rows
and output features and one of ``split`` equal parts of the input features, and writes its float32
partial sums; the kernel that reads a product's output next (an RMSNorm, the SiLU) would sum the parts,
so the cut costs no launch of its own. Timed alone, each in a CUDA graph over enough weight copies to
miss the L2 cache, against F.linear (``bench_gemv.py``'s timing):

    python devtools/splitk_matmul.py --json FILE
    TRITON_INTERPRET=1 python devtools/splitk_matmul.py --smoke   # exercises this script
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

from bench_gemv import FLUSH_BYTES, SHAPES, time_per_call  # noqa: E402  (this script's folder)

from llmbench.kernels.split_k import SplitTiles, split_k_matmul  # noqa: E402

from bench_kernels import Env, check  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--shapes", nargs="+", default=["0.6b.qkv", "0.6b.o", "0.6b.gate_up", "0.6b.down"])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    env = Env.pick(args.smoke, warmup_ms=10, rep_ms=60)  # many tilings: short timings, medians
    torch.manual_seed(0)
    shapes = {"smoke": (64, 128)} if args.smoke else {s: SHAPES[s] for s in args.shapes}
    rows_list = [5, 16] if args.smoke else args.rows
    tilings = (
        [(16, 32, 32, 4, 2)]
        if args.smoke
        else [
            (bm, bn, bk, w, 4 if (bm + bn) * bk * 2 * 4 <= 160 * 1024 else 3)
            for bm, bn, bk, w in itertools.product((64, 128), (32, 64, 128), (64, 128), (4, 8))
        ]
    )
    splits = (1, 2) if args.smoke else (1, 2, 4, 8)
    out_rows = []
    for name, (n, k) in shapes.items():
        nbytes = n * k * 2
        copies = 2 if args.smoke else max(2, int(FLUSH_BYTES // nbytes))
        weights = [env.t(n, k) / k**0.5 for _ in range(copies)]
        for m in rows_list:
            x = env.t(m, k)
            ref = F.linear(x, weights[0]).float()
            cublas = time_per_call(env, lambda w, x=x: F.linear(x, w), weights)
            timed = []
            for (bm, bn, bk, nw, st), split in itertools.product(tilings, splits):
                if n % bn or k % (split * bk) or (bm > 64 and m <= 64):
                    continue
                cfg = (bm, bn, bk, nw, st, split)
                tiles = SplitTiles(split, bm, bn, bk, nw, st)
                try:
                    check(f"{name} m={m} {cfg}", split_k_matmul(x, weights[0], tiles).sum(0), ref, 2e-2)
                    us = time_per_call(env, lambda w, x=x, t=tiles: split_k_matmul(x, w, t), weights)
                    timed.append((us, cfg))
                except Exception as e:  # out of shared memory or registers
                    print(f"  {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            timed.sort()
            for us, cfg in timed[:5]:
                print(
                    f"{name:>13} m={m:<4} cuBLAS {cublas * 1e6:6.2f} us   split-K {us * 1e6:6.2f} us  {cfg}"
                )
            for variant, seconds in [("cuBLAS", cublas)] + [
                (f"split-K, best m{c[0]} n{c[1]} k{c[2]} w{c[3]} s{c[4]} split {c[5]}", us)
                for us, c in timed[:1]
            ]:
                out_rows.append({
                    "kernel": f"{name} ({variant})", "shape": f"{m} rows N={n} K={k}", "time_us": seconds * 1e6,
                    "gb_per_s": nbytes / seconds / 1e9, "frac_peak": None,
                    "tflops": 2 * m * n * k / seconds / 1e12, "max_rel_diff": None,
                })  # fmt: skip
        del weights
    if args.json:
        args.json.write_text(json.dumps(out_rows, indent=1))


if __name__ == "__main__":
    main()
