"""All-reduce latency on this host's GPUs: NCCL against the one-shot kernel over symmetric memory.

A tensor-parallel decode step of qwen3-8b all-reduces its hidden state 72 times (two per layer); at
batch 1 each message is 8 KB, so the step pays the all-reduce's latency, not its bandwidth. This checks
that both paths give the same sums, then times each from a CUDA graph of 64 back-to-back calls (as the
engine replays them) and eagerly, for a few batch sizes. Then the same for what the engine does at each
of those all-reduces with ``tp_fuse_norm``: the one-shot all-reduce followed by the residual add and
RMSNorm (two kernels and a copy) against the one kernel of kernels/allreduce_norm.py, both checked
against NCCL's sum normed by the torch reference:

With ``--matmul`` it times what ``tp_fuse_matmul`` changes instead, on pairs of qwen3-8b's shards (o_proj
then gate_up, down_proj then qkv): the row-parallel product, the fused all-reduce + norm, the next
product; against the product that also sums over the ranks and adds the residual
(kernels/skinny_allreduce.py, ``skinny_matmul_allreduce``) followed by the next product with the norm on
its loads, for a few sizes of the column blocks its last programs sum; and the two products alone. Each
pair with its own copies of the weights, so every product reads them from HBM as in a decode step. The
sum is checked bit for bit against the reference over every rank's products, the next product within 2%.

    python devtools/allreduce_probe.py                 # two GPUs, hidden 4096, bf16
    python devtools/allreduce_probe.py --gpus 4 --hidden 5120
    python devtools/allreduce_probe.py --matmul --rows 1,2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from llmbench.distributed.fused import FusedOneShot  # noqa: E402
from llmbench.engine.tp import free_port  # noqa: E402
from llmbench.kernels.allreduce_norm import allreduce_norm_ref  # noqa: E402
from llmbench.kernels.rmsnorm import rms_norm, rms_norm_ref  # noqa: E402
from llmbench.kernels.skinny_allreduce import skinny_matmul_allreduce  # noqa: E402
from llmbench.kernels.skinny_matmul import (  # noqa: E402
    skinny_matmul,
    skinny_norm_matmul,
    skinny_silu_matmul,
)

CALLS = 64  # all-reduces per captured graph
REPLAYS = 20


def timed(fn, graph: bool) -> float:
    """Microseconds per call: ``fn`` (CALLS all-reduces) replayed from a graph, or run eagerly."""
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    else:
        run = fn
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (REPLAYS * CALLS)


def join(rank: int, world: int, port: int, rows: list[int], fuse_matmul: bool = False):
    """This process as GPU ``rank`` of the group, with the one-shot all-reduce: (group, all-reduce)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    group = dist.group.WORLD
    fast = FusedOneShot.over(
        group, torch.bfloat16, torch.device("cuda", rank), fuse_matmul=fuse_matmul, fused_max_rows=max(rows)
    )
    return group, fast


def rank_main(rank: int, world: int, port: int, hidden: int, rows: list[int]) -> None:
    group, fast = join(rank, world, port, rows)
    lines, worst = [], 0.0
    for n in rows:
        gen = torch.Generator(device="cuda").manual_seed(n * 31 + rank)
        x = torch.randn(n, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
        want = x.clone()
        dist.all_reduce(want, group=group)
        got = fast.all_reduce(x)
        diff = (got.float() - want.float()).abs().max().item()
        if diff > 1e-2 * want.float().abs().max().item():  # the order of a sum may differ, not its value
            raise SystemExit(f"rank {rank}: one-shot sum differs from NCCL's for {n} rows (max diff {diff})")
        worst = max(worst, diff)

        nccl_buf = x.clone()

        def nccl(buf: torch.Tensor = nccl_buf) -> None:
            for _ in range(CALLS):
                dist.all_reduce(buf, group=group)

        def one_shot(x: torch.Tensor = x) -> None:
            for _ in range(CALLS):
                fast.all_reduce(x)

        # with the norm: residual add + RMSNorm after the sum, unfused and fused
        residual = torch.randn(n, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
        weight = torch.rand(hidden, device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5
        want_out, want_h = rms_norm_ref(want, weight, 1e-6, residual)
        slot = fast.partial_buffer(2, n, hidden, torch.bfloat16)  # 2: the loop below takes 1, 0, 1, ... 0
        slot.tensor.copy_(x)
        got_out, got_h = fast.all_reduce_norm(slot, residual, weight, 1e-6)
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x, group=group)
        ref_out, ref_h = allreduce_norm_ref(parts, residual, weight, 1e-6)
        for name, got_t, ref_t, nccl_t in (
            ("sum", got_h, ref_h, want_h),
            ("normed", got_out, ref_out, want_out),
        ):
            if not torch.equal(got_t, ref_t):  # the reference adds in rank order too: bit for bit
                raise SystemExit(
                    f"rank {rank}: fused all-reduce + norm ({name}) differs from its reference, {n} rows"
                )
            diff = (got_t.float() - nccl_t.float()).abs().max().item()
            if diff > 2e-2 * max(1.0, nccl_t.float().abs().max().item()):
                raise SystemExit(
                    f"rank {rank}: fused all-reduce + norm ({name}) differs from NCCL's, {n} rows"
                )

        def unfused(
            x: torch.Tensor = x, weight: torch.Tensor = weight, residual: torch.Tensor = residual
        ) -> None:
            for _ in range(CALLS):
                rms_norm(fast.all_reduce(x), weight, 1e-6, residual)

        def fused(n: int = n, weight: torch.Tensor = weight, residual: torch.Tensor = residual) -> None:
            for i in range(CALLS):  # slots 1, 0, 1, ...: never one slot twice in a row (distributed/fused.py)
                fast.all_reduce_norm(
                    fast.partial_buffer((i + 1) % 2, n, hidden, torch.bfloat16), residual, weight, 1e-6
                )

        row = [n, n * hidden * 2 / 1024]
        for fn in (nccl, one_shot, unfused, fused):
            for graph in (True, False):
                row.append(timed(fn, graph))
        lines.append(row)
    if rank == 0:
        print(f"{world} GPUs ({torch.cuda.get_device_name()}), hidden {hidden}, bf16; µs per all-reduce")
        names = ["NCCL", "1-shot", "1-shot+norm", "fused norm"]
        header = "".join(f"{name + ' ' + how:>18}" for name in names for how in ("graph", "eager"))
        print(f"{'rows':>5} {'KiB':>7}{header}")
        for n, kib, *times in lines:
            print(f"{n:>5} {kib:>7.0f}" + "".join(f"{t:>18.1f}" for t in times))
        print(f"sums: one-shot against NCCL's, largest difference {worst:.3g} (0: bit for bit)")
        print(
            "fused all-reduce + norm: equal to its reference bit for bit, and to NCCL's sum normed within 2%"
        )
    dist.barrier()
    dist.destroy_process_group()


def matmul_main(rank: int, world: int, port: int, hidden: int, rows: list[int]) -> None:
    group, fast = join(rank, world, port, rows, fuse_matmul=True)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    # (row-parallel product: its input features, gated; the column-parallel product after the norm: its
    # output features), qwen3-8b's shards
    pairs = {
        "o_proj>gate_up": (4096 // world, False, 24576 // world),
        "down>qkv": (12288 // world, True, 6144 // world),
    }
    blocks = (128, 256, 512)
    lines = []
    for name, (k, gated, n_next) in pairs.items():
        gen = torch.Generator(device="cuda").manual_seed(k * 7 + rank)
        weights = [torch.randn(hidden, k, generator=gen, **bf16) * 0.02 for _ in range(CALLS)]
        nexts = [torch.randn(n_next, hidden, generator=gen, **bf16) * 0.02 for _ in range(CALLS)]
        product = skinny_silu_matmul if gated else skinny_matmul
        for n in rows:
            x = torch.randn(n, 2 * k if gated else k, generator=gen, **bf16)
            residual = torch.randn(n, hidden, generator=gen, **bf16)
            nw = torch.rand(hidden, generator=gen, **bf16) + 0.5
            part = product(x, weights[0])
            parts = [torch.empty_like(part) for _ in range(world)]
            dist.all_gather(parts, part, group=group)
            ref_out, ref_h = allreduce_norm_ref(parts, residual, nw, 1e-6)
            ref_next = skinny_matmul(ref_out, nexts[0])
            for block in blocks:
                for j in (0, 1):
                    h, ss = skinny_matmul_allreduce(
                        x, weights[0], None, fast.receive_addrs[j], rank, residual, gated, block=block
                    )  # fmt: skip
                    got = skinny_norm_matmul(h, None, nw, 1e-6, nexts[0], squares=ss)[0]
                    diff = (got.float() - ref_next.float()).abs().max().item()
                    if not torch.equal(h, ref_h) or diff > 2e-2 * ref_next.float().abs().max().item():
                        raise SystemExit(
                            f"rank {rank}: {name} fused with the all-reduce differs, {n} rows, block {block}: "
                            f"sum equal {torch.equal(h, ref_h)}, next product max diff {diff:.3g}"
                        )

            def alone(x=x, product=product, weights=weights, nexts=nexts) -> None:
                for w, w2 in zip(weights, nexts, strict=True):
                    skinny_matmul(product(x, w), w2)

            def apart(
                x=x, product=product, n=n, residual=residual, nw=nw, weights=weights, nexts=nexts
            ) -> None:
                for i, (w, w2) in enumerate(zip(weights, nexts, strict=True)):
                    slot = fast.partial_buffer(i % 2, n, hidden, torch.bfloat16)
                    product(x, w, out=slot.tensor)
                    skinny_matmul(fast.all_reduce_norm(slot, residual, nw, 1e-6)[0], w2)

            def together(
                block, x=x, gated=gated, residual=residual, nw=nw, weights=weights, nexts=nexts
            ) -> None:
                for i, (w, w2) in enumerate(zip(weights, nexts, strict=True)):
                    h, ss = skinny_matmul_allreduce(
                        x, w, None, fast.receive_addrs[i % 2], rank, residual, gated, block=block
                    )  # fmt: skip
                    skinny_norm_matmul(h, None, nw, 1e-6, w2, squares=ss)

            times = [timed(alone, True), timed(apart, True)]
            times += [timed(lambda b=block, f=together: f(b), True) for block in blocks]
            lines.append((name, n, times))
    if rank == 0:
        print(f"{world} GPUs ({torch.cuda.get_device_name()}), hidden {hidden}, bf16; µs per pair in a graph")
        head = "".join(f"{h:>14}" for h in ["products", "+ fused AR"] + [f"fused/{b}" for b in blocks])
        print(f"{'layers':>15} {'rows':>4}{head}")
        for name, n, times in lines:
            print(f"{name:>15} {n:>4}" + "".join(f"{t:>14.2f}" for t in times))
        print(
            "fused: the sum equal to the reference over every rank's products bit for bit, the next product within 2%"
        )
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument(
        "--rows",
        default=None,
        help="batch sizes (rows of the hidden state); default 1,8,64,256 (1,2,4,8 with --matmul)",
    )
    ap.add_argument("--matmul", action="store_true", help="the product fused in too (tp_fuse_matmul)")
    args = ap.parse_args()
    if torch.cuda.device_count() < args.gpus:
        print(f"error: needs {args.gpus} CUDA GPUs, torch sees {torch.cuda.device_count()}", file=sys.stderr)
        sys.exit(2)
    rows = [int(r) for r in (args.rows or ("1,2,4,8" if args.matmul else "1,8,64,256")).split(",")]
    target = matmul_main if args.matmul else rank_main
    mp.spawn(target, args=(args.gpus, free_port(), args.hidden, rows), nprocs=args.gpus)


if __name__ == "__main__":
    main()
