"""What the engine's phase ranges (engine/ranges.py) cost a decode step when nothing records.

    python devtools/bench_ranges.py                                   # qwen3-tiny on the CPU
    python devtools/bench_ranges.py --model qwen3-0.6b --device cuda --batch 1

Times decode steps one by one, the three ways interleaved repeat after repeat: the ranges as shipped
(opened only while a profiler or an NVTX tool records), the ranges taken out, and every range opened as a
torch.profiler ``record_function`` with no profiler running (what always-on ranges would cost). Prints the
median step of each way and its difference from "removed", then the cost of one idle range and of the
per-step counters (engine/step_counters.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import llmbench.engine.llm_engine as llm_engine
import llmbench.engine.model_runner as model_runner
import llmbench.engine.step_upload as step_upload
from llmbench.engine import ranges
from llmbench.engine.config import EngineConfig
from llmbench.engine.sampling_params import SamplingParams


class _AlwaysOn:
    def __init__(self, name: str = "llmbench.step") -> None:
        self.record = torch.autograd.profiler.record_function(name)

    def __enter__(self) -> None:
        self.record.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.record.__exit__(None, None, None)


def _off(*args: object) -> object:
    return ranges.OFF


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=4, help="sequences decoding together")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200, help="decode steps timed per repeat and way")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    engine = llm_engine.LLMEngine(
        EngineConfig.from_options(args.model, device=args.device, max_model_len=2048)
    )
    ways = {
        "shipped": (llm_engine.phase, model_runner.phase, step_upload.phase, llm_engine.step_range),
        "removed": (_off, _off, _off, _off),
        "record_function always": (_AlwaysOn, _AlwaysOn, _AlwaysOn, _AlwaysOn),
    }
    medians: dict[str, list[float]] = {w: [] for w in ways}
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 10, ignore_eos=True)
    for r in range(args.repeats):
        for way, (phase, runner_phase, upload_phase, step_range) in ways.items():
            llm_engine.phase, model_runner.phase, llm_engine.step_range = phase, runner_phase, step_range
            step_upload.phase = upload_phase
            ids = [f"{r}-{way}-{i}" for i in range(args.batch)]
            for i, rid in enumerate(ids):
                engine.add_request(rid, [1 + i] * 16, params)
            for _ in range(3):  # the prefill, and the first decode steps
                engine.step()
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - start)
            medians[way].append(statistics.median(times))
            for rid in ids:
                engine.abort(rid)
            while engine.has_unfinished():
                engine.step()
    base = statistics.median(medians["removed"])
    for way, values in medians.items():
        m = statistics.median(values)
        print(f"{args.model} on {args.device}, batch {args.batch}: {way:>22}: decode step {m * 1e3:.4f} ms "
              f"({100 * (m - base) / base:+.2f}% against removed; repeats {min(values) * 1e3:.4f}-{max(values) * 1e3:.4f})")  # fmt: skip
    n = 100_000
    start = time.perf_counter()
    for _ in range(n):
        with ranges.phase("schedule"):
            pass
    idle_range = (time.perf_counter() - start) / n
    start = time.perf_counter()
    for _ in range(n // 10):
        engine._counters.read()
    counters = (time.perf_counter() - start) / (n // 10)
    start = time.perf_counter()
    for _ in range(n // 10):
        engine._counters.memory()
    memory = (time.perf_counter() - start) / (n // 10)
    print(f"one idle range: {idle_range * 1e9:.0f} ns; the step counters: {counters * 1e6:.2f} us, and the "
          f"memory reading {memory * 1e6:.2f} us, once each a step")  # fmt: skip
    engine.shutdown()


if __name__ == "__main__":
    main()
