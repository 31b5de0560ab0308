"""Running an ablation: every variant in its own process, repeats interleaved (A B A B ...).

Each child is ``python -m llmbench run SCENARIO --set engine.X=Y ... --variant NAME --run-dir DIR
--session ID --repeat-index K`` (``--set backend=NAME`` when backends are compared) and writes one run folder under the ablation's folder
``<out>/<scenario>/<time>-ablate/``. A variant whose options the engine rejects (ConfigError, e.g. CUDA
Graphs on a CPU) is recorded as failed with the engine's message and never started; one whose process
fails is recorded as failed with the end of its stderr and is not run again; the others go on.
A child that outlives ``--timeout`` is stopped and its variant recorded as failed (timed out), keeping
a partial run folder if the child wrote one. ``ablation.json`` in the folder records the plan and what
became of each variant.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from llmbench.bench.ablation.plan import SAMPLING, BackendVariant, Toggle, Variant
from llmbench.bench.hardware import command_line
from llmbench.bench.scenario.loader import ResolvedScenario
from llmbench.bench.scenario.schema import Sampling
from llmbench.bench.store import slug, write_json

PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # so children import this same llmbench
CHILD_GRACE_S = 60.0  # after Ctrl-C, how long a child may take to write what it measured


class VariantState(NamedTuple):
    variant: Variant | BackendVariant
    status: str  # "pending" | "ok" | "failed"
    error: str | None
    run_dirs: list[str]


class AblationOutcome(NamedTuple):
    folder: Path
    status: str  # "complete" | "interrupted"
    variants: list[VariantState]


def config_problem(resolved: ResolvedScenario, variant: Variant | BackendVariant) -> str | None:
    """The engine's (or the peer backend's) objection to this variant, if any."""
    from llmbench.engine.config import ConfigError, EngineConfig

    sc = resolved.scenario
    if isinstance(variant, BackendVariant):
        from llmbench.bench.backends import backend_problem

        return backend_problem(sc.model_copy(update={"backend": variant.backend}))
    engine = {k: v for k, v in variant.options.items() if not k.startswith(SAMPLING)}
    sampling = {k.removeprefix(SAMPLING): v for k, v in variant.options.items() if k.startswith(SAMPLING)}
    try:
        EngineConfig.from_options(sc.model, **{**sc.engine, **engine})
        Sampling.model_validate({**sc.sampling.model_dump(), **sampling})
    except ConfigError as exc:
        return str(exc)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"sampling.{'.'.join(map(str, first['loc']))}: {first['msg']}"
    return None


def child_command(
    resolved: ResolvedScenario,
    sets: list[str],
    variant: Variant | BackendVariant,
    run_dir: Path,
    session: str,
    repeat: int,
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
    cmd += ["--session", session, "--repeat-index", str(repeat)]
    return cmd


class ChildTimeout(NamedTuple):
    seconds: float
    stderr: str


def _run_child(
    cmd: list[str], env: dict[str, str], timeout_s: float | None = None
) -> tuple[int, str] | ChildTimeout:
    """Exit status and stderr of one child. On Ctrl-C the child (same process group) gets it too and is
    given time to write its partial results before the interrupt goes on. Past ``timeout_s`` the child
    is interrupted the same way (it keeps what it measured, marked incomplete), then killed if it does
    not end within the grace period (a child stuck inside a native call never sees the interrupt)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=min(CHILD_GRACE_S, max(5.0, 0.25 * (timeout_s or 0))))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        return ChildTimeout(timeout_s or 0.0, err or "")
    except KeyboardInterrupt:
        try:  # a Ctrl-C reached the child too; a SIGTERM sent to this process alone did not
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=CHILD_GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            proc.wait()
        raise
    return proc.returncode, err


def _kept_run(run_dir: Path) -> list[str]:
    """The run folder a stopped child managed to finish (marked incomplete), if it wrote one."""
    return [str(run_dir)] if (run_dir / "summary.json").exists() else []


def _tail(text: str, lines: int = 6) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(kept[-lines:]) or "(no output)"


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
) -> AblationOutcome:
    sc = resolved.scenario
    folder = Path(out_root) / sc.name / f"{time.strftime('%Y%m%d-%H%M%S')}-ablate"
    k = 2
    while folder.exists():
        folder = folder.with_name(f"{folder.name.split('-ablate')[0]}-ablate-{k}")
        k += 1
    folder.mkdir(parents=True)
    session = folder.name
    states = {v.name: VariantState(v, "pending", None, []) for v in variants}
    for v in variants:
        problem = config_problem(resolved, v)
        if problem is not None:
            states[v.name] = VariantState(v, "failed", problem, [])
            on_event("warning", f"variant {v.name}: cannot run here: {problem}")

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])),
    }
    status = "running"  # what ablation.json says until the last variant ends (or the ablation is stopped)

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
                "status": status,
                "command_line": command_line(),
                "variants": [
                    {
                        "name": s.variant.name,
                        "options": s.variant.options,
                        "backend": getattr(s.variant, "backend", None),
                        "status": s.status,
                        "error": s.error,
                        "runs": s.run_dirs,
                    }
                    for s in states.values()
                ],
            },
        )

    record()
    try:
        for r in range(repeats):
            for v in variants:
                state = states[v.name]
                if state.status == "failed":
                    continue
                run_dir = folder / f"{slug(v.name)}-r{r}"
                on_event("phase", f"repeat {r + 1}/{repeats} · {v.name}")
                try:
                    result = _run_child(child_command(resolved, sets, v, run_dir, session, r), env, timeout_s)
                    if not isinstance(result, ChildTimeout) and result[0] == 130:
                        raise KeyboardInterrupt
                except KeyboardInterrupt:  # the child kept what it measured: list it with the variant
                    states[v.name] = state._replace(run_dirs=[*state.run_dirs, *_kept_run(run_dir)])
                    raise
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
                    error = _tail(stderr)
                    states[v.name] = state._replace(status="failed", error=error)
                    on_event("warning", f"variant {v.name} failed (exit {code}):\n{error}")
                else:
                    states[v.name] = state._replace(status="ok", run_dirs=[*state.run_dirs, str(run_dir)])
                record()
        status = "complete"
    except KeyboardInterrupt:
        status = "interrupted"
    record()
    return AblationOutcome(folder, status, list(states.values()))
