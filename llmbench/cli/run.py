"""``llmbench run``: one scenario, one engine configuration, measured and stored."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from llmbench.bench.errors import BenchError
from llmbench.bench.scenario.loader import AUTO
from llmbench.bench.slow_steps import SLOW_FACTOR
from llmbench.cli.common import (
    OutOption,
    ProfileOption,
    ScenarioArg,
    SetOption,
    listen_for_interrupts,
    load_scenario_arg,
    print_dry_run,
    profile_line,
    startup_line,
    unavailable_notes,
)
from llmbench.cli.console import console, error, note, warning
from llmbench.cli.errors import EXIT_FAILED, handle_errors
from llmbench.interrupts import held_interrupts, interrupted_exit


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
    slow_step_factor: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="A step this many times slower than the median of its kind (prefill, decode, mixed) is "
            "flagged slow, with its causes, in steps.parquet and the summary.",
        ),
    ] = SLOW_FACTOR,
    one_process: Annotated[
        bool,
        typer.Option(
            "--one-process",
            help="Measure every repeat in this one process: one start-up instead of one a repeat, but the "
            "intervals then leave out what differs between processes (by default each of two or more "
            "repeats runs in a process of its own).",
        ),
    ] = False,
    run_dir: Annotated[Path | None, typer.Option(hidden=True)] = None,
    events_file: Annotated[Path | None, typer.Option(hidden=True)] = None,  # a repeat run in its own process
    ablation: Annotated[str | None, typer.Option(hidden=True)] = None,
    repeat_index: Annotated[int | None, typer.Option(hidden=True)] = None,
    trace_dir: Annotated[Path | None, typer.Option(hidden=True)] = None,  # llmbench profile's children
    trace_steps: Annotated[int, typer.Option(hidden=True, min=1)] = 20,
    trace_slow_steps: Annotated[bool, typer.Option(hidden=True)] = False,
    trace_reference: Annotated[bool, typer.Option(hidden=True)] = False,
) -> None:
    """Run a scenario against its backend (the built-in engine, or a peer) and store the results."""
    if ablation is not None or events_file is not None:
        listen_for_interrupts()
    if not variant.strip() or any(c in variant for c in "/\\") or variant.strip(".") == "":
        raise BenchError(
            f"--variant {variant!r}: a variant names a configuration in the results (e.g. cuda_graph=off), not "
            "a path: give a non-empty name without a slash or backslash"
        )
    resolved = load_scenario_arg(scenario, set_, profile, repeats)
    if dry_run:
        print_dry_run(resolved)
        return

    from llmbench.bench.event_lines import LineEvents
    from llmbench.bench.repeat_processes import execute_in_processes
    from llmbench.bench.runner import RunRequest, execute_run
    from llmbench.cli.progress import RichRunEvents
    from llmbench.cli.views import ci_note, summary_table
    from llmbench.engine.tp import launched_rank

    sc = resolved.scenario
    if not quiet:
        note(f"scenario {sc.name} ({resolved.path}) · model {sc.model} · variant {variant}")
        note(profile_line(resolved))
    window = None
    if trace_dir is not None:
        from llmbench.bench.profile.window import ProfileWindow

        window = ProfileWindow(
            trace_dir, trace_steps, trace_slow_steps, slow_step_factor, reference_repeat=trace_reference
        )
    request = RunRequest(resolved, out, variant, run_dir, ablation, repeat_index, slow_step_factor, window)
    child = run_dir is not None or repeat_index is not None or trace_dir is not None or ablation is not None
    try:
        if events_file is not None:  # a repeat of a run in a process of its own: its parent shows the events
            outcome = execute_run(request, LineEvents(events_file))
        elif sc.repeats > 1 and not (one_process or child or launched_rank()):
            with RichRunEvents(quiet) as events:
                outcome = execute_in_processes(request, events)
        else:
            with RichRunEvents(quiet) as events:
                outcome = execute_run(request, events)
    except BaseException:
        # what was recorded before the run stopped is kept; a run that stopped before it stepped (a model
        # that cannot load) has nothing to keep, and its own error is what the user must see
        if window is not None and window.calls:
            try:
                _keep_profile(window, trace_dir, sc, variant, False, quiet)
            except Exception as exc:
                warning(f"the profile of the steps recorded could not be written: {exc}")
        raise
    if window is not None:
        _keep_profile(window, trace_dir, sc, variant, outcome.status == "complete", quiet)
    backend = outcome.meta["backend"]
    if not quiet:
        line = startup_line(backend, outcome.meta["startup"])
        if len(processes := outcome.meta.get("repeat_processes") or []) > 1:
            line += f" (the first of {len(processes)} processes; `report --view startup` has their mean)"
        note(line)
    device = outcome.meta["backend_config"].get("device") or "remote"
    title = f"{sc.name} · {variant} · {device}" + (f" · {backend}" if backend != "engine" else "")
    console.print(summary_table(outcome.summary, title))
    if (text := ci_note(outcome.summary)) and not quiet:
        note(text)
    for w in outcome.summary["warnings"]:
        if w not in outcome.told:  # the others were said when they became known
            warning(w)
    if not quiet:
        for line in unavailable_notes(outcome.summary["unavailable"]):
            note(line)
    if outcome.status != "complete":
        warning(
            f"the run stopped ({outcome.stop_reason}); partial results, marked incomplete, are in {outcome.run_dir}"
        )
        raise typer.Exit(interrupted_exit() if outcome.stop_reason == "interrupted" else 1)
    console.print(f"results: [bold]{escape(str(outcome.run_dir))}[/]", highlight=False, soft_wrap=True)
    if empty := _served_nothing(outcome.summary):
        error(
            f"no request completed in {'; '.join(empty)}: those repeats measured nothing (the warnings above "
            "say why); the results are kept"
        )
        raise typer.Exit(EXIT_FAILED)


def _keep_profile(window: Any, trace_dir: Path, sc: Any, variant: str, done: bool, quiet: bool) -> None:
    """``llmbench profile``'s child: the profile of what its window recorded, beside the traces."""
    from llmbench.bench.backends.engine import engine_config
    from llmbench.bench.profile.reference import add_untraced_steps
    from llmbench.bench.profile.summary import write_profile

    if not quiet and window.chunks:
        note(f"reading {len(window.chunks)} trace chunk(s) for the profile (an interrupt waits for it)")
    config = engine_config(sc)
    with held_interrupts():  # the profile of what was traced, whole or not at all
        path = write_profile(
            trace_dir,
            window.record(),
            variant,
            config.device,
            "complete" if done else "incomplete",
            config.torch_compile,
        )
        add_untraced_steps(path, window.record())  # what each untraced median is over


def _served_nothing(summary: dict[str, Any]) -> list[str]:
    """The repeats (``label repeat r``) in which no request completed (every one failed, or the time limit
    cut them all): a run of them ran to its end but measured no latency there, which a script checking
    the exit status must not take for success."""
    out = []
    for p in summary.get("points") or []:
        for r in p.get("repeats") or []:
            m = r.get("metrics") or {}
            unsent = int(r.get("not_submitted") or 0)  # the time limit ended before they were sent
            if m.get("num_completed") or not (m.get("num_requests") or unsent):
                continue
            failed, aborted = int(m.get("num_failed") or 0), int(m.get("num_aborted") or 0)
            why = (
                [f"{failed} failed"] * bool(failed)
                + [f"{aborted} cut by max_duration_s"] * bool(aborted)
                + [f"{unsent} never sent before max_duration_s ended"] * bool(unsent)
            )
            out.append(
                f"{p.get('label', '?')} repeat {r.get('repeat', 0) + 1} "
                f"(of {int(m.get('num_requests') or 0) + unsent}: {', '.join(why) or 'none finished'})"
            )
    return out
