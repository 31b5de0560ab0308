"""Running an ablation: every variant in its own process, repeats interleaved and counterbalanced.

Repeat r runs the variants in plan order when r is even and in reverse when it is odd (A B, B A, A B ...),
so that neither side always runs first (warm caches, thermal drift, a neighbour's load); the order of
every repeat is recorded in ``ablation.json``. Every variant of repeat r gets the same prompts and arrival
times (seeded by the scenario seed, the sweep point and r), which is what lets the report pair them.
With ``until_ci`` the ablation keeps adding repeats after ``repeats`` until every variant's headline
metrics are known to within +-``until_ci`` percent (95% interval), or ``max_repeats`` is reached.

Each child is ``python -m llmbench run SCENARIO --set engine.X=Y ... --variant NAME --run-dir DIR
--ablation ID --repeat-index K`` (``--set backend=NAME`` when backends are compared) and writes one run folder under the ablation's folder
``<out>/<scenario>/<time>-ablate/``. Every variant is checked first: one whose options the engine (or
its peer backend) rejects, e.g. CUDA Graphs on a CPU, is a BenchError naming it and why, before anything
runs or any folder is made; so is one the workload does not fit (its longest request past the variant's
max_model_len, or, with num_kv_blocks, past the whole KV pool), where the workload's lengths are known
without a tokenizer (synthetic, shared_prefix and trace sources; prompt files are checked by each run).
A variant whose process fails is recorded as failed with the end of its stderr and is not run again; the
others go on.
A child that outlives ``--timeout`` is stopped and its variant recorded as failed (timed out), keeping
a partial run folder if the child wrote one. ``ablation.json`` in the folder records the plan, the run
order and what became of each variant; ``comparison.json`` the variants' generated tokens against the
baseline's (see ``report.outputs``), kept for when the request tables are not.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from llmbench.bench.ablation.checks import config_problem, toggles_hint, value_problem
from llmbench.bench.ablation.plan import SAMPLING, BackendVariant, Toggle, Variant
from llmbench.bench.child_process import ChildTimeout, child_error, package_env
from llmbench.bench.child_process import run_child as _run_child
from llmbench.bench.errors import BenchError, StoreError
from llmbench.bench.hardware import command_line
from llmbench.bench.scenario.loader import ResolvedScenario
from llmbench.bench.store import os_reason, owner, slug, write_json
from llmbench.interrupts import is_interrupted_exit

UNTIL_CI_METRICS = ("ttft_p50", "tpot_p50", "e2e_p50", "output_throughput")  # what --until-ci waits on
MOST_LISTED = 3  # variants named in the error when several cannot run; the rest are counted


class VariantState(NamedTuple):
    variant: Variant | BackendVariant
    status: str  # "pending" | "ok" | "failed"
    error: str | None
    run_dirs: list[str]


class AblationOutcome(NamedTuple):
    folder: Path
    status: str  # "complete" | "failed" (no variant ran) | "interrupted"
    variants: list[VariantState]


def child_command(
    resolved: ResolvedScenario,
    sets: list[str],
    variant: Variant | BackendVariant,
    run_dir: Path,
    ablation: str,
    repeat: int | None,
) -> list[str]:
    import yaml

    cmd = [sys.executable, "-m", "llmbench", "run", str(resolved.path), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    if isinstance(variant, BackendVariant):
        cmd += ["--set", f"backend={variant.backend}"]
    for key, value in variant.options.items():
        path = key if key.startswith(SAMPLING) else f"engine.{key}"  # sampling.*: a scenario setting
        cmd += [
            "--set",
            f"{path}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}",
        ]
    cmd += [
        "--profile",
        resolved.profile.name or "none",
        "--variant",
        variant.name,
        "--run-dir",
        str(run_dir),
    ]
    cmd += ["--ablation", ablation]
    if repeat is not None:  # one repeat of the scenario's; else all of them (or --repeats)
        cmd += ["--repeat-index", str(repeat)]
    return cmd


def _finished_run(run_dir: Path) -> bool:
    """Whether the child wrote its run whole (meta.json says complete) before it was stopped."""
    try:
        return json.loads((run_dir / "meta.json").read_text()).get("status") == "complete"
    except (OSError, ValueError, AttributeError):
        return False


def _kept_run(run_dir: Path) -> list[str]:
    """The run folder a stopped child managed to finish (marked incomplete), if it wrote one."""
    return [str(run_dir)] if (run_dir / "summary.json").exists() else []


def repeat_order(variants: list[Variant] | list[BackendVariant], r: int) -> list[Variant | BackendVariant]:
    """The order of repeat ``r``: plan order when r is even, reversed when odd (A B, B A, A B ...)."""
    return list(variants) if r % 2 == 0 else list(reversed(variants))


def widest_interval(folder: Path, metrics: tuple[str, ...] = UNTIL_CI_METRICS) -> float:
    """The largest 95% half-width, in percent of the estimate, over the complete variants' headline
    metrics at every point (infinite while some variant has fewer than two repeats)."""
    from llmbench.bench.report.frame import load_groups

    groups = [g for g in load_groups([folder])[0] if g.complete]
    widest = 0.0 if groups else math.inf
    for g in groups:
        for point in g.points:
            for m in metrics:
                est = g.estimate(point, m)
                if est["value"] is None or not est["value"]:
                    continue  # not measured by this backend
                if est["ci"] is None:
                    return math.inf
                half = (est["ci_high"] - est["ci_low"]) / 2
                widest = max(widest, 100 * half / abs(est["value"]))
    return widest


def write_comparison(folder: Path, baseline: str) -> None:
    """``comparison.json``: every complete variant's generated tokens against the baseline's."""
    from llmbench.bench.report.frame import load_groups
    from llmbench.bench.report.outputs import COMPARISON_FILE, ablation_comparisons

    groups = [g for g in load_groups([folder])[0] if g.complete]
    base = [g for g in groups if g.variant == baseline]
    if base:
        others = [g for g in groups if g is not base[0]]
        write_json(folder / COMPARISON_FILE, ablation_comparisons(base[0], others))


def run_ablation(
    resolved: ResolvedScenario,
    sets: list[str],
    variants: list[Variant] | list[BackendVariant],
    toggles: list[Toggle],
    design: str,
    repeats: int,
    out_root: Path,
    on_event: Callable[[str, str], None] = lambda level, text: None,
    timeout_s: float | None = None,
    until_ci: float | None = None,
    max_repeats: int | None = None,
) -> AblationOutcome:
    sc = resolved.scenario
    invalid = [(v.name, why) for v in variants if (why := value_problem(resolved, v)) is not None]
    if invalid:
        listed = "; ".join(f"{n}: {why}" for n, why in invalid[:MOST_LISTED])
        more = f"; and {len(invalid) - MOST_LISTED} more" if len(invalid) > MOST_LISTED else ""
        raise BenchError(f"not a valid value: {listed}{more}. Nothing was run.")
    cannot = [(v.name, why) for v in variants if (why := config_problem(resolved, v)) is not None]
    if cannot:
        if len(cannot) == len(variants) > 1 and len({why for _, why in cannot}) == 1:  # the scenario's own
            raise BenchError(f"no variant can run here: {cannot[0][1]}. Nothing was run.")
        if len(cannot) == 1:
            what = f"variant {cannot[0][0]} cannot run here: {cannot[0][1]}"
        else:
            listed = [f"{n}: {why}" for n, why in cannot[:MOST_LISTED]]
            if len(cannot) > MOST_LISTED:
                listed.append(f"and {len(cannot) - MOST_LISTED} more")
            what = f"{len(cannot)} variants cannot run here: " + "; ".join(listed)
        hint = "" if any(isinstance(v, BackendVariant) for v in variants) else toggles_hint(resolved)
        raise BenchError(f"{what}. Nothing was run. {hint}".rstrip())
    folder = Path(out_root) / sc.name / f"{time.strftime('%Y%m%d-%H%M%S')}-ablate"
    k = 2
    while folder.exists():
        folder = folder.with_name(f"{folder.name.split('-ablate')[0]}-ablate-{k}")
        k += 1
    try:
        folder.mkdir(parents=True)
    except OSError as exc:  # an unwritable --out, or a file on the way to it: nothing has run yet
        raise BenchError(
            f"--out {out_root}: cannot write an ablation there ({os_reason(exc, folder)})"
        ) from None
    ablation = folder.name
    states = {v.name: VariantState(v, "pending", None, []) for v in variants}

    env = package_env()
    status = "running"  # what ablation.json says until the last variant ends (or the ablation is stopped)
    order: list[list[str]] = []  # the variants each repeat started, in the order they ran
    limit = max(repeats, max_repeats or repeats) if until_ci is not None else repeats

    def record() -> None:
        write_json(
            folder / "ablation.json",
            {
                "scenario": sc.name,
                "scenario_path": str(resolved.path),
                "profile": resolved.profile._asdict(),
                "design": design,
                "baseline": variants[0].name,
                "toggles": [t._asdict() for t in toggles],
                "repeats": repeats,
                "until_ci": None if until_ci is None else {"percent": until_ci, "max_repeats": limit},
                "repeats_run": len(order),
                "order": order,
                "status": status,
                **owner(),
                "command_line": command_line(),
                "variants": [
                    {
                        "name": s.variant.name,
                        "options": s.variant.options,
                        "backend": getattr(s.variant, "backend", None),
                        "status": s.status,
                        "error": s.error,
                        "runs": [Path(p).name for p in s.run_dirs],  # folders beside ablation.json
                    }
                    for s in states.values()
                ],
            },
        )

    def more(r: int) -> bool:
        if r < repeats:
            return True
        if until_ci is None or r >= limit or not any(s.status == "ok" for s in states.values()):
            return False
        widest = widest_interval(folder)
        if widest <= until_ci:
            on_event("phase", f"every variant's headline metrics within ±{widest:.2f}% after {r} repeats")
            return False
        on_event("phase", f"widest interval ±{widest:.2f}% > ±{until_ci:g}%: one more repeat")
        return True

    record()
    try:
        r = 0
        while more(r):
            order.append([])
            for v in repeat_order(variants, r):
                state = states[v.name]
                if state.status == "failed":
                    continue
                order[-1].append(v.name)
                run_dir = folder / f"{slug(v.name)}-r{r}"
                total = str(limit) if until_ci is None else f"{limit} at most"
                on_event("phase", f"repeat {r + 1}/{total} · {v.name}")
                try:
                    result = _run_child(
                        child_command(resolved, sets, v, run_dir, ablation, r), env, timeout_s
                    )
                    if not isinstance(result, ChildTimeout) and is_interrupted_exit(result[0]):
                        raise KeyboardInterrupt
                except KeyboardInterrupt:  # the child kept what it measured: list it with the variant
                    states[v.name] = state._replace(run_dirs=[*state.run_dirs, *_kept_run(run_dir)])
                    raise
                if isinstance(result, ChildTimeout) and _finished_run(run_dir):
                    on_event(
                        "warning",
                        f"variant {v.name}: its run finished, then it outlived --timeout {result.seconds:g} s "
                        "while shutting down; the run is kept whole",
                    )
                    result = (0, result.stderr)
                if isinstance(result, ChildTimeout):
                    error = f"timed out after {result.seconds:g} s (--timeout); the run was stopped"
                    kept = _kept_run(run_dir)
                    states[v.name] = state._replace(
                        status="failed", error=error, run_dirs=[*state.run_dirs, *kept]
                    )
                    on_event("warning", f"variant {v.name}: {error}")
                    record()
                    continue
                code, stderr = result
                if code != 0:
                    error = child_error(stderr)
                    states[v.name] = state._replace(status="failed", error=error)
                    on_event("warning", f"variant {v.name} failed (exit {code}):\n{error}")
                else:
                    states[v.name] = state._replace(status="ok", run_dirs=[*state.run_dirs, str(run_dir)])
                record()
            r += 1
        status = "complete" if any(s.status == "ok" for s in states.values()) else "failed"
    except KeyboardInterrupt:
        status = "interrupted"
    record()
    try:
        write_comparison(folder, variants[0].name)
    except (StoreError, OSError, ValueError, KeyError) as exc:  # the runs are kept whatever happens here
        on_event("warning", f"outputs were not compared: {exc}")
    return AblationOutcome(folder, status, list(states.values()))
