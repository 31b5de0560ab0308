"""A tensor-parallel engine brought up and stepped with a timestamp per stage: where a tp run stalls.

    PYTHONFAULTHANDLER=1 python scripts/tp_probe.py --tp 2 --set cuda_graph=false

Send SIGABRT to the ranks (``pkill -ABRT -f tp_worker``, then this process) to dump every thread's stack.
"""

from __future__ import annotations

import argparse
import time

from llmbench.engine.config import EngineConfig
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
    ap.add_argument("--set", action="append", default=[], help="engine option key=value")
    args = ap.parse_args()
    options = {k: engine_bench.parse_value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    say(f"starting {args.model} tp={args.tp} {options}")
    engine = LLMEngine(EngineConfig.from_options(args.model, tp=args.tp, **options))
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


if __name__ == "__main__":
    main()
