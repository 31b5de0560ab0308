"""A decode step's layers with and without their products' weights prefetched into L2.

The engine's ``tuning.weight_prefetch_rows`` (llmbench/kernels/prefetch.py): the RMSNorm before q/k/v
and gate/up and the SiLU-and-multiply before the down projection ask that product's weight into L2
before they wait on their inputs. Here qwen3-0.6b's 28 layers run as the engine runs a decode step's
(the norm with the residual add, q/k/v, a read of ``--between-mb`` MB standing in for attention's reads
of the KV cache, o, the norm, gate/up, the SiLU, down), each layer with weights of its own, in one CUDA
graph, with the prefetch off and on, at decode batches of 16 to 256 rows. The outputs of both must be
equal. Printed: µs per layer each way and the change.

    python devtools/bench_prefetch.py --json FILE
    TRITON_INTERPRET=1 python devtools/bench_prefetch.py --smoke   # exercises this script (no prefetch)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_linear import MODELS, products  # noqa: E402

from llmbench.kernels._triton import set_programmatic_launch  # noqa: E402
from llmbench.kernels.activation import silu_and_mul  # noqa: E402
from llmbench.kernels.prefetch import prefetchable  # noqa: E402
from llmbench.kernels.rmsnorm import rms_norm  # noqa: E402

from bench_kernels import Env, time_us  # noqa: E402  (this script's folder)


def layer_calls(env: Env, weights: dict, norms: list, x: torch.Tensor, kv: torch.Tensor, prefetch: bool):
    """The layers' kernels as calls, and where each leaves its output (for the equality check)."""
    outs: list[torch.Tensor] = []
    state = {"h": x.clone(), "res": x.clone()}

    def pf(w: torch.Tensor) -> torch.Tensor | None:
        return prefetchable(w) if prefetch else None

    def layer(i: int) -> None:
        h, res = rms_norm(state["h"], norms[i], 1e-6, state["res"], prefetch=pf(weights["qkv"][i]))
        qkv = F.linear(h, weights["qkv"][i])
        kv.sum()  # attention's reads of the KV cache, standing in: they evict L2
        o = F.linear(qkv[:, : weights["o"][i].shape[1]], weights["o"][i])
        h, res = rms_norm(o, norms[i], 1e-6, res, prefetch=pf(weights["gate_up"][i]))
        act = silu_and_mul(F.linear(h, weights["gate_up"][i]), prefetch=pf(weights["down"][i]))
        state["h"], state["res"] = F.linear(act, weights["down"][i]), res
        if i == len(norms) - 1:
            outs.append(state["h"])

    return [lambda i=i: layer(i) for i in range(len(norms))], outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["0.6b"], choices=list(MODELS))
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--between-mb", type=int, default=64, help="MB read between q/k/v and o (attention)")
    ap.add_argument("--pdl-rows", type=int, default=64, help="programmatic launch up to these rows")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    args = ap.parse_args()
    env = Env.pick(args.smoke)
    set_programmatic_launch(args.pdl_rows)
    torch.manual_seed(0)
    models = {"smoke": (64, 64, 32, 96, 2, 500)} if args.smoke else {m: MODELS[m] for m in args.models}
    out_rows = []
    for model, (hidden, q, kv_width, inter, layers, _) in models.items():
        shapes = products(hidden, q, kv_width, inter)
        weights = {p: [env.t(n, k) / k**0.5 for _ in range(layers)] for p, (n, k) in shapes.items()}
        norms = [1 + 0.1 * env.t(hidden) for _ in range(layers)]
        kv = env.t(1 if args.smoke else args.between_mb << 19)  # bf16: 2 bytes an element
        fetched = sum(prefetchable(w) is not None for ws in weights.values() for w in ws)
        print(f"{model}: {fetched} of {3 * layers} prefetched weights fit (kernels/prefetch.py)")
        for rows in [3] if args.smoke else args.rows:
            x = env.t(rows, hidden)
            times, results = {}, {}
            for prefetch in (False, True):
                calls, outs = layer_calls(env, weights, norms, x, kv, prefetch)
                times[prefetch] = time_us(env, calls[0], more=calls[1:]) * len(calls) / layers
                results[prefetch] = outs[-1]
            same = torch.equal(results[False], results[True])
            change = times[True] / times[False] - 1
            print(
                f"{model} {rows:>4} rows: {times[False]:7.2f} -> {times[True]:7.2f} µs a layer "
                f"({change:+.1%}), outputs {'equal' if same else 'DIFFER'}"
            )
            if not same:
                raise SystemExit("the prefetch changed the layers' outputs")
            for prefetch in (False, True):
                out_rows.append({
                    "kernel": f"layer ({'weights prefetched' if prefetch else 'no prefetch'})",
                    "shape": f"{model} {rows} rows, {args.between_mb} MB read between q/k/v and o",
                    "time_us": times[prefetch], "gb_per_s": None, "frac_peak": None, "tflops": None,
                    "max_rel_diff": 0.0 if prefetch else None,
                })  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out_rows, indent=1))


if __name__ == "__main__":
    main()
