"""Where a step's time goes: host work vs GPU kernels, on the nano-vllm workload in steady state.

    python scripts/profile_engine.py --model qwen3-0.6b --skip 300 --steps 40

Runs the first ``--skip`` steps unprofiled (prefill and warm-up), then profiles ``--steps`` decode steps
with torch.profiler and prints: wall time per step, GPU busy time per step, and the top kernels.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from llmbench.engine.config import EngineConfig
from llmbench.engine.llm_engine import LLMEngine
from llmbench.engine.sampling_params import SamplingParams

import engine_bench  # noqa: E402  (same folder: the workload definitions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--skip", type=int, default=300, help="steps run before profiling")
    ap.add_argument("--steps", type=int, default=40, help="steps profiled")
    ap.add_argument("--set", action="append", default=[], help="engine option key=value")
    args = ap.parse_args()
    options = {k: engine_bench.parse_value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    engine = LLMEngine(EngineConfig.from_options(args.model, **options))
    for i, (prompt, n) in enumerate(engine_bench.workload("throughput", 0)):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    for _ in range(args.skip):
        engine.step()
    torch.cuda.synchronize()
    seqs = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            out = engine.step()
            seqs.append(out.stats.num_seqs)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events)
    print(
        f"steps {args.steps}, batch {min(seqs)}-{max(seqs)}: wall {1000 * wall / args.steps:.2f} ms/step, "
        f"GPU kernels {gpu_us / 1000 / args.steps:.2f} ms/step"
    )
    print(events.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
