"""``llmbench models``: the presets (real architectures' shapes, random weights, no download)."""

from __future__ import annotations

from rich.table import Table

from llmbench.cli.console import console
from llmbench.cli.errors import handle_errors


@handle_errors
def models() -> None:
    """List the model presets; any folder with config.json and *.safetensors works too."""
    from llmbench.models.presets import PRESETS

    table = Table(
        title="model presets (random weights from a fixed seed)", title_justify="left", show_edge=False
    )
    table.add_column("name", no_wrap=True)
    table.add_column("architecture", no_wrap=True)
    table.add_column("params", justify="right", no_wrap=True)
    table.add_column("description")
    for p in PRESETS.values():
        params = getattr(p.config, "num_params", None)
        count = params() if callable(params) else None
        table.add_row(p.name, p.architecture, f"{count / 1e6:,.1f} M" if count else "–", p.description)
    console.print(table)
