"""Quick engine timing without the harness: the nano-vllm offline workload and one-sequence decode.

    python scripts/engine_bench.py --model qwen3-0.6b --workload throughput --set cuda_graph=false

Prints one JSON line per run. The harness (`llmbench run scenarios/...`) is the tool for real
measurements; this script exists to check the engine alone on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from llmbench.engine.config import EngineConfig, nest
from llmbench.engine.llm_engine import LLMEngine
from llmbench.engine.sampling_params import SamplingParams


def parse_value(v: str):
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def workload(name: str, seed: int):
    rng = random.Random(seed)
    if name == "throughput":  # nano-vllm's bench.py workload
        reqs = []
        for _ in range(256):
            prompt = [rng.randint(0, 4000) for _ in range(rng.randint(100, 1024))]
            reqs.append((prompt, rng.randint(100, 1024)))
        return reqs
    if name == "single":
        return [([rng.randint(0, 4000) for _ in range(128)], 256)]
    if name.startswith("batch"):
        n = int(name[5:])  # token ids below 4000 fit every preset, qwen3-tiny included
        return [([rng.randint(0, 4000) for _ in range(128)], 256) for _ in range(n)]
    raise SystemExit(f"unknown workload {name}")


def run(engine: LLMEngine, reqs) -> dict:
    for i, (prompt, n) in enumerate(reqs):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    start = time.perf_counter()
    outs = []
    steps = 0
    while engine.has_unfinished():
        outs += engine.step().finished
        steps += 1
    elapsed = time.perf_counter() - start
    total_out = sum(len(o.token_ids) for o in outs)
    tpot = [
        (o.token_times[-1] - o.token_times[0]) / (len(o.token_times) - 1)
        for o in outs
        if len(o.token_times) > 1
    ]
    return {
        "output_tokens": total_out,
        "elapsed_s": round(elapsed, 3),
        "output_tok_s": round(total_out / elapsed, 1),
        "tpot_ms_median": round(1000 * sorted(tpot)[len(tpot) // 2], 3),
        "steps": steps,
        "first_tokens": outs[0].token_ids[:8],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b", help="preset name or HF folder")
    ap.add_argument("--workload", default="throughput", help="throughput | single | batchN")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        help="engine option key=value, tuning knobs as tuning.key=value (repeatable)",
    )
    ap.add_argument("--warmup", type=int, default=1, help="warm-up runs of a short request before timing")
    args = ap.parse_args()
    options = dict(kv.split("=", 1) for kv in args.set)
    engine = LLMEngine(
        EngineConfig.from_options(args.model, **nest({k: parse_value(v) for k, v in options.items()}))
    )
    for _ in range(args.warmup):
        run(engine, [([1] * 64, 16), ([2] * 200, 8)])
    result = run(engine, workload(args.workload, 0))
    result.update(
        model=args.model,
        workload=args.workload,
        options=options,
        startup={k: round(v, 3) if isinstance(v, float) else v for k, v in vars(engine.startup).items()},
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
