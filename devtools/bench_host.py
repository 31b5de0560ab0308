"""The engine's host work per decode step, phase by phase: with the device taken out, or on a GPU.

    python devtools/bench_host.py                        # CPU: the forward replaced by a stand-in
    python devtools/bench_host.py --profile 25           # and cProfile's 25 costliest functions
    python devtools/bench_host.py --device cuda --model qwen3-0.6b --set kv_cache_dtype=fp8_e4m3

The engine runs as a benchmark runs it (the scheduler, step building, the sampler's rows, asynchronous
scheduling, and the driver that records every token) over a scenario's workload and sampling
(``--scenario``, by default nano-vllm's workload: 256 requests, lengths uniform in [100, 1024], T=0.6;
``--greedy``: T=0, ``--temperature``: another), all requests at once, each repeat with its own prompts as ``llmbench run`` draws them.
Nothing else of ``llmbench run`` (telemetry, progress, result files) runs beside it. On the CPU the model's
forward is replaced by a stand-in that builds and uploads the step's inputs and hands back an id per
sampling row at once: what is left is the host's own work, the part that must hide under the device's
step for the GPU never to wait (prompt ids are taken modulo the stand-in model's vocabulary). On a GPU
the engine is whole.

Prints, per batch-size bin of decode steps (``llmbench report --view batches``'s bins), then for prefill
and for mixed steps, the steps per run and the host's mean time per step in each phase of engine/ranges.py (``wait``, the wait for the device's ids, taken
out of copy_to_host), the driver's own handling of the tokens between steps, the rest of ``step()`` (``other``),
and the host's total (all but the wait) per step and per sequence, over ``--repeats`` runs of the workload.

``--json FILE --label NAME`` appends the main figures (the host's own time, the wait, and the phases that
move data to and from the device) to FILE as rows a ``kernels`` block of ``llmbench docs`` shows. Two
commits side by side: run this script from a checkout of each (it imports the llmbench beside it) into one
file, one after the other on one machine:

    python devtools/bench_host.py --device cuda --scenario scenarios/bench/single_0.6b.yaml \\
        --temperature 0.6 --repeats 10 --json host.json --label "$(git rev-parse --short HEAD) T=0.6"
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import llmbench.engine.llm_engine as llm_engine  # noqa: E402
import llmbench.engine.model_runner as model_runner  # noqa: E402
import llmbench.engine.step_upload as step_upload  # noqa: E402
from llmbench.bench.backends.engine import sampling_params  # noqa: E402
from llmbench.bench.derived import BATCH_EDGES  # noqa: E402
from llmbench.bench.driver import drive  # noqa: E402
from llmbench.bench.report.batches import bin_label  # noqa: E402
from llmbench.bench.scenario import load_scenario  # noqa: E402
from llmbench.bench.workload import RequestSpec, build_requests  # noqa: E402
from llmbench.engine.config import EngineConfig  # noqa: E402
from llmbench.engine.model_runner import Executed  # noqa: E402

COLUMNS = ("schedule", "build_inputs", "copy_to_device", "graph_replay", "forward", "sample", "copy_to_host",
           "wait", "bookkeeping", "driver", "other")  # fmt: skip


class PhaseClock:
    """Stands in for engine/ranges.py's ``phase``: adds each phase's host time to ``spent``."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)

    def __call__(self, name: str) -> _Timed:
        return _Timed(self.spent, name)


class _Timed:
    __slots__ = ("spent", "name", "t0")

    def __init__(self, spent: dict[str, float], name: str) -> None:
        self.spent, self.name = spent, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.spent[self.name] += time.perf_counter() - self.t0


class TimedEngine:
    """The engine as the driver sees it, each ``step()`` call's phases kept with the step it returns."""

    def __init__(self, engine: llm_engine.LLMEngine, clock: PhaseClock) -> None:
        self.engine, self.clock = engine, clock
        self.rows: list[tuple[str, int, dict[str, float]]] = []  # (kind, sequences, seconds by column)
        self._returned = time.perf_counter()

    def __getattr__(self, name: str):  # noqa: ANN204 - add_request, abort, has_unfinished...
        return getattr(self.engine, name)

    def step(self):  # noqa: ANN201
        t0 = time.perf_counter()
        self.clock.spent.clear()
        out = self.engine.step()
        t1 = time.perf_counter()
        spent = dict(self.clock.spent)
        # copy_to_host holds the wait for the device's ids (the step's own record of it) and the copy's launch
        spent["wait"] = out.stats.device_wait
        spent["copy_to_host"] = spent.get("copy_to_host", 0.0) - out.stats.device_wait
        spent["driver"] = t0 - self._returned
        spent["other"] = (t1 - t0) - sum(spent.values()) + spent["driver"]
        self._returned = t1
        self.rows.append((out.stats.kind, out.stats.num_seqs, spent))
        return out


def stand_in_forward(engine: llm_engine.LLMEngine) -> None:
    """Replace the runner's forward: inputs are still built and uploaded, ids come back at once."""
    runner = engine.runner

    def execute(step, draw=False):  # noqa: ANN001, ANN202 - ModelRunner.execute's signature
        inputs = runner.to_inputs(step)
        n = len(step.logits_indices)
        return Executed(torch.empty(0), None, 0, inputs.sample_rows, torch.ones(n, dtype=torch.int64))

    runner.execute = execute  # type: ignore[method-assign]


def table(
    rows: list[tuple[str, int, dict[str, float]]], runs: int
) -> list[tuple[str, int, dict[str, float]]]:
    """Print the table; returns its lines: (bin, steps per run, mean ms per step by column and ``host``)."""
    print(
        f"{'sequences':>10} {'steps':>6} "
        + " ".join(f"{c:>14}" for c in COLUMNS)
        + f" {'host':>7} {'us/seq':>7}"
    )
    lines = []
    groups = []
    for i, lo in enumerate(BATCH_EDGES):
        hi = BATCH_EDGES[i + 1] - 1 if i + 1 < len(BATCH_EDGES) else None
        sel = [(n, s) for kind, n, s in rows if kind == "decode" and lo <= n <= (hi or n)]
        groups.append((bin_label(lo, hi), sel))
    for kind in ("prefill", "mixed"):  # every size together
        groups.append((kind, [(n, s) for k, n, s in rows if k == kind]))
    for label, sel in groups:
        if not sel:
            continue
        mean = {c: sum(s.get(c, 0.0) for _, s in sel) / len(sel) * 1e3 for c in COLUMNS}
        host = sum(v for c, v in mean.items() if c != "wait")
        seqs = sum(n for n, _ in sel) / len(sel)
        print(
            f"{label:>10} {len(sel) // runs:>6} " + " ".join(f"{mean[c]:>14.3f}" for c in COLUMNS)
            + f" {host:>7.3f} {host * 1e3 / seqs:>7.1f}"
        )  # fmt: skip
        lines.append((label, len(sel) // runs, {**mean, "host": host}))
    return lines


JSON_COLUMNS = ("host", "wait", "copy_to_device", "graph_replay", "copy_to_host")  # the rows --json keeps


def write_json(path: Path, lines: list[tuple[str, int, dict[str, float]]], label: str, what: str) -> None:
    """Append the lines' main columns to ``path`` as rows a ``kernels`` block of ``llmbench docs`` shows
    (kernel, shape, time_us): run from two checkouts into one file, they sit side by side."""
    rows = json.loads(path.read_text()) if path.exists() else []
    for bin_, _, mean in lines:
        kind = f"{bin_} steps" if bin_ in ("prefill", "mixed") else f"decode steps, batch {bin_}"
        shape = f"{what}, {kind}"
        for c in JSON_COLUMNS:
            name = "host's own time" if c == "host" else ("waiting on the device" if c == "wait" else c)
            rows.append({"kernel": f"{label}: {name}", "shape": shape, "time_us": mean[c] * 1e3})
    path.write_text(json.dumps(rows, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="default: qwen3-tiny on the CPU, qwen3-0.6b on a GPU")
    ap.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE", help="an engine option")
    ap.add_argument(
        "--scenario", default=str(Path(__file__).resolve().parents[1] / "scenarios/throughput.yaml")
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--greedy", action="store_true", help="temperature 0 (default: the scenario's)")
    ap.add_argument(
        "--temperature", type=float, default=None, help="this temperature instead of the scenario's"
    )
    ap.add_argument("--json", type=Path, default=None, metavar="FILE", help="append the main figures here")
    ap.add_argument(
        "--label", default="", help="names this run's rows in --json's file (a commit, a variant)"
    )
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="then print cProfile's N costliest")
    args = ap.parse_args()
    cpu = args.device == "cpu"
    options: dict = {"device": args.device, "max_model_len": 4096}
    if cpu:
        torch.set_num_threads(1)
        options.update(async_scheduling=True, max_num_seqs=512, num_kv_blocks=40_000)
    for item in args.set:
        key, _, value = item.partition("=")
        options[key] = yaml.safe_load(value)
    clock = PhaseClock()
    llm_engine.phase = model_runner.phase = step_upload.phase = clock  # type: ignore[assignment]
    engine = llm_engine.LLMEngine(
        EngineConfig.from_options(args.model or ("qwen3-tiny" if cpu else "qwen3-0.6b"), **options)
    )
    if cpu:
        stand_in_forward(engine)
    timed = TimedEngine(engine, clock)
    scenario = load_scenario(args.scenario, profile="none").scenario
    temperature = 0.0 if args.greedy else args.temperature
    if temperature is not None:
        scenario = scenario.model_copy(
            update={"sampling": scenario.sampling.model_copy(update={"temperature": temperature})}
        )
    vocab = engine.model_info.vocab_size

    def specs_for(salt: int) -> list[RequestSpec]:
        specs = build_requests(scenario.workload, engine.tokenizer, 1 << 31, scenario.seed, salt)
        return [s._replace(prompt=[t % vocab for t in s.prompt]) for s in specs]

    def params(spec: RequestSpec):  # noqa: ANN202
        return sampling_params(scenario, spec)

    warm = drive(timed, specs_for(99)[:8], None, params, concurrency=8, tag="w-")
    profiler = cProfile.Profile() if args.profile else None
    timed.rows.clear()
    for r in range(args.repeats):
        engine.reset_prefix_cache()
        if profiler is not None and r == args.repeats - 1:
            profiler.enable()
        specs = specs_for(r)
        result = drive(timed, specs, None, params, concurrency=len(specs), tag=f"{r}-")
        if profiler is not None:
            profiler.disable()
        for res in (warm, result):
            if res.status != "complete":
                sys.exit(f"run {r + 1}: {res.status}\n{res.error or ''}")
        tokens = sum(len(q.token_ids) for q in result.requests)
        print(f"run {r + 1}: {tokens / (result.end - result.start):,.0f} output tok/s")
    lines = table(timed.rows, args.repeats)
    if args.json is not None:
        what = f"{engine.config.model} on {args.device}, {scenario.name}, T={scenario.sampling.temperature:g}"
        write_json(args.json, lines, args.label, what)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    engine.shutdown()


if __name__ == "__main__":
    main()
