"""``llmbench run``: one scenario, one engine configuration, measured and stored."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.markup import escape

from llmbench.bench.scenario.loader import AUTO, ResolvedScenario, find_scenario, load_scenario, scenario_dict
from llmbench.cli.console import console, note, warning
from llmbench.cli.errors import EXIT_INTERRUPTED, handle_errors
from llmbench.cli.views import ci_note, summary_table

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


def resolve(
    scenario: str, sets: list[str] | None, profile: str, repeats: int | None = None
) -> ResolvedScenario:
    overrides = list(sets or [])
    if repeats is not None:
        overrides.append(f"repeats={repeats}")
    return load_scenario(find_scenario(scenario), overrides, profile)


def profile_line(resolved: ResolvedScenario) -> str:
    p = resolved.profile
    return f"profile: {p.name} — {p.reason}" if p.name else f"profile: none — {p.reason}"


def print_dry_run(resolved: ResolvedScenario) -> None:
    from llmbench.bench.runner import engine_config

    config = engine_config(resolved.scenario)  # ConfigError here is a clean error too
    text = yaml.safe_dump(scenario_dict(resolved.scenario), sort_keys=False)
    engine = yaml.safe_dump(config.to_dict(), sort_keys=False)
    print(
        f"# scenario: {resolved.path}\n# {profile_line(resolved)}\n{text}---\n# engine options, resolved\n{engine}",
        end="",
    )


@handle_errors
def run(
    scenario: ScenarioArg = "chat",
    out: OutOption = Path("results"),
    set_: SetOption = None,
    repeats: Annotated[
        int | None, typer.Option(min=1, help="Repeats of every point (overrides the scenario).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the resolved scenario and exit.")] = False,
    profile: ProfileOption = AUTO,
    variant: Annotated[
        str, typer.Option(help="Name of this engine configuration in the results.")
    ] = "default",
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress or notes; the summary only.")
    ] = False,
    run_dir: Annotated[Path | None, typer.Option(hidden=True)] = None,
    session: Annotated[str | None, typer.Option(hidden=True)] = None,
    repeat_index: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """Run a scenario against the built-in engine and store the results."""
    resolved = resolve(scenario, set_, profile, repeats)
    if dry_run:
        print_dry_run(resolved)
        return

    from llmbench.bench.runner import RunRequest, execute_run
    from llmbench.cli.progress import RichRunEvents

    sc = resolved.scenario
    if not quiet:
        note(f"scenario {sc.name} ({resolved.path}) · model {sc.model} · variant {variant}")
        note(profile_line(resolved))
    request = RunRequest(resolved, out, variant, run_dir, session, repeat_index)
    with RichRunEvents(quiet) as events:
        outcome = execute_run(request, events)
    startup = outcome.meta["startup"]
    if not quiet:
        note(
            f"engine startup {startup['engine_init_time']:.2f} s (weights {startup['load_time']:.2f} s, "
            f"compile {startup['compile_time']:.2f} s, graph capture {startup['graph_capture_time']:.2f} s; "
            f"{startup['kv_num_blocks']} KV blocks) — kept apart from the measurements"
        )
    title = f"{sc.name} · {variant} · {outcome.meta['engine_config']['device']}"
    console.print(summary_table(outcome.summary, title))
    if (text := ci_note(outcome.summary)) and not quiet:
        note(text)
    for w in outcome.summary["warnings"]:
        warning(w)
    if not quiet:
        for name, why in outcome.summary["unavailable"].items():
            note(f"unavailable: {name}: {why}")
    if outcome.status != "complete":
        warning(
            f"the run stopped ({outcome.stop_reason}); partial results, marked incomplete, are in {outcome.run_dir}"
        )
        raise typer.Exit(EXIT_INTERRUPTED if outcome.stop_reason == "interrupted" else 1)
    console.print(f"results: [bold]{escape(str(outcome.run_dir))}[/]", highlight=False, soft_wrap=True)
