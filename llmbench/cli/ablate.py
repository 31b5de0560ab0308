"""``llmbench ablate``: the same scenario with optimisations switched, or served by other backends, each
variant in its own process; with ``--quality``, each variant's outputs against the baseline's too."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from llmbench.bench.ablation.request import DEFAULT_MAX_REPEATS
from llmbench.bench.errors import BenchError, error_headline
from llmbench.bench.stats import MIN_VERDICT_REPEATS
from llmbench.cli.common import OutOption, ProfileOption, SetOption, load_scenario_arg, profile_line
from llmbench.cli.console import console, error, note, warning
from llmbench.cli.errors import EXIT_FAILED, handle_errors
from llmbench.cli.report import MinEffectOption
from llmbench.interrupts import interrupted_exit


class Design(enum.StrEnum):
    flip = "flip"
    one_at_a_time = "one-at-a-time"
    leave_one_out = "leave-one-out"
    factorial = "factorial"


DESIGN_HELP = (
    "Which combinations of the toggles to run against the baseline: flip (every named toggle flipped at "
    "once: one variant, or one per combination of the values given), one-at-a-time (one variant per toggle, or per value given), leave-one-out "
    "(from every toggle on, each turned off alone; a toggle with values takes two, NAME=ON,OFF), factorial "
    "(every combination of the toggles' on/off or given values)."
)


@handle_errors
def ablate(
    scenario: Annotated[str, typer.Argument(help="Scenario YAML file or shipped name.")] = "chat",
    toggle: Annotated[
        list[str] | None,
        typer.Option(
            "--toggle",
            "-t",
            help="Engine toggle to vary (repeatable): cuda_graph, paged_kv, ..., tuning.tp_fuse_norm; or NAME=A,B "
            "to pick the values compared, for any option (max_num_seqs=128,256, tuning.skinny_matmul_rows=0,1); "
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
    design: Annotated[Design, typer.Option(help=DESIGN_HELP)] = Design.flip,
    repeats: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Repeats per variant, interleaved and counterbalanced A B, B A, ... (default: the "
            f"scenario's). Intervals need 2 or more, verdicts {MIN_VERDICT_REPEATS} or more.",
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
        int | None,
        typer.Option(
            min=1, help=f"The most repeats --until-ci may run per variant (default {DEFAULT_MAX_REPEATS})."
        ),
    ] = None,
    quality: Annotated[
        bool,
        typer.Option(
            "--quality",
            help="Also compare each variant's outputs with the baseline's, each in its own process: KL "
            "divergence of the next-token distributions (mean, p99) and top-1 agreement, teacher-forced on "
            "the baseline's greedy continuation, and where free-running greedy outputs first differ "
            "(quality.json, and rows in the report).",
        ),
    ] = False,
    quality_prompts: Annotated[
        int, typer.Option(min=1, help="--quality: how many of the scenario's requests to use as prompts.")
    ] = 8,
    quality_tokens: Annotated[
        int,
        typer.Option(
            min=1, max=4096, help="--quality: tokens compared per prompt (each keeps a vocabulary-sized row)."
        ),
    ] = 32,
    quality_text: Annotated[
        Path | None,
        typer.Option(
            help="--quality: a text file; baseline and variants also report perplexity on its first 4096 "
            "tokens (it means something with a real checkpoint, not a preset's random weights).",
        ),
    ] = None,
) -> None:
    """Run the scenario once per variant (each in its own process) and print the deltas against the baseline."""
    from llmbench.bench.ablation import run_ablation
    from llmbench.bench.ablation.request import AblationRequest, settle
    from llmbench.bench.report import build_report
    from llmbench.cli.views import print_view
    from llmbench.engine.tp import launched_rank

    if launched_rank() is not None:
        raise BenchError(
            "ablate starts every variant in a process of its own, which torchrun's ranks cannot follow: "
            "run `llmbench ablate` without torchrun (tp on one host), or `llmbench run` under torchrun"
        )
    resolved = load_scenario_arg(scenario, set_, profile)
    request = AblationRequest(
        list(toggle or []),
        list(backend or []),
        design.value,
        repeats,
        until_ci,
        max_repeats,
        quality,
        quality_text,
    )
    planned = settle(request, resolved)
    variants = planned.variants
    head, *lines = planned.describe()
    note(f"ablation of {resolved.scenario.name} ({resolved.path}) · {head}")
    note(profile_line(resolved))
    for line in lines:
        note(line)

    def on_event(level: str, text: str) -> None:
        (warning if level == "warning" else note)(text if level == "warning" else f"· {text}")

    outcome = run_ablation(
        resolved,
        list(set_ or []),
        variants,
        planned.toggles,
        planned.design,
        planned.repeats,
        out,
        on_event,
        timeout_s=timeout,
        until_ci=until_ci,
        max_repeats=planned.max_repeats,
    )
    quality_failed = False
    if quality:
        from llmbench.bench.ablation.quality import quality_after
        from llmbench.bench.quality.measure import QualitySettings

        settings = QualitySettings(
            quality_prompts, quality_tokens, str(quality_text.resolve()) if quality_text else None
        )
        outcome, quality_failed = quality_after(
            outcome, resolved, list(set_ or []), variants, settings, on_event, timeout
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
        first = error_headline(s.error or "")
        error(f"variant {s.variant.name} failed: {first}")
    console.print(f"results: [bold]{escape(str(outcome.folder))}[/]", highlight=False, soft_wrap=True)
    if outcome.status == "interrupted":
        warning("the ablation was interrupted; what was measured is kept")
        raise typer.Exit(interrupted_exit())
    if not any(s.variant.name == baseline for s in ok):
        error("the baseline did not run, so nothing was compared")
        raise typer.Exit(EXIT_FAILED)
    if failed or quality_failed:
        raise typer.Exit(EXIT_FAILED)
