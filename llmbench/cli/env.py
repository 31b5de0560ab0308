"""``llmbench env``: what a result depends on — Python and library versions, GPUs, driver, peaks."""

from __future__ import annotations

from rich.table import Table

from llmbench.cli.console import console
from llmbench.cli.errors import handle_errors


@handle_errors
def env() -> None:
    """Print the GPU, driver and library versions that a run records in its meta.json."""
    import torch

    from llmbench.bench.hardware import git_commit, machine, versions
    from llmbench.bench.peaks import peak_for

    table = Table(show_header=False, show_edge=False, title="environment", title_justify="left")
    table.add_column("item", no_wrap=True)
    table.add_column("value")
    for name, version in versions().items():
        missing = "none (a CPU build of torch)" if name == "torch_cuda" else "not installed"
        table.add_row(name, str(version) if version else missing)
    info = machine()
    table.add_row("platform", info["platform"])
    table.add_row("cpu", f"{info['cpu']} ({info['cpu_count']} logical cores)")
    table.add_row("cuda available", str(torch.cuda.is_available()))
    table.add_row("nvml", info["nvml"])
    table.add_row("driver", info["driver"] or "–")
    for gpu in info["gpus"]:
        peak = peak_for(gpu["name"])
        mem = f"{gpu['memory_total'] / 2**30:.0f} GiB" if gpu.get("memory_total") else "?"
        peaks = (
            f"; peak {peak.mem_bandwidth / 1e12:.2f} TB/s, {peak.bf16_flops / 1e12:.0f} bf16 TFLOP/s"
            if peak
            else "; no peak in the table"
        )
        table.add_row(f"gpu {gpu['nvml_index']}", f"{gpu['name']}, {mem}{peaks}")
    git = git_commit()
    table.add_row("git commit", f"{git['commit'] or '–'}{' (local changes)' if git['dirty'] else ''}")
    table.add_row("source", f"{git['source']} (the package's Python files; runs record it)")
    console.print(table)
