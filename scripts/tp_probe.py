"""A tensor-parallel engine brought up and stepped with a timestamp per stage: where a tp run stalls.

    PYTHONFAULTHANDLER=1 python scripts/tp_probe.py --tp 2 --set cuda_graph=false
    python scripts/tp_probe.py --tp 2 --trace --set async_scheduling=true   # per-step timeline of every rank

``--trace`` runs one sequence for ``--tokens`` steps with ``LLMBENCH_TP_TRACE`` set, then prints, for the
median step and for every step slower than twice the median, where each rank's time went: rank 0's send,
the message's transit to each worker, the worker's launch and its sample broadcast.

Send SIGABRT to the ranks (``pkill -ABRT -f tp_worker``, then this process) to dump every thread's stack.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from llmbench.engine.config import EngineConfig, nest
from llmbench.engine.llm_engine import LLMEngine
from llmbench.engine.sampling_params import SamplingParams

import engine_bench  # noqa: E402  (same folder)

T0 = time.perf_counter()


def say(what: str) -> None:
    print(f"[{time.perf_counter() - T0:7.2f} s] {what}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument(
        "--set", action="append", default=[], help="engine option key=value; tuning knobs as tuning.key=value"
    )
    ap.add_argument("--trace", action="store_true", help="per-step timeline of every rank (one sequence)")
    ap.add_argument("--tokens", type=int, default=256, help="new tokens of the traced sequence")
    args = ap.parse_args()
    options = {k: engine_bench.parse_value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    if args.trace:
        trace(args, options)
        return
    say(f"starting {args.model} tp={args.tp} {options}")
    engine = LLMEngine(EngineConfig.from_options(args.model, tp=args.tp, **nest(options)))
    say(f"engine up: {engine.startup}")
    for i in range(4):
        engine.add_request(
            str(i), [1 + i] * 32, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        )
    n = 0
    while engine.has_unfinished():
        out = engine.step()
        n += 1
        if n <= 3 or not engine.has_unfinished():
            say(f"step {n} {out.stats.kind} seqs={out.stats.num_seqs} bucket={out.stats.graph_bucket}")
    engine.shutdown()
    say("shut down")


def trace(args: argparse.Namespace, options: dict) -> None:
    folder = Path(tempfile.mkdtemp(prefix="llmbench-tp-trace-"))
    os.environ["LLMBENCH_TP_TRACE"] = str(folder)  # read by rank 0 here and inherited by the workers
    engine = LLMEngine(EngineConfig.from_options(args.model, tp=args.tp, **nest(options)))
    engine.add_request(
        "0", [1] * 128, SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    )
    steps = []
    while engine.has_unfinished():
        stats = engine.step().stats
        if stats.kind != "idle":
            steps.append((stats.step, stats.kind, stats.end_time - stats.start_time))
    engine.shutdown()
    ranks = {int(p.stem[4:]): json.loads(p.read_text())["rows"] for p in sorted(folder.glob("rank*.json"))}
    sends = ranks.pop(0)
    n = min(len(sends), *(len(rows) for rows in ranks.values()))
    durations = [d for _, _, d in steps]
    median = statistics.median(durations)
    print(f"{len(steps)} steps, median {median * 1e3:.3f} ms; per step (ms): rank 0's send | for each worker: "
          "transit (send to arrival), waited for it, launch, sample broadcast")  # fmt: skip

    def row(i: int) -> str:
        send, sent = sends[i]
        parts = [f"send {1e3 * (sent - send):6.3f}"]
        for rank, rows in sorted(ranks.items()):
            wait, got, launched, shared = rows[i]
            parts.append(
                f"r{rank}: transit {1e3 * (got - send):7.3f} waited {1e3 * (got - wait):7.3f} "
                f"launch {1e3 * (launched - got):7.3f} broadcast {1e3 * (shared - launched):7.3f}"
            )
        return " | ".join(parts)

    slow = [i for i in range(min(n, len(steps))) if durations[i] > 2 * median]
    typical = min(range(min(n, len(steps))), key=lambda i: abs(durations[i] - median))
    print(f"median step {typical}: {durations[typical] * 1e3:.3f} ms  {row(typical)}")
    for i in slow[:20]:
        print(f"slow step {i} ({steps[i][1]}): {durations[i] * 1e3:.3f} ms  {row(i)}")
    print(f"{len(slow)} slow steps at {slow[:40]}")


if __name__ == "__main__":
    main()
