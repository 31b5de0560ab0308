"""``llmbench models``: the presets (real architectures' shapes, random weights, no download), and the
checkpoints the local Hugging Face cache holds, which a scenario names by their hub id."""

from __future__ import annotations

from rich.table import Table

from llmbench.cli.console import console
from llmbench.cli.errors import handle_errors


@handle_errors
def models() -> None:
    """List the model presets and the local Hugging Face cache's checkpoints; any folder with config.json
    and *.safetensors works too."""
    from llmbench.models.presets import PRESETS
    from llmbench.models.registry import cached_models

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
        table.add_row(p.name, p.architecture, _millions(count), p.description)
    console.print(table)
    from huggingface_hub import constants

    cached = cached_models()
    where = f"in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    if not cached:
        console.print(f"\nnothing {where}", highlight=False)
        return
    table = Table(title=f"{where}: give the hub id as the model", title_justify="left", show_edge=False)
    table.add_column("hub id", no_wrap=True)
    table.add_column("architecture", no_wrap=True)
    table.add_column("params", justify="right", no_wrap=True)
    table.add_column("")
    for repo_id, config in cached.items():
        if isinstance(config, str):
            table.add_row(repo_id, "–", "–", f"cannot run: {config}")
        else:
            table.add_row(repo_id, config.architecture, _millions(config.num_params()), "")
    console.print()
    console.print(table)


def _millions(count: int | None) -> str:
    return f"{count / 1e6:,.1f} M" if count else "–"
