"""``llmbench quality-child SPEC``: one side of ``ablate --quality``, in a process of its own (hidden:
``ablate`` starts it with a spec file it wrote; bench/ablation/quality.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from llmbench.cli.common import load_scenario_arg
from llmbench.cli.errors import handle_errors


@handle_errors
def quality_child(spec: Annotated[Path, typer.Argument(help="The spec file ablate wrote.")]) -> None:
    """Measure one configuration's side of a quality comparison."""
    from llmbench.bench.quality import QualitySettings, run_side

    data = json.loads(spec.read_text())
    resolved = load_scenario_arg(data["scenario"], data["sets"], data["profile"])
    out = Path(data["out"]) if data["out"] else None
    run_side(resolved, data["options"], QualitySettings(**data["settings"]), Path(data["baseline"]), out)
