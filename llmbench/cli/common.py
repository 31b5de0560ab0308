"""What the commands that run a scenario (``run``, ``ablate``, ``profile``, ``quality``) share: the scenario
argument and its options, loading the scenario they name, and the lines a run prints about itself."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from llmbench.bench.scenario.loader import ResolvedScenario, find_scenario, load_scenario, scenario_dict

ScenarioArg = Annotated[
    str, typer.Argument(help="Scenario YAML file, or the name of a shipped one (chat, throughput, ...).")
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override a scenario field: KEY.PATH=VALUE (YAML value), e.g. workload.num_requests=64."
    ),
]
OutOption = Annotated[
    Path, typer.Option("--out", "-o", help="Results root; runs go to OUT/<scenario>/<time>-<variant>/.")
]
ProfileOption = Annotated[
    str, typer.Option(help="Scenario profile to apply: 'auto' (by device), 'none', or a profile name.")
]


def load_scenario_arg(
    scenario: str, sets: list[str] | None, profile: str, repeats: int | None = None
) -> ResolvedScenario:
    """The scenario a command names (a file, or a shipped scenario's name), with its ``--set`` overrides,
    ``--repeats`` and profile applied."""
    overrides = list(sets or [])
    if repeats is not None:
        overrides.append(f"repeats={repeats}")
    return load_scenario(find_scenario(scenario), overrides, profile)


def profile_line(resolved: ResolvedScenario) -> str:
    p = resolved.profile
    if not p.name:
        return f"profile: none — {p.reason}"
    return f"profile: {p.name} — {p.reason}" + (f"; it changes {p.changes}" if p.changes else "")


def print_dry_run(resolved: ResolvedScenario) -> None:
    """The scenario, then each backend's options as resolved, once every check ``run`` makes before any cost
    has passed (ConfigError here is a clean error too): a scenario it prints is one ``run`` would start."""
    from llmbench.bench.backends import make_backend
    from llmbench.bench.runner import preflight

    sc = resolved.scenario
    text = yaml.safe_dump(scenario_dict(sc), sort_keys=False)
    out = f"# scenario: {resolved.path}\n# {profile_line(resolved)}\n{text}"
    for name in sc.backends:
        one = sc.model_copy(update={"backend": name})
        backend = make_backend(one)
        preflight(resolved._replace(scenario=one), backend)
        out += f"---\n# {name} options, resolved\n{yaml.safe_dump(backend.describe(), sort_keys=False)}"
    print(out, end="")


def startup_line(backend: str, startup: dict[str, Any]) -> str:
    blocks = f"; {startup['kv_num_blocks']} KV blocks" if startup.get("kv_num_blocks") is not None else ""
    if startup.get("kv_capacity_tokens"):  # the engine's pool: its element type and what it holds
        blocks += (
            f" = {startup['kv_capacity_tokens']:,} tokens of {startup['kv_cache_dtype']} K/V, "
            f"{startup['kv_bytes_per_token']:,} bytes each"
        )
    if startup.get("all_reduce"):  # tensor parallelism: the pool above is one rank's, of its heads
        blocks += f", per rank (the ranks sum their parts over {startup['all_reduce']})"
    # the parts a backend measured: a remote server's weights, compile and graphs are not the client's to time
    parts = [
        f"{label} {startup[key]:.2f} s"
        for label, key in (
            ("weights", "load_time"),
            ("compile", "compile_time"),
            ("graph capture", "graph_capture_time"),
        )
        if startup.get(key) is not None
    ]
    inside = ", ".join(parts) + blocks.removeprefix("; " if not parts else "")
    return (
        f"{backend} startup {startup['engine_init_time']:.2f} s" + (f" ({inside})" if inside else "")
        + " — kept apart from the measurements"
    )  # fmt: skip


def unavailable_notes(unavailable: dict[str, str]) -> list[str]:
    """One line per reason, naming every figure it covers."""
    by_reason: dict[str, list[str]] = {}
    for name, why in unavailable.items():
        by_reason.setdefault(why, []).append(name)
    return [f"unavailable: {', '.join(names)}: {why}" for why, names in by_reason.items()]


def listen_for_interrupts() -> None:
    """A child of ``ablate`` or ``profile`` (given ``--ablation``) is stopped by its parent with SIGINT, so
    that it keeps what it measured: it must hear it. A process started with SIGINT ignored keeps it
    ignored (Python installs its handler only where it is not), and a job that a shell script starts in
    the background is started so, along with everything it starts: its children then ran on past their
    timeout until killed, losing their partial results."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
