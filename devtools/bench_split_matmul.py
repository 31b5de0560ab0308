"""The decode step's linear layers at 16 to 512 rows: cuBLAS (F.linear) against the split-K Triton kernel.

Every product runs inside a CUDA graph (as in the engine's decode steps), over enough copies of the
weight that none stays in the L2 cache (``bench_gemv.time_per_call``). Each Triton configuration is
first checked against F.linear after its graph has replayed (its counters must be back at 0). With
``--sweep`` the tilings are swept and the best per shape and row count printed beside today's rule
(``split_tiles_for``).

    python devtools/bench_split_matmul.py                          # the rule against cuBLAS
    python devtools/bench_split_matmul.py --sweep --json out.json  # every tiling, the best per case
    TRITON_INTERPRET=1 python devtools/bench_split_matmul.py --smoke --sweep   # exercises this script
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_gemv import FLUSH_BYTES, SHAPES, time_per_call  # noqa: E402

from llmbench.kernels._triton import num_sms  # noqa: E402
from llmbench.kernels.split_matmul import SplitTiles, split_matmul, split_tiles_for  # noqa: E402

from bench_kernels import Env, time_us  # noqa: E402  (this script's folder)


def _check(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float = 2e-2) -> None:
    rel = (out.float() - ref.float()).abs().max().item() / max(ref.float().abs().max().item(), 1e-6)
    if not (bool(torch.isfinite(out).all()) and rel <= tol):
        raise SystemExit(f"{name}: Triton output differs from F.linear (max rel diff {rel:.3e})")


def sweep_tiles(rows: int, k: int) -> list[SplitTiles]:
    top = max(16, 1 << (rows - 1).bit_length())
    out = []
    for bm, bn, bk, split in itertools.product(
        (16, 32, 64, 128), (32, 64, 128), (64, 128), (1, 2, 3, 4, 6, 8)
    ):
        if bm > top or bm < top // 8 or k // (bk * split) < 2 or (bn == 32 and bm > 32):
            continue
        out.append(SplitTiles(bm, bn, bk, split, 8 if bm * bn >= 128 * 128 else 4, 3))
    return out


def _scale_kernel_src():
    import triton
    import triton.language as tl

    @triton.jit
    def scale_rows(x_ptr, y_ptr, N, stride, PDL: tl.constexpr, BLOCK: tl.constexpr):
        # a stand-in for the norms and activations between the products: one row per program
        row = tl.program_id(0)
        if PDL:
            tl.extra.cuda.gdc_wait()
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=0.0).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
        tl.store(y_ptr + row * N + cols, (x * 0.5).to(y_ptr.dtype.element_ty), mask=cols < N)

    return scale_rows


def chain(env: Env, rows_list: list[int], table: dict, layers: int = 28) -> None:
    """A decode step's products, layer after layer (qwen3-0.6b shapes, distinct weights per layer),
    with and without an elementwise kernel between them, cuBLAS against the split kernel with and
    without programmatic dependent launch; µs per layer."""
    scale_rows = _scale_kernel_src()
    n = {name: SHAPES[f"0.6b.{name}"] for name in ("qkv", "o", "gate_up", "down")}
    ws = [{name: env.t(nn, kk) / kk**0.5 for name, (nn, kk) in n.items()} for _ in range(layers)]
    for rows in rows_list:
        x0 = env.t(rows, 1024)

        def tiles(name: str, rows: int = rows) -> SplitTiles | None:
            t = table.get((f"0.6b.{name}", rows))
            return SplitTiles(*t) if t else None

        def run(kind: str, ew: bool, x0: torch.Tensor = x0) -> torch.Tensor:
            h = x0
            for w in ws:
                for name, take in (("qkv", 2048), ("o", None), ("gate_up", 3072), ("down", None)):
                    if ew:
                        y = torch.empty((h.shape[0], h.shape[1]), dtype=h.dtype, device=h.device)
                        scale_rows[(h.shape[0],)](
                            h,
                            y,
                            h.shape[1],
                            h.stride(0),
                            PDL=kind == "pdl",
                            BLOCK=triton_next_pow2(h.shape[1]),
                            **({"launch_pdl": True} if kind == "pdl" else {}),
                        )
                        h = y
                    if kind == "cublas":
                        h = F.linear(h, w[name])
                    else:
                        h = split_matmul(h, w[name], tiles=tiles(name), pdl=kind == "pdl")
                    if take:
                        h = h[:, :take]
            return h

        out = {}
        kinds = ("cublas", "split") if env.smoke else ("cublas", "split", "pdl")  # no PDL in the interpreter
        for ew in (False, True):
            for kind in kinds:
                res = run(kind, ew)
                if kind != "cublas":
                    _check(f"chain rows={rows} {kind}", res, out[(ew, "cublas")][1], 5e-2)
                us = time_us(env, lambda kind=kind, ew=ew: run(kind, ew)) / layers
                out[(ew, kind)] = (us, res)
            line = "  ".join(f"{kind} {out[(ew, kind)][0]:7.2f}" for kind in kinds)
            print(
                f"chain rows={rows:>4} {'with' if ew else 'no':>4} elementwise: us/layer  {line}", flush=True
            )


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--sweep", action="store_true", help="every tiling, the best one reported")
    ap.add_argument("--budget", type=float, default=1e9, help="stop sweeping after this many seconds")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    ap.add_argument("--chain", action="store_true", help="28 layers of products in a row (qwen3-0.6b)")
    ap.add_argument("--tiles-from", type=Path, help="a --json file: each case's best tiles for --chain")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    args = ap.parse_args()
    env = Env(
        "cpu" if args.smoke else "cuda", torch.float32 if args.smoke else torch.bfloat16, args.smoke, 20, 80
    )
    shapes = {"smoke": (96, 512)} if args.smoke else {name: SHAPES[name] for name in args.shapes}
    sms = num_sms(torch.device(env.device))
    if args.chain:
        table = {}
        if args.tiles_from:
            table = {
                (r["shape"], r["rows"]): r["best_tiles"] for r in json.loads(args.tiles_from.read_text())
            }
        chain(env, args.rows, table, 2 if args.smoke else 28)
        return
    torch.manual_seed(0)
    started = time.perf_counter()
    rows_out = []
    print(
        f"{'shape':>15} {'rows':>4} {'cuBLAS us':>9} {'rule us':>8} {'best us':>8} {'ratio':>6}  best tiles"
    )
    for name, (n, k) in shapes.items():
        nbytes = n * k * env.dtype.itemsize
        copies = 2 if args.smoke else max(2, int(FLUSH_BYTES // nbytes))
        weights = [env.t(n, k) / k**0.5 for _ in range(copies)]
        for rows in args.rows:
            x = env.t(rows, k)
            ref = F.linear(x, weights[0])
            cublas = time_per_call(env, lambda w, x=x: F.linear(x, w), weights)
            rule = split_tiles_for(rows, n, k, sms)
            candidates = [rule] + ([t for t in sweep_tiles(rows, k) if t != rule] if args.sweep else [])
            timed = []
            for t in candidates:
                if time.perf_counter() - started > args.budget:
                    break
                try:
                    s = time_per_call(env, lambda w, x=x, t=t: split_matmul(x, w, tiles=t), weights)
                    _check(f"{name} rows={rows} {tuple(t)}", split_matmul(x, weights[0], tiles=t), ref)
                    timed.append((s, t))
                except Exception as e:  # a tiling the compiler cannot fit (registers, shared memory)
                    print(f"  {tuple(t)}: {type(e).__name__}: {str(e)[:100]}")
            if not timed:
                continue
            best, tiles = min(timed, key=lambda p: p[0])
            print(
                f"{name:>15} {rows:>4} {cublas * 1e6:>9.2f} {timed[0][0] * 1e6:>8.2f} {best * 1e6:>8.2f} "
                f"{cublas / best:>5.2f}x  {tuple(tiles)}",
                flush=True,
            )
            rows_out.append(
                {
                    "shape": name,
                    "n": n,
                    "k": k,
                    "rows": rows,
                    "cublas_s": cublas,
                    "rule_s": timed[0][0],
                    "rule_tiles": list(rule),
                    "best_s": best,
                    "best_tiles": list(tiles),
                    "all": [[s, list(t)] for s, t in timed],
                }
            )
        del weights
    if args.json:
        args.json.write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
