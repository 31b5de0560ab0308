"""``llmbench ablate``: the same scenario with optimisations switched, or served by other backends, each
variant in its own process."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from llmbench.bench.errors import BenchError
from llmbench.cli.console import console, error, note, warning
from llmbench.cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, handle_errors
from llmbench.cli.report import MinEffectOption
from llmbench.cli.run import OutOption, ProfileOption, SetOption, profile_line, resolve


class Design(enum.StrEnum):
    flip = "flip"
    one_at_a_time = "one-at-a-time"
    leave_one_out = "leave-one-out"
    factorial = "factorial"


@handle_errors
def ablate(
    scenario: Annotated[str, typer.Argument(help="Scenario YAML file or shipped name.")] = "chat",
    toggle: Annotated[
        list[str] | None,
        typer.Option(
            "--toggle",
            "-t",
            help="Engine toggle to vary (repeatable): cuda_graph, paged_kv, ..., or NAME=A,B to pick the values compared; "
            "sampling.temperature=0,0.6 (and sampling.top_k, top_p, min_p, seed) compares sampling settings.",
        ),
    ] = None,
    backend: Annotated[
        list[str] | None,
        typer.Option(
            "--backend",
            "-b",
            help="Backend to compare (repeatable, the first is the baseline): engine, transformers, openai. "
            "Default: the scenario's own list of backends, when it has one.",
        ),
    ] = None,
    design: Annotated[Design, typer.Option(help="Which combinations of the toggles to run.")] = Design.flip,
    repeats: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Repeats per variant, interleaved and counterbalanced A B, B A, ... (default: the "
            "scenario's). Verdicts need 2 or more.",
        ),
    ] = None,
    out: OutOption = Path("results"),
    set_: SetOption = None,
    profile: ProfileOption = "auto",
    timeout: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="Seconds one run (one variant, one repeat) may take, start-up included; past it the run "
            "is stopped and its variant marked failed, and the others go on. Default: no limit.",
        ),
    ] = None,
    min_effect: MinEffectOption = 1.0,
    until_ci: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="After --repeats, keep adding repeats until every variant's TTFT/TPOT/E2E p50 and output "
            "throughput are known to within +-PCT percent (95% interval), up to --max-repeats.",
            metavar="PCT",
        ),
    ] = None,
    max_repeats: Annotated[
        int, typer.Option(min=1, help="The most repeats --until-ci may run per variant.")
    ] = 10,
) -> None:
    """Run the scenario once per variant (each in its own process) and print the deltas against the baseline."""
    from llmbench.bench.ablation import (
        BACKENDS_DESIGN,
        BackendVariant,
        parse_toggle,
        plan,
        plan_backends,
        run_ablation,
    )
    from llmbench.bench.report import build_report
    from llmbench.bench.runner import engine_config
    from llmbench.cli.views import print_view
    from llmbench.engine.tp import launched_rank

    if launched_rank() is not None:
        raise BenchError(
            "ablate starts every variant in a process of its own, which torchrun's ranks cannot follow: "
            "run `llmbench ablate` without torchrun (tp on one host), or `llmbench run` under torchrun"
        )
    resolved = resolve(scenario, set_, profile)
    sc = resolved.scenario
    if toggle and backend:
        raise BenchError(
            "--toggle varies the engine's options and --backend compares backends: give one or the other"
        )
    if toggle:
        if sc.backends != ["engine"]:
            raise BenchError(
                f"--toggle varies the engine's options, but this scenario is served by {', '.join(sc.backends)}; "
                "add --set backend=engine, or compare backends with --backend"
            )
        config = engine_config(sc)  # the scenario itself must be runnable
        toggles = [parse_toggle(t) for t in toggle]
        variants = plan(design.value, toggles, config, sc.sampling)
        design_name = design.value
    elif backend or len(sc.backends) > 1:
        toggles = []
        variants = plan_backends(list(backend or sc.backends))
        design_name = BACKENDS_DESIGN
    else:
        raise BenchError(
            "give at least one --toggle (e.g. llmbench ablate --toggle cuda_graph) or two --backend "
            "(e.g. --backend engine --backend transformers)"
        )
    n = repeats or sc.repeats
    note(f"ablation of {sc.name} ({resolved.path}) · design {design_name} · {n} repeat(s) per variant")
    note(profile_line(resolved))
    for v in variants:
        opts = ", ".join(f"{k}={val}" for k, val in v.options.items()) or (
            f"the {v.backend} backend" if isinstance(v, BackendVariant) else "the scenario's engine options"
        )
        note(f"  {v.name}: {opts}")

    def on_event(level: str, text: str) -> None:
        (warning if level == "warning" else note)(text if level == "warning" else f"· {text}")

    outcome = run_ablation(
        resolved,
        list(set_ or []),
        variants,
        toggles,
        design_name,
        n,
        out,
        on_event,
        timeout_s=timeout,
        until_ci=until_ci,
        max_repeats=max_repeats,
    )
    baseline = variants[0].name
    ok = [s for s in outcome.variants if s.status == "ok"]
    failed = [s for s in outcome.variants if s.status == "failed"]
    if ok:
        rep = build_report(
            [outcome.folder],
            baseline if any(s.variant.name == baseline for s in ok) else None,
            min_effect / 100,
        )
        for section in rep.sections:
            for view in section.views:
                print_view(view, console)
    for s in failed:
        first = (s.error or "").splitlines()[0] if s.error else "unknown error"
        error(f"variant {s.variant.name} failed: {first}")
    console.print(f"results: [bold]{escape(str(outcome.folder))}[/]", highlight=False, soft_wrap=True)
    if outcome.status == "interrupted":
        warning("the ablation was interrupted; what was measured is kept")
        raise typer.Exit(EXIT_INTERRUPTED)
    if not any(s.variant.name == baseline for s in ok):
        error("the baseline did not run, so nothing was compared")
        raise typer.Exit(EXIT_FAILED)
    if failed:
        raise typer.Exit(EXIT_FAILED)
