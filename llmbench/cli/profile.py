"""``llmbench profile``: where each variant's step time goes, recorded with torch.profiler."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from llmbench.bench.errors import BenchError, error_headline
from llmbench.bench.slow_steps import SLOW_FACTOR
from llmbench.cli.ablate import DESIGN_HELP, Design
from llmbench.cli.common import ProfileOption, SetOption, load_scenario_arg, profile_line
from llmbench.cli.console import console, error, note, warning
from llmbench.cli.errors import EXIT_FAILED, handle_errors
from llmbench.interrupts import interrupted_exit

if TYPE_CHECKING:
    from llmbench.bench.scenario.schema import Scenario


def check_steady_state(sc: Scenario, steps: int, config) -> None:
    """A scenario whose requests cannot make ``steps`` engine steps has no window to profile. Known for
    synthetic workloads with bounded lengths: each request makes at most its prefill chunks plus one
    step per further output token."""
    w = sc.workload
    if w.num_requests is None or w.input_len is None or w.output_len is None:
        return
    longest_in, longest_out = w.input_len.upper_bound, w.output_len.upper_bound
    if longest_in is None or longest_out is None:
        return
    if w.prefix_len is not None:
        if w.prefix_len.upper_bound is None:
            return
        longest_in += w.prefix_len.upper_bound
    chunks = math.ceil(longest_in / config.max_num_batched_tokens) if config.chunked_prefill else 1
    most = w.num_requests * (chunks + longest_out - 1)
    if most < steps:
        raise BenchError(
            f"no steady state to profile: the scenario's {w.num_requests} request(s) of at most {longest_out} "
            f"output tokens make at most {most} engine step(s), and the window needs {steps} steps of a kind "
            "(--steps); give it more requests or longer outputs (--set workload.num_requests=N), or "
            "lower --steps"
        )


@handle_errors
def profile(
    scenario: Annotated[str, typer.Argument(help="Scenario YAML file or shipped name.")],
    toggle: Annotated[
        list[str] | None,
        typer.Option(
            "--toggle",
            "-t",
            help="Engine toggle to vary (repeatable), as in ablate: each variant is profiled and compared "
            "with the baseline. None: the scenario alone.",
        ),
    ] = None,
    design: Annotated[Design, typer.Option(help=DESIGN_HELP)] = Design.flip,
    steps: Annotated[
        int,
        typer.Option(min=1, help="Steps of each kind (prefill, decode, mixed) in the recorded window."),
    ] = 20,
    slow_steps: Annotated[
        bool,
        typer.Option(
            "--slow-steps",
            help="Keep recording until the run ends, in chunks, and keep the chunks that hold a slow step.",
        ),
    ] = False,
    slow_step_factor: Annotated[
        float, typer.Option(min=1.0, help="A step this many times the median of its kind is slow.")
    ] = SLOW_FACTOR,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Results root; a profile goes to OUT/<scenario>/<time>-profile/, one folder per variant "
            "(its run, its traces and its profile.json).",
        ),
    ] = Path("results"),
    set_: SetOption = None,
    profile: ProfileOption = "auto",
    timeout: Annotated[
        float | None,
        typer.Option(min=1, help="Seconds one variant may take, start-up included; past it it is stopped."),
    ] = None,
) -> None:
    """Record each variant's steady-state steps with torch.profiler and show where their time goes."""
    from llmbench.bench.ablation import BASELINE, Variant, parse_toggle, plan
    from llmbench.bench.backends.engine import engine_config
    from llmbench.bench.profile.caveats import comparison_view, read_beside, variant_views
    from llmbench.bench.profile.execute import (
        ProfileSettings,
        check_variants,
        new_folder,
        run_profile,
    )
    from llmbench.cli.views import print_view
    from llmbench.engine.tp import launched_rank

    if launched_rank() is not None:
        raise BenchError(
            "profile starts every variant in a process of its own, which torchrun's ranks cannot follow: "
            "run `llmbench profile` without torchrun"
        )
    resolved = load_scenario_arg(scenario, set_, profile)
    sc = resolved.scenario
    if sc.backends != ["engine"]:
        raise BenchError(
            f"profile records the built-in engine, but this scenario is served by {', '.join(sc.backends)}; "
            "add --set backend=engine"
        )
    config = engine_config(sc)  # the scenario itself must be runnable
    if toggle:
        variants = plan(design.value, [parse_toggle(t) for t in toggle], config)
    else:
        variants = [Variant(BASELINE, {})]
    check_variants(resolved, variants)
    check_steady_state(sc, steps, config)
    folder = new_folder(out, sc.name)
    note(f"profile of {sc.name} ({resolved.path}) · {steps} steps of each kind · one run per variant")
    note(profile_line(resolved))
    for v in variants:
        note(f"  {v.name}: {', '.join(f'{k}={x}' for k, x in v.options.items()) or 'the scenario as it is'}")

    def on_event(level: str, text: str) -> None:
        (warning if level == "warning" else note)(text if level == "warning" else f"· {text}")

    settings = ProfileSettings(steps, slow_steps, slow_step_factor, timeout)
    outcome = run_profile(resolved, list(set_ or []), variants, settings, folder, on_event)
    shown = {}  # each variant with a profile: its label (marked when it failed or stopped), its run's say
    for v in outcome.variants:
        if v.profile is None:
            continue
        ok = v.status == "ok"
        mark = "timed out" if (v.error or "").startswith("timed out") else v.status
        label = v.variant.name if ok else f"{v.variant.name} ({mark})"
        beside = read_beside(v.folder / "run", None if ok else error_headline(v.error or ""))
        shown[v.variant.name] = (v.profile, label, beside)
        for view in variant_views(v.profile, beside, label):  # its notes under its breakdown
            print_view(view, console)
    for d in outcome.diffs:
        (base, base_label, base_side), (other, label, side) = shown[variants[0].name], shown[d["variant"]]
        view = comparison_view(base_label, label, base, other, (base_side, side))
        if view is not None:
            print_view(view, console)
    failed = [v for v in outcome.variants if v.status == "failed"]
    for v in failed:
        error(f"variant {v.variant.name} failed: {error_headline(v.error or 'unknown error')}")
    console.print(
        f"profile: [bold]{escape(str(outcome.folder))}[/] (traces: <variant>/trace-*.json.gz)",
        highlight=False,
        soft_wrap=True,
    )
    if outcome.status == "interrupted":
        warning("the profile was interrupted; what was recorded is kept, marked incomplete")
        raise typer.Exit(interrupted_exit())
    if failed or not outcome.variants:
        raise typer.Exit(EXIT_FAILED)
