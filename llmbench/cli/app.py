"""The ``llmbench`` command line: one Typer app, one module per command.

run      one scenario, one engine configuration
ablate   the same scenario with optimisations switched on and off, each variant in its own process
profile  where each variant's step time goes (torch.profiler), with a diff against the baseline
report   comparison tables (terminal, Markdown, CSV, HTML with plots) over any set of run folders
compare  a regression gate between two runs
models   the model presets
env      GPU, driver and library versions
calibrate  measure this machine's copy bandwidth and matmul peak for the derived utilisation figures
docs       regenerate the measured tables of README.md and BENCHMARKS.md from kept results (or --check)
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from llmbench.cli import ablate as ablate_cmd
from llmbench.cli import calibrate as calibrate_cmd
from llmbench.cli import compare as compare_cmd
from llmbench.cli import docs as docs_cmd
from llmbench.cli import env as env_cmd
from llmbench.cli import models as models_cmd
from llmbench.cli import profile as profile_cmd
from llmbench.cli import quality as quality_cmd
from llmbench.cli import report as report_cmd
from llmbench.cli import run as run_cmd


def _flags_without_a_type() -> None:
    """A flag (``--dry-run``) takes no value, but Typer's help shows ``<bool>`` beside it, which reads as if
    it took one: the help shows no type for a flag (where this Typer's help has the hook at all)."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_without_a_type()

app = typer.Typer(
    name="llmbench",
    help="Benchmark and profile LLM inference on a built-in engine whose every optimisation is a switch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(asked: bool) -> None:
    if asked:
        from llmbench import __version__

        typer.echo(f"llmbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_version, help="Print llmbench's version and exit."
        ),
    ] = False,
) -> None:
    """Benchmark and profile LLM inference on a built-in engine whose every optimisation is a switch."""


def _command(name: str, fn) -> None:
    """Register ``fn`` as ``name``; the command list shows its docstring's first paragraph as one line
    (left to Typer, a line break inside it would be kept and break the list's column)."""
    first = (fn.__doc__ or "").strip().split("\n\n")[0]
    app.command(name, short_help=" ".join(first.split()))(fn)


for _name, _fn in (
    ("run", run_cmd.run),
    ("ablate", ablate_cmd.ablate),
    ("profile", profile_cmd.profile),
    ("report", report_cmd.report),
    ("compare", compare_cmd.compare),
    ("models", models_cmd.models),
    ("env", env_cmd.env),
    ("calibrate", calibrate_cmd.calibrate),
    ("docs", docs_cmd.docs),
):
    _command(_name, _fn)
app.command("quality-child", hidden=True)(quality_cmd.quality_child)
