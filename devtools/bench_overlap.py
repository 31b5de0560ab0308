"""Would a decode step be shorter with its batch cut in two, the halves on two CUDA streams, so that one
half's products run beside the other half's attention?

A decode step's layers stand in for the engine's: RMSNorm, the qkv product, the Triton decode attention
over a paged KV cache, the o product, RMSNorm with the residual add, gate_up, SiLU-and-multiply, down;
each layer with weights and a KV cache of its own (as in the model, so nothing stays in L2); contexts
uniform in a range, the rows taken longest first as the engine takes them. Each way of running them is
one CUDA graph, timed per step:

- the full batch on one stream (the engine's way);
- the two halves one after the other on one stream (what cutting the batch costs by itself);
- the halves on two streams, each free to run as it will;
- the halves on two streams with their attentions taking turns (one half's attention after the other's:
  the products of each then run beside the other's attention).

The halves take every other row of the batch sorted by context, so each has contexts like the whole.
Before timing, the halves' outputs are checked against the full batch's.

    python devtools/bench_overlap.py --json FILE                   # qwen3-0.6b, 256 and 128 sequences
    python devtools/bench_overlap.py --batch 64 --context 500 4000
    python devtools/bench_overlap.py --smoke                       # exercises this script on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

if "--smoke" in sys.argv:  # must be decided before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmbench.kernels.activation import silu_and_mul  # noqa: E402
from llmbench.kernels.decode_config import longest_first  # noqa: E402
from llmbench.kernels.rmsnorm import rms_norm  # noqa: E402
from llmbench.kernels.triton_decode import decode_attention  # noqa: E402

from bench_kernels import Env, Row, check, time_us  # noqa: E402  (this script's folder)


class Dims(NamedTuple):
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    page: int


MODELS = {"0.6b": Dims(28, 1024, 16, 8, 128, 3072, 16)}
SMOKE = Dims(2, 64, 4, 2, 16, 128, 8)


class Layers:
    """Every layer's weights and KV cache, and the batch's block tables and context lengths."""

    def __init__(self, env: Env, d: Dims, lens: torch.Tensor) -> None:
        self.d = d
        pages = (lens + d.page - 1) // d.page
        total = int(pages.sum())

        def w(*shape: int) -> torch.Tensor:
            return env.t(*shape) * 0.02

        self.weights = [
            {
                "qkv": w((d.heads + 2 * d.kv_heads) * d.head_dim, d.hidden),
                "o": w(d.hidden, d.heads * d.head_dim),
                "gate_up": w(2 * d.inter, d.hidden),
                "down": w(d.hidden, d.inter),
                "norm1": torch.ones(d.hidden, device=env.device, dtype=env.dtype),
                "norm2": torch.ones(d.hidden, device=env.device, dtype=env.dtype),
                "k": env.t(total, d.page, d.kv_heads, d.head_dim),
                "v": env.t(total, d.page, d.kv_heads, d.head_dim),
            }
            for _ in range(d.layers)
        ]
        perm = torch.randperm(total)
        tables = torch.zeros(len(lens), int(pages.max()), dtype=torch.int32)
        start = 0
        for i, n in enumerate(pages.tolist()):
            tables[i, :n] = perm[start : start + n]
            start += n
        self.tables = tables.to(env.device)
        self.lens = lens.to(env.device, torch.int32)


class Rows:
    """A set of the batch's rows and their hidden states, run through the layers."""

    def __init__(self, layers: Layers, idx: torch.Tensor, x: torch.Tensor, res: torch.Tensor) -> None:
        self.m = layers
        self.tables, self.lens = layers.tables[idx].contiguous(), layers.lens[idx].contiguous()
        self.order = longest_first(self.lens)
        self.x0, self.res0 = x[idx].clone(), res[idx].clone()
        self.x, self.res = self.x0, self.res0

    def reset(self) -> None:
        self.x, self.res = self.x0, self.res0

    def layer(
        self, i: int, before: Callable[[], object] | None = None, after: Callable[[], object] | None = None
    ):
        d, p = self.m.d, self.m.weights[i]
        h, res = rms_norm(self.x, p["norm1"], 1e-6, self.res)
        q = F.linear(h, p["qkv"])[:, : d.heads * d.head_dim].reshape(-1, d.heads, d.head_dim)
        if before:
            before()
        a = decode_attention(q, p["k"], p["v"], self.tables, self.lens, d.head_dim**-0.5, order=self.order)
        if after:
            after()
        h, res = rms_norm(F.linear(a.reshape(len(q), -1), p["o"]), p["norm2"], 1e-6, res)
        self.x = F.linear(silu_and_mul(F.linear(h, p["gate_up"])), p["down"])
        self.res = res


def ways(env: Env, layers: Layers, full: Rows, a: Rows, b: Rows) -> dict[str, Callable[[], None]]:
    n = layers.d.layers
    streams = not env.smoke  # the interpreter has no streams: there the halves run one after the other
    side = torch.cuda.Stream() if streams else None

    def one_stream() -> None:
        full.reset()
        for i in range(n):
            full.layer(i)

    def halves_in_turn() -> None:
        a.reset(), b.reset()
        for i in range(n):
            a.layer(i)
            b.layer(i)

    def two_streams(taking_turns: bool) -> Callable[[], None]:
        def run() -> None:
            a.reset(), b.reset()
            main = torch.cuda.current_stream() if streams else None
            if streams:
                side.wait_stream(main)
            on_side = torch.cuda.stream(side) if streams else contextlib.nullcontext()
            a_done = [torch.cuda.Event() for _ in range(n)] if streams and taking_turns else None
            b_done = [torch.cuda.Event() for _ in range(n)] if streams and taking_turns else None
            for i in range(n):
                if a_done is None:
                    a.layer(i)
                    with on_side:
                        b.layer(i)
                    continue
                # a's attention after b's attention of the layer before; b's after a's of this layer
                a.layer(
                    i, (lambda i=i: i and main.wait_event(b_done[i - 1])), lambda i=i: a_done[i].record(main)
                )
                with on_side:
                    b.layer(i, lambda i=i: side.wait_event(a_done[i]), lambda i=i: b_done[i].record(side))
            if streams:
                main.wait_stream(side)

        return run

    return {
        "full batch, one stream": one_stream,
        "halves one after the other, one stream": halves_in_turn,
        "halves on two streams": two_streams(False),
        "halves on two streams, attentions taking turns": two_streams(True),
    }


def case(env: Env, model: str, d: Dims, batch: int, lo: int, hi: int) -> list[Row]:
    gen = torch.Generator().manual_seed(batch)
    lens = torch.randint(lo, hi + 1, (batch,), generator=gen)
    layers = Layers(env, d, lens)
    x, res = env.t(batch, d.hidden), env.t(batch, d.hidden)
    by_length = torch.argsort(layers.lens, descending=True)
    idx_a, idx_b = by_length[0::2].sort().values, by_length[1::2].sort().values
    full = Rows(layers, torch.arange(batch, device=env.device), x, res)
    a, b = Rows(layers, idx_a, x, res), Rows(layers, idx_b, x, res)
    runs = ways(env, layers, full, a, b)
    runs["full batch, one stream"]()
    want = full.x.float()
    shape = f"{model} x{d.layers} layers, B={batch} ctx {lo}-{hi}"
    kv_bytes = 2 * int(lens.sum()) * d.kv_heads * d.head_dim * x.element_size() * d.layers
    weight_bytes = sum(
        t.numel() * t.element_size() for p in layers.weights for k, t in p.items() if k not in ("k", "v")
    )
    rows = []
    for name, run in runs.items():
        run()
        got = torch.empty_like(want)
        got[idx_a], got[idx_b] = a.x.float(), b.x.float()
        rel = None if name == "full batch, one stream" else check(f"{name} B={batch}", got, want, 5e-2)
        us = time_us(env, run)
        rows.append(Row(name, shape, us, (kv_bytes + weight_bytes) / us / 1e3, None, None, rel))
        print(f"{name:<48} {shape:<40} {us:10.1f} µs", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--context", type=int, nargs=2, default=[200, 1500], metavar=("SHORTEST", "LONGEST"))
    parser.add_argument("--json", type=Path, help="write the rows (kernel benchmarks' format) to this file")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1"
    )
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        print("error: needs a CUDA GPU (or --smoke to exercise the script on the CPU)", file=sys.stderr)
        raise SystemExit(2)
    env = Env.pick(args.smoke)
    torch.manual_seed(0)
    model, d = ("smoke", SMOKE) if args.smoke else ("qwen3-0.6b", MODELS["0.6b"])
    batches, (lo, hi) = ([6], (3, 20)) if args.smoke else (args.batch, args.context)
    rows = [r for batch in batches for r in case(env, model, d, batch, lo, hi)]
    if any(r.max_rel_diff is not None and r.max_rel_diff > 5e-2 for r in rows):
        raise SystemExit(1)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
