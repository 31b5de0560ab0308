"""A decode step's linear layers as the engine runs them, through each BLAS path torch offers.

Every layer's products (qkv, o, gate_up, down: a weight of its own per layer, as in the model, so none
stays in L2) in one CUDA graph, at decode batches of 16 to 256 rows; the LM head apart. Each BLAS choice
runs in a process of its own (the choice holds for the process):

    python devtools/bench_linear.py --json a.json                   # torch's default (cuBLAS)
    python devtools/bench_linear.py --blas cublaslt --json b.json   # cuBLASLt's heuristic
    python devtools/bench_linear.py --tunable --json c.json         # TunableOp: every algorithm timed
    python devtools/bench_linear.py --skinny --json d.json          # the skinny Triton matmul (<= 256 rows),
                                                                    # programmatic launch between products
    python devtools/bench_linear.py --smoke                         # exercises this script on the CPU

Printed: µs per product and per layer (the four in sequence), and the weights' read rate; --json writes
the kernel benchmarks' rows (``llmbench docs`` shows them with a kernels block).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmbench.kernels._triton import set_programmatic_launch  # noqa: E402
from llmbench.kernels.skinny_matmul import MAX_ROWS, skinny_matmul  # noqa: E402

from bench_kernels import Env, time_us  # noqa: E402  (this script's folder)

MODELS = {  # name: (hidden, q width, kv width, intermediate, layers, vocab)
    "0.6b": (1024, 2048, 1024, 3072, 28, 151936),
    "8b": (4096, 4096, 1024, 12288, 36, 151936),
}


def products(hidden: int, q: int, kv: int, inter: int) -> dict[str, tuple[int, int]]:
    """name: (N, K) of a layer's products."""
    return {
        "qkv": (q + 2 * kv, hidden),
        "o": (hidden, q),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
    }


def table_rows(
    variant: str, model: str, rows: int, dims: tuple[int, int, int, int, int], per: dict[str, float],
    layer: float, lm_head: float, itemsize: int = 2,
) -> list[dict]:  # fmt: skip
    """One measurement's rows in the kernel benchmarks' format (``llmbench docs`` kernels blocks): each
    product, the layer's four in sequence and the LM head; GB/s is the weights' read rate."""
    hidden, q, kv, inter, vocab = dims
    shapes = {**products(hidden, q, kv, inter), "lm_head": (vocab, hidden)}
    times = {**per, "lm_head": lm_head}
    out = []
    for name, us in [*times.items(), ("layer", layer)]:
        nk = sum(n * k for p, (n, k) in shapes.items() if p != "lm_head") if name == "layer" else None
        n, k = shapes.get(name, (None, None))
        weight_elems = nk if nk is not None else n * k
        where = f"{model} {rows} rows" + (f" N={n} K={k}" if n is not None else " qkv+o+gate_up+down")
        out.append(
            {
                "kernel": f"{name} ({variant})",
                "shape": where,
                "time_us": us,
                "gb_per_s": weight_elems * itemsize / us / 1e3,
                "frac_peak": None,
                "tflops": 2 * rows * weight_elems / us / 1e6,
                "max_rel_diff": None,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["0.6b"], choices=list(MODELS))
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--blas", choices=["default", "cublaslt"], default="default", help="default: cuBLAS")
    ap.add_argument("--tunable", action="store_true", help="TunableOp: time every algorithm, keep the best")
    ap.add_argument(
        "--skinny",
        action="store_true",
        help="the skinny Triton matmul instead of BLAS (rows up to its MAX_ROWS), launched with "
        "programmatic dependent launch where the GPU has it",
    )
    ap.add_argument("--json", type=Path, help="write every measurement here")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    args = ap.parse_args()
    env = Env.pick(args.smoke)
    if args.blas != "default":
        torch.backends.cuda.preferred_blas_library(args.blas)
    if args.tunable:
        torch.cuda.tunable.enable(True)
        torch.cuda.tunable.tuning_enable(True)
        torch.cuda.tunable.set_max_tuning_iterations(50)
        torch.cuda.tunable.set_filename(str((args.json or Path("tunableop.json")).with_suffix(".csv")))
    models = {"smoke": (48, 64, 32, 96, 2, 500)} if args.smoke else {m: MODELS[m] for m in args.models}
    variant = "TunableOp" if args.tunable else {"default": "cuBLAS", "cublaslt": "cuBLASLt"}[args.blas]
    product = F.linear
    if args.skinny:
        product, variant = skinny_matmul, "skinny"
        set_programmatic_launch(MAX_ROWS)  # a no-op where Triton has no grid dependency control
        args.rows = [r for r in args.rows if r <= MAX_ROWS]
    torch.manual_seed(0)
    rows_out = []
    print(
        f"{'variant':>9} {'model':>5} {'rows':>4} "
        + " ".join(f"{p:>8}" for p in (*products(1, 1, 1, 1), "layer", "lm_head"))
        + "   TB/s"
    )
    for model, (hidden, q, kv, inter, layers, vocab) in models.items():
        shapes = products(hidden, q, kv, inter)
        weights = {p: [env.t(n, k) / k**0.5 for _ in range(layers)] for p, (n, k) in shapes.items()}
        head = env.t(vocab, hidden) / hidden**0.5
        for rows in args.rows:
            xs = {k: env.t(rows, k) for k in {k for _, k in shapes.values()}}
            per = {}
            for p, ws in weights.items():
                calls = [lambda w=w, x=xs[shapes[p][1]]: product(x, w) for w in ws]
                per[p] = time_us(env, calls[0], more=calls[1:])
            chain = [
                lambda x=xs[k], w=weights[p][i]: product(x, w)
                for i in range(layers)
                for p, (_, k) in shapes.items()
            ]
            layer = time_us(env, chain[0], more=chain[1:]) * len(shapes)
            lm = time_us(env, lambda x=xs[hidden], w=head: product(x, w))
            layer_bytes = sum(n * k for n, k in shapes.values()) * env.dtype.itemsize
            rate = layer_bytes / (layer * 1e-6) / 1e12
            print(
                f"{variant:>9} {model:>5} {rows:>4} "
                + " ".join(f"{per[p]:>8.2f}" for p in shapes)
                + f" {layer:>8.2f} {lm:>8.2f}  {rate:>5.2f}"
            )
            rows_out += table_rows(
                variant, model, rows, (hidden, q, kv, inter, vocab), per, layer, lm, env.dtype.itemsize
            )
    if args.tunable and not args.smoke:
        for r in torch.cuda.tunable.get_results():
            print("tuned:", r)
    if args.json:
        args.json.write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
