"""Running a profile: every variant in its own process, then the variants' profiles compared.

Variants come from the ablation planner (``--toggle``/``--design``; none: the scenario alone, as
"baseline"). Each is checked before anything runs (a toggle that cannot apply here is an error naming the
engine's reason), then run as ``python -m llmbench run SCENARIO ... --run-dir DIR/run --trace-dir DIR``
(ablation/execute.py's child, two repeats: the first untraced, for reference, the second traced; with the
profile's hidden options) into
``<out>/<scenario>/<time>-profile/<variant>/``: the run folder ``run/``, the traces and the variant's
``profile.json`` (summary.py). ``profile.json`` in the profile's folder records the plan, what became of
each variant and the comparison of each against the baseline (diff.py). A variant whose process fails is
recorded as failed, with the end of its stderr less the profiler's own log lines, and the others go on;
so is one that outlives ``--timeout`` (stopped, keeping what it recorded). The profile is complete when
some variant is, failed when none is (as an ablation). Ctrl-C stops the profile after the running child
has written what it recorded, marked incomplete.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from llmbench.bench.ablation.checks import config_problem, toggles_hint
from llmbench.bench.ablation.execute import (
    ChildTimeout,
    _run_child,
    child_command,
    child_error,
)
from llmbench.bench.ablation.plan import Variant
from llmbench.bench.child_process import package_env
from llmbench.bench.errors import BenchError
from llmbench.bench.hardware import command_line
from llmbench.bench.profile.caveats import one_sided_notes
from llmbench.bench.profile.diff import diff_rows
from llmbench.bench.scenario.loader import ResolvedScenario
from llmbench.bench.store import os_reason, owner, slug, write_json
from llmbench.interrupts import is_interrupted_exit


class ProfileSettings(NamedTuple):
    steps: int  # steps of each kind in the window
    slow_steps: bool  # also record around slow steps
    slow_factor: float
    timeout_s: float | None


class VariantProfile(NamedTuple):
    variant: Variant
    folder: Path
    status: str  # "ok" | "failed" | "incomplete"
    error: str | None
    profile: dict[str, Any] | None  # the variant's profile.json


class ProfileOutcome(NamedTuple):
    folder: Path
    status: str  # "complete" | "failed" (no variant profiled) | "interrupted"
    variants: list[VariantProfile]
    diffs: list[dict[str, Any]]


def check_variants(resolved: ResolvedScenario, variants: list[Variant]) -> None:
    """Every variant must be able to run here: an error names the first that cannot, and why."""
    for v in variants:
        problem = config_problem(resolved, v)
        if problem is not None:
            what = "the scenario itself" if not v.options else f"variant {v.name}"
            hint = toggles_hint(resolved) if v.options else ""
            raise BenchError(f"{what} cannot run here: {problem}" + (f". {hint}" if hint else ""))


def new_folder(out_root: Path, scenario: str) -> Path:
    """``<out>/<scenario>/<time>-profile`` (``-2``, ``-3``... if taken); an unwritable ``--out`` is an
    input error before anything runs."""
    base = Path(out_root) / scenario / f"{time.strftime('%Y%m%d-%H%M%S')}-profile"
    folder, k = base, 2
    while folder.exists():
        folder = base.with_name(f"{base.name}-{k}")
        k += 1
    try:
        folder.mkdir(parents=True)
        probe = folder / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise BenchError(
            f"--out {out_root}: cannot write a profile there ({os_reason(exc, folder)})"
        ) from None
    return folder


# kineto's log lines (``USDT:2026-12-05 17:13:40 17501:17501 SyncActivityProfilerHandler.cpp:52]
# profiler_start``, ``STAGE:...``): written as a trace starts and stops, they say nothing of a failure
_PROFILER_LOG = re.compile(r"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \d+:\d+ \S+:\d+\] ")


def variant_error(stderr: str) -> str:
    """What a failed child said last (ablation/execute.py ``child_error``), the profiler's log left out."""
    return child_error("\n".join(ln for ln in stderr.splitlines() if not _PROFILER_LOG.match(ln)))


def _read_profile(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / "profile.json").read_text())
    except (OSError, ValueError):
        return None


def run_profile(
    resolved: ResolvedScenario,
    sets: list[str],
    variants: list[Variant],
    settings: ProfileSettings,
    folder: Path,
    on_event: Callable[[str, str], None] = lambda level, text: None,
) -> ProfileOutcome:
    sc = resolved.scenario
    env = package_env()
    done: list[VariantProfile] = []
    status = "running"

    def record(diffs: list[dict[str, Any]]) -> None:
        write_json(
            folder / "profile.json",
            {
                "scenario": sc.name,
                "scenario_path": str(resolved.path),
                "status": status,
                **owner(),
                "baseline": variants[0].name,
                "steps_per_kind": settings.steps,
                "slow_steps": settings.slow_steps,
                "command_line": command_line(),
                "variants": [
                    {
                        "name": v.variant.name,
                        "options": v.variant.options,
                        "status": v.status,
                        "error": v.error,
                        "folder": v.folder.name,
                    }
                    for v in done
                ],  # fmt: skip
                "diffs": diffs,
            },
        )

    record([])
    try:
        for v in variants:
            target = folder / slug(v.name)
            on_event("phase", f"profiling {v.name}")
            # two repeats: the first untraced, the reference the traced second one is compared with
            cmd = child_command(resolved, sets, v, target / "run", folder.name, None)
            cmd += ["--repeats", "2", "--trace-reference"]
            cmd += ["--trace-dir", str(target), "--trace-steps", str(settings.steps)]
            cmd += ["--slow-step-factor", str(settings.slow_factor)]
            if settings.slow_steps:
                cmd.append("--trace-slow-steps")
            try:
                result = _run_child(cmd, env, settings.timeout_s)
            except KeyboardInterrupt:
                done.append(VariantProfile(v, target, "incomplete", "interrupted", _read_profile(target)))
                raise
            # a child stopped at --timeout was interrupted too (and kept what it recorded): not a Ctrl-C
            if not isinstance(result, ChildTimeout) and is_interrupted_exit(result[0]):
                done.append(VariantProfile(v, target, "incomplete", "interrupted", _read_profile(target)))
                raise KeyboardInterrupt
            profile = _read_profile(target)
            if isinstance(result, ChildTimeout):
                error = f"timed out after {result.seconds:g} s (--timeout); the run was stopped"
                done.append(VariantProfile(v, target, "failed", error, profile))
                on_event("warning", f"variant {v.name}: {error}")
            elif result[0] != 0 or profile is None:
                error = variant_error(result[1]) if result[0] != 0 else "the variant wrote no profile.json"
                done.append(VariantProfile(v, target, "failed", error, profile))
                on_event("warning", f"variant {v.name} failed (exit {result[0]}):\n{error}")
            elif not profile.get("kinds"):
                error = "no steady step was recorded: the run made too few steps for the window"
                done.append(VariantProfile(v, target, "failed", error, profile))
                on_event("warning", f"variant {v.name}: {error}")
            else:
                done.append(VariantProfile(v, target, "ok", None, profile))
            record([])
        status = "complete" if any(v.status == "ok" for v in done) else "failed"
    except KeyboardInterrupt:
        status = "interrupted"
    base = done[0] if done and done[0].variant.name == variants[0].name else None
    diffs = []
    if base is not None and base.profile is not None and base.profile.get("kinds"):
        for other in done[1:]:
            if other.profile is not None and other.profile.get("kinds"):  # else nothing to compare
                diffs.append(
                    {
                        "variant": other.variant.name,
                        "rows": diff_rows(base.profile, other.profile),
                        "notes": one_sided_notes(
                            base.variant.name, other.variant.name, base.profile, other.profile
                        ),
                    }
                )
    record(diffs)
    return ProfileOutcome(folder, status, done, diffs)
