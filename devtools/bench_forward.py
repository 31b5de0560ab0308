"""The host's cost of an eager forward: how long the host takes to issue a prefill step's work.

    python devtools/bench_forward.py                              # qwen3-0.6b on the GPU
    python devtools/bench_forward.py --tokens 8192 --seq-len 512 --profile 25
    python devtools/bench_forward.py --set kv_cache_dtype=fp8_e4m3

Prefill and mixed steps run outside the decode CUDA Graphs. Eagerly, the host launches every kernel of every
layer (norms, projections, the attention prologue and kernels, the activation) one by one; if issuing them
takes the host as long as the device takes to run them, those steps are host-bound: the device's share of
the step cannot shrink it, and the host's other work in the step (scheduling, inputs, bookkeeping) adds to
it instead of hiding under the device's. With prefill graphs (``tuning.prefill_graphs``) the host replays
the pieces between the attention kernels and launches only attention. For each shape (a batch of
``--tokens`` prompt tokens in sequences of ``--seq-len``, as the engine's warm-up builds them), with the
device idle at the start, this prints, eagerly and from the prefill graphs (where the engine has them), the
host's time to issue the step's forward and logits (median of ``--repeats``) and the time until the device
has finished them too; ``--profile N`` then prints cProfile's N costliest functions over a few eager
forwards of the first shape.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from llmbench import LLM  # noqa: E402
from llmbench.engine import warmup  # noqa: E402


def step_forwards(runner, tokens: int, seq_len: int) -> dict:  # noqa: ANN001 - a ModelRunner
    """A prefill step's forward and logits as the engine runs them outside the decode graphs: eagerly, and
    from the prefill graphs where the engine has them for this many tokens (name -> callable)."""
    inputs, caches = warmup.dummy_inputs(runner, tokens, seq_len, None)

    def eager() -> None:
        hidden = runner._forward(inputs.input_ids, inputs.positions, inputs.meta, caches)
        runner.model.compute_logits(hidden[inputs.logits_indices])

    forwards = {"eager": eager}
    graphs = runner.prefill_graphs
    if graphs is not None and graphs.bucket_for(tokens) is not None:

        def replayed() -> None:  # the pieces store into the engine's own pool
            hidden, _ = graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
            runner.model.compute_logits(hidden[inputs.logits_indices])

        forwards["graphs"] = replayed
    return forwards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE", help="an engine option")
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 2048, 512])
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="then print cProfile's N costliest")
    args = ap.parse_args()
    options = {key: yaml.safe_load(value) for key, _, value in (s.partition("=") for s in args.set)}
    llm = LLM(args.model, device=args.device, **options)
    runner = llm.engine.runner
    cuda = runner.device.type == "cuda"

    def settle() -> None:
        if cuda:
            torch.cuda.synchronize(runner.device)

    print(f"{'tokens':>7} {'seq len':>8} {'forward':>8} {'host issues (ms)':>17} {'device done (ms)':>17}")
    shapes = [(tokens, step_forwards(runner, tokens, min(args.seq_len, tokens))) for tokens in args.tokens]
    with torch.inference_mode():
        for tokens, forwards in shapes:
            for name, forward in forwards.items():
                for _ in range(3):
                    forward()
                issued, done = [], []
                for _ in range(args.repeats):
                    settle()
                    t0 = time.perf_counter()
                    forward()
                    t1 = time.perf_counter()
                    settle()
                    issued.append(t1 - t0)
                    done.append(time.perf_counter() - t0)
                host, device = statistics.median(issued) * 1e3, statistics.median(done) * 1e3
                seq = min(args.seq_len, tokens)
                print(f"{tokens:>7} {seq:>8} {name:>8} {host:>17.2f} {device:>17.2f}")
        if args.profile:
            profiler = cProfile.Profile()
            settle()
            profiler.enable()
            for _ in range(3):
                shapes[0][1]["eager"]()
            profiler.disable()
            settle()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    llm.shutdown()


if __name__ == "__main__":
    main()
