"""A decode step's layers with and without their products' weights prefetched into L2.

The engine's ``tuning.weight_prefetch_rows`` (llmbench/kernels/prefetch.py): the RMSNorm before q/k/v and
gate/up, the decode attention kernel's last programs before the output projection and the
SiLU-and-multiply before the down projection ask that product's weight into L2. The layers are
``bench_overlap.py``'s (qwen3-0.6b's 28, each with weights and a paged KV cache of its own, contexts
uniform in a range, the rows taken longest first; the skinny matmul up to 64 rows and programmatic launch
as the engine has them), the whole batch in one CUDA graph: without a prefetch, with each product's alone,
with all four, and (up to 64 rows) with the skinny matmul asking for its own weight too. Every variant's
outputs must equal the first's. Printed: µs per step and the change against no prefetch.

    python devtools/bench_prefetch.py --json FILE                 # 16 to 256 sequences, contexts 200-1,500
    python devtools/bench_prefetch.py --smoke                     # exercises this script on the CPU
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:  # must be decided before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_overlap import PRODUCTS, Dims, Layers, Rows, command_line, write  # noqa: E402

from llmbench.kernels._triton import set_programmatic_launch  # noqa: E402
from llmbench.kernels.prefetch import prefetchable  # noqa: E402

from bench_kernels import Env, Row, time_us  # noqa: E402  (this script's folder)

# (name, the products whose weights the kernel before asks into L2; "self": the skinny matmul its own)
VARIANTS = (
    [("no prefetch", frozenset())]
    + [(f"{p} only", frozenset({p})) for p in PRODUCTS]
    + [
        ("all four", frozenset(PRODUCTS)),
        ("all four and the skinny matmul's own", frozenset({*PRODUCTS, "self"})),
    ]
)
SKINNY_ROWS = 64  # the engine's default on qwen3-0.6b (engine/resolve_tuning.py SKINNY_MATMUL_ROWS)


def case(env: Env, model: str, d: Dims, batch: int, lo: int, hi: int) -> list[Row]:
    gen = torch.Generator().manual_seed(batch)
    layers = Layers(env, d, torch.randint(lo, hi + 1, (batch,), generator=gen))
    x, res = env.t(batch, d.hidden), env.t(batch, d.hidden)
    every = torch.arange(batch, device=env.device)
    shape = f"{model} x{d.layers} layers, B={batch} ctx {lo}-{hi}"
    out_rows, base, want = [], None, None
    for name, prefetch in VARIANTS:
        if "self" in prefetch and batch > SKINNY_ROWS:
            continue  # cuBLAS's products: nothing of their own to prefetch
        rows = Rows(layers, every, x, res, prefetch, SKINNY_ROWS)

        def step(rows: Rows = rows) -> None:
            rows.reset()
            for i in range(d.layers):
                rows.layer(i)

        step()
        if want is None:
            want = rows.x.clone()
        elif not torch.equal(rows.x, want):
            raise SystemExit(f"{shape}: prefetching {name} changed the layers' outputs")
        us = time_us(env, step)
        base = base or us
        print(f"{shape:<40} {name:<40} {us:9.1f} µs ({us / base - 1:+.1%})", flush=True)
        out_rows.append(Row(name, shape, us, None, None, None, None if base == us else 0.0))
    return out_rows


def main() -> None:
    c = command_line(__doc__, [16, 64, 128, 256])
    set_programmatic_launch(SKINNY_ROWS)  # the engine's default: programmatic launch up to 64 rows
    probe = c.env.t(c.dims.hidden, c.dims.hidden)
    print(
        f"weights prefetched: {'yes' if prefetchable(probe) is not None else 'none (no bulk L2 prefetch here)'}"
    )
    write([r for batch in c.batches for r in case(c.env, c.model, c.dims, batch, *c.context)], c.json)


if __name__ == "__main__":
    main()
