"""Sweep kernels/split_matmul.py's tiles for a model's decode-step products, against cuBLAS.

For each product of a layer (qkv, o, gate_up, down) and each decode batch, every candidate tiling is
checked against ``F.linear`` and timed as devtools/bench_linear.py times cuBLAS: the product of every
layer (a weight of its own each, so none stays in L2) replayed from one CUDA graph. Printed: the best
tiling per product and batch against cuBLAS, and a layer's four products in sequence with the best
tilings; ``--json FILE`` writes the kernel benchmarks' rows, and the best tilings next to it
(FILE with the suffix ``.tiles.json``).

    python devtools/tune_split_matmul.py --json FILE             # qwen3-0.6b, batches 16-256
    python devtools/tune_split_matmul.py --models 0.6b 8b --rows 64 256
    python devtools/tune_split_matmul.py --smoke                 # exercises this script on the CPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_linear import MODELS, products, table_rows  # noqa: E402

from llmbench.kernels.split_matmul import SplitTiles, split_matmul  # noqa: E402

from bench_kernels import Env, time_us  # noqa: E402  (this script's folder)

WARPS_STAGES = [(4, 3), (4, 4), (8, 3)]


def candidates(rows: int, n: int, k: int, sms: int, smoke: bool) -> list[SplitTiles]:
    if smoke:
        return [SplitTiles(16, 32, 32, s, 4, 3) for s in (1, 2)]
    bms = {16: [16], 32: [16, 32], 64: [32, 64]}.get(rows, [64, 128])
    out = []
    for bm, bn, bk, (w, st) in itertools.product(bms, [32, 64, 128], [64, 128, 256], WARPS_STAGES):
        tiles = -(-rows // bm) * -(-n // bn)
        for s in (1, 2, 4, 8, 16):
            if k // s >= bk and tiles * s <= 4 * sms:
                out.append(SplitTiles(bm, bn, bk, s, w, st))
    return out


def _compile(tiles: list[SplitTiles]) -> None:
    """Launch each tiling once on a small product: Triton's cache then holds its compiled kernel."""
    for t in tiles:
        x = torch.randn(t.block_m, 1024, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
        try:
            split_matmul(x, w, tiles=t._replace(splits=2))
        except Exception:  # noqa: BLE001, S112 (too much shared memory: the sweep skips it)
            continue
    torch.cuda.synchronize()


def precompile(tiles: list[SplitTiles], procs: int) -> None:
    """Compile every kernel variant in ``procs`` processes at once (a variant takes a second or two)."""
    variants = sorted({t._replace(splits=1) for t in tiles})
    chunks = [variants[i::procs] for i in range(procs)]
    with mp.get_context("spawn").Pool(procs) as pool:
        pool.map(_compile, [c for c in chunks if c])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["0.6b"], choices=list(MODELS))
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--procs", type=int, default=12, help="processes compiling the kernel variants")
    ap.add_argument("--json", type=Path, help="write the kernel rows here (the best tilings: .tiles.json)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    args = ap.parse_args()
    env = Env.pick(args.smoke, warmup_ms=5, rep_ms=25)
    sms = 132 if args.smoke else torch.cuda.get_device_properties(0).multi_processor_count
    models = {"smoke": (48, 64, 32, 96, 2, 500)} if args.smoke else {m: MODELS[m] for m in args.models}
    plan = {
        (m, p, r): candidates(r, n, k, sms, args.smoke)
        for m, (hidden, q, kv, inter, *_) in models.items()
        for p, (n, k) in products(hidden, q, kv, inter).items()
        for r in args.rows
    }
    if not args.smoke:
        precompile([t for ts in plan.values() for t in ts], args.procs)
    torch.manual_seed(0)
    rows_out, best_out = [], []
    for model, (hidden, q, kv, inter, layers, vocab) in models.items():
        shapes = products(hidden, q, kv, inter)
        weights = {p: [env.t(n, k) / k**0.5 for _ in range(layers)] for p, (n, k) in shapes.items()}
        for rows in args.rows:
            xs = {k: env.t(rows, k) for k in {k for _, k in shapes.values()}}
            best: dict[str, tuple[float, SplitTiles]] = {}
            blas: dict[str, float] = {}
            for p, ws in weights.items():
                x = xs[shapes[p][1]]
                calls = [lambda w=w, x=x: F.linear(x, w) for w in ws]
                blas[p] = time_us(env, calls[0], more=calls[1:])
                ref = F.linear(x.float(), ws[0].float())
                for t in plan[(model, p, rows)]:
                    try:
                        diff = (
                            (split_matmul(x, ws[0], tiles=t).float() - ref).abs().max() / ref.abs().max()
                        ).item()
                    except Exception:  # noqa: BLE001 (a tiling this GPU cannot run)
                        continue
                    if diff > 2e-2:
                        raise SystemExit(f"{model} {p} {rows} rows {t}: relative difference {diff:.3g}")
                    calls = [lambda w=w, x=x, t=t: split_matmul(x, w, tiles=t) for w in ws]
                    us = time_us(env, calls[0], more=calls[1:])
                    if p not in best or us < best[p][0]:
                        best[p] = (us, t)
            chain = [
                lambda x=xs[k], w=weights[p][i], t=best[p][1]: split_matmul(x, w, tiles=t)
                for i in range(layers)
                for p, (_, k) in shapes.items()
            ]
            layer = time_us(env, chain[0], more=chain[1:]) * len(shapes)
            print(
                f"{model} {rows:>4} rows: "
                + "  ".join(f"{p} {best[p][0]:.2f} (cuBLAS {blas[p]:.2f})" for p in shapes)
                + f"  layer {layer:.2f} (cuBLAS {sum(blas.values()):.2f})",
                flush=True,
            )
            for p, (us, t) in best.items():
                print(f"  {p}: {tuple(t)}", flush=True)
                n, k = shapes[p]
                best_out.append({"model": model, "product": p, "rows": rows, "n": n, "k": k,
                                 "tiles": list(t), "us": us, "cublas_us": blas[p]})  # fmt: skip
            per = {p: us for p, (us, _) in best.items()}
            rows_out += table_rows(
                "split",
                model,
                rows,
                (hidden, q, kv, inter, vocab),
                per,
                layer,
                float("nan"),
                env.dtype.itemsize,
            )
    if args.json:
        rows_out = [r for r in rows_out if not r["kernel"].startswith("lm_head")]
        args.json.write_text(json.dumps(rows_out, indent=1))
        args.json.with_suffix(".tiles.json").write_text(json.dumps(best_out, indent=1))


if __name__ == "__main__":
    main()
