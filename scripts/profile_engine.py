"""Where a step's time goes: host work vs GPU kernels, by kind of kernel, in steady-state decode.

    python scripts/profile_engine.py --model qwen3-0.6b --skip 300 --steps 40
    python scripts/profile_engine.py --model qwen3-8b --workload single --skip 20 --steps 100 --set tp=2

Runs the first ``--skip`` steps unprofiled (prefill and warm-up), then profiles ``--steps`` decode steps
with torch.profiler and prints: wall time per step, GPU busy time per step (and the rest: time the GPU
waited), the kernels grouped by kind (GEMM, attention, all-reduce, ...), and the top kernels. At tp > 1
the profile is rank 0's: its all-reduce kernels' time includes waiting for the other ranks.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from llmbench.engine.config import EngineConfig, nest
from llmbench.engine.llm_engine import LLMEngine
from llmbench.engine.sampling_params import SamplingParams

import engine_bench  # noqa: E402  (same folder: the workload definitions)

# Kernel name fragments (lower case) -> kind; the first match wins.
KINDS = [
    ("all-reduce / collectives", ("allreduce", "all_reduce", "allgather", "broadcast", "nccl", "one_shot")),
    ("attention", ("_decode_kernel", "_decode_reduce", "_prefill_kernel", "flash", "fmha", "attention")),
    ("attention prologue (q/k norm, RoPE, KV store)", ("_prologue_kernel", "_rotary", "_store_kv")),
    # the skinny matmul with a norm or the SiLU-and-multiply fused in counts as GEMM: it is read-bound
    ("GEMM", ("nvjet", "gemm", "gemv", "cutlass", "xmma", "sm90_", "splitk", "_skinny_matmul")),
    ("RMSNorm", ("_rms_norm",)),
    ("SiLU-mul", ("_silu_and_mul",)),
    ("copies", ("memcpy", "memset", "copy")),
]


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, fragments in KINDS:
        if any(f in low for f in fragments):
            return kind
    return "other (elementwise, argmax, gathers)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--workload", default="throughput", help="throughput, single or batchN (engine_bench.py)")
    ap.add_argument("--skip", type=int, default=300, help="steps run before profiling")
    ap.add_argument("--steps", type=int, default=40, help="steps profiled")
    ap.add_argument(
        "--set", action="append", default=[], help="engine option key=value; tuning knobs as tuning.key=value"
    )
    args = ap.parse_args()
    options = {k: engine_bench.parse_value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    engine = LLMEngine(EngineConfig.from_options(args.model, **nest(options)))
    for i, (prompt, n) in enumerate(engine_bench.workload(args.workload, 0)):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    sync = torch.cuda.synchronize if engine.config.is_cuda else (lambda: None)
    for _ in range(args.skip):
        engine.step()
    sync()
    seqs = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.config.is_cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            if not engine.has_unfinished():
                break
            seqs.append(engine.step().stats.num_seqs)
        sync()
        wall = time.perf_counter() - start
    engine.shutdown()
    steps = max(1, len(seqs))
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0 and e.device_type.name == "CUDA"]
    gpu_ms = sum(e.self_device_time_total for e in events) / 1000 / steps
    wall_ms = 1000 * wall / steps
    print(
        f"{args.model} {args.workload} {options}: {steps} steps, batch {min(seqs, default=0)}-{max(seqs, default=0)}: "
        f"wall {wall_ms:.3f} ms/step, GPU kernels {gpu_ms:.3f} ms/step, GPU idle {wall_ms - gpu_ms:.3f} ms/step"
    )
    by_kind: dict[str, list[float]] = {}
    for e in events:
        entry = by_kind.setdefault(kind_of(e.key), [0.0, 0])
        entry[0] += e.self_device_time_total / 1000 / steps
        entry[1] += e.count / steps
    print(f"{'kind':<48} {'ms/step':>9} {'kernels/step':>13}")
    for kind, (ms, count) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"{kind:<48} {ms:>9.3f} {count:>13.1f}")
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
