"""The engine loop's own cost: every step of the nano-vllm workload with the model replaced by a no-op.

    python scripts/host_overhead.py            # ms of host work per step
    python scripts/host_overhead.py --profile  # and where it goes (cProfile, which inflates it ~3x)

What is left is scheduling, block accounting, building the step's arrays, sampling from constant logits
and bookkeeping: the host work that a GPU step waits for when nothing overlaps it.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from llmbench.engine.config import EngineConfig
from llmbench.engine.llm_engine import LLMEngine
from llmbench.engine.sampling_params import SamplingParams

import engine_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", action="store_true", help="print the top functions by own time")
    args = ap.parse_args()
    engine = LLMEngine(
        EngineConfig.from_options("qwen3-tiny", device="cpu", max_model_len=2048, num_kv_blocks=20000)
    )
    logits = torch.zeros(256, engine.model_config.vocab_size)
    engine.runner.execute = lambda step: (logits[: len(step.logits_indices)], None, 0)
    for i, (prompt, n) in enumerate(engine_bench.workload("throughput", 0)):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    profiler = cProfile.Profile()
    steps = 0
    start = time.perf_counter()
    if args.profile:
        profiler.enable()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    if args.profile:
        profiler.disable()
    elapsed = time.perf_counter() - start
    print(f"{steps} steps, {1000 * elapsed / steps:.3f} ms of host work per step")
    if args.profile:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
