"""A decode step's layers with and without their products' weights prefetched into L2.

The engine's ``tuning.weight_prefetch_rows`` (llmbench/kernels/prefetch.py): the RMSNorm before q/k/v and
gate/up, the decode attention kernel's last programs before the output projection and the
SiLU-and-multiply before the down projection ask that product's weight into L2. The layers are
``bench_overlap.py``'s (qwen3-0.6b's 28, each with weights and a paged KV cache of its own, contexts
uniform in a range, the rows taken longest first), the whole batch in one CUDA graph, with the prefetch
off and on. The outputs of both must be equal. Printed: µs per step each way and the change.

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

from bench_overlap import Dims, Layers, Rows, command_line, write  # noqa: E402

from llmbench.kernels.prefetch import prefetchable  # noqa: E402

from bench_kernels import Env, Row, time_us  # noqa: E402  (this script's folder)


def case(env: Env, model: str, d: Dims, batch: int, lo: int, hi: int) -> list[Row]:
    gen = torch.Generator().manual_seed(batch)
    layers = Layers(env, d, torch.randint(lo, hi + 1, (batch,), generator=gen))
    x, res = env.t(batch, d.hidden), env.t(batch, d.hidden)
    every = torch.arange(batch, device=env.device)
    shape = f"{model} x{d.layers} layers, B={batch} ctx {lo}-{hi}"
    times, outs = {}, {}
    for prefetch in (False, True):
        rows = Rows(layers, every, x, res, prefetch)

        def step(rows: Rows = rows) -> None:
            rows.reset()
            for i in range(d.layers):
                rows.layer(i)

        step()
        outs[prefetch] = rows.x.clone()
        times[prefetch] = time_us(env, step)
    if not torch.equal(outs[False], outs[True]):
        raise SystemExit(f"{shape}: the prefetch changed the layers' outputs")
    print(f"{shape:<40} {times[False]:9.1f} -> {times[True]:9.1f} µs ({times[True] / times[False] - 1:+.1%})")
    return [
        Row("no prefetch", shape, times[False], None, None, None, None),
        Row("weights prefetched into L2", shape, times[True], None, None, None, 0.0),
    ]


def main() -> None:
    c = command_line(__doc__, [16, 64, 128, 256])
    probe = c.env.t(c.dims.hidden, c.dims.hidden)
    print(
        f"weights prefetched: {'yes' if prefetchable(probe) is not None else 'none (no bulk L2 prefetch here)'}"
    )
    write([r for batch in c.batches for r in case(c.env, c.model, c.dims, batch, *c.context)], c.json)


if __name__ == "__main__":
    main()
