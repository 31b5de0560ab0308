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

app = typer.Typer(
    name="llmbench",
    help="Benchmark and profile LLM inference on a built-in engine whose every optimisation is a switch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root() -> None:
    """Benchmark and profile LLM inference on a built-in engine whose every optimisation is a switch."""


app.command("run")(run_cmd.run)
app.command("ablate")(ablate_cmd.ablate)
app.command("profile")(profile_cmd.profile)
app.command("report")(report_cmd.report)
app.command("compare")(compare_cmd.compare)
app.command("models")(models_cmd.models)
app.command("env")(env_cmd.env)
app.command("calibrate")(calibrate_cmd.calibrate)
app.command("docs")(docs_cmd.docs)
app.command("quality-child", hidden=True)(quality_cmd.quality_child)
