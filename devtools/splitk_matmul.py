"""A decode step's products cut along their input features: does that beat cuBLAS at 64-256 rows?

qwen3-0.6b's decode products at a wide batch take 6-8 µs each under cuBLAS while their weights (2-12 MB)
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

from llmbench.kernels._triton import jit, tl  # noqa: E402

from bench_kernels import Env, check  # noqa: E402


@jit
def _splitk_kernel(
    x_ptr, w_ptr, part_ptr, M, N, K, k_part, stride_xm, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Grid (N / BLOCK_N, cdiv(M, BLOCK_M), split): part[s] = x[:, s*k_part:(s+1)*k_part] @ w[...].T, float32.
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    s = tl.program_id(2)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(s * k_part, (s + 1) * k_part, BLOCK_K):
        x = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + ks)[None, :], mask=row_ok[:, None], other=0.0)
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * stride_wn + (k0 + ks)[None, :])
        acc = tl.dot(x, tl.trans(w), acc)
    tl.store(part_ptr + (s * M + rows[:, None]) * N + cols[None, :], acc, mask=row_ok[:, None])


def splitk_matmul(
    x: torch.Tensor, w: torch.Tensor, split: int, block_m: int, block_n: int, block_k: int,
    num_warps: int = 4, num_stages: int = 4, out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """(split, M, N) float32 partial sums of x (M, K) @ w (N, K).T; N % block_n == 0, K % (split *
    block_k) == 0."""
    m, k = x.shape
    n = w.shape[0]
    if n % block_n or k % (split * block_k):
        raise ValueError(f"N={n} must be a multiple of {block_n} and K={k} of {split * block_k}")
    out = out if out is not None else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    grid = (n // block_n, -(-m // block_m), split)
    _splitk_kernel[grid](
        x, w, out, m, n, k, k // split, x.stride(0), w.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


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
                part = torch.empty((split, m, n), dtype=torch.float32, device=env.device)
                cfg = (bm, bn, bk, nw, st, split)
                try:
                    got = splitk_matmul(x, weights[0], split, bm, bn, bk, nw, st, out=part).sum(0)
                    check(f"{name} m={m} {cfg}", got, ref, 2e-2)
                    us = time_per_call(
                        env, lambda w, x=x, c=cfg, p=part: splitk_matmul(x, w, c[5], *c[:5], out=p), weights
                    )
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
