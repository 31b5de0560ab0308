"""``llmbench calibrate``: measure this machine's copy bandwidth and matmul throughput, and store them.

Runs on the same device (same GPU model, driver and torch; for the CPU, the same host) then divide their
derived utilisation figures by these measured peaks instead of the datasheet's (bench/peaks.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from llmbench.bench.peaks import CALIBRATION_ENV
from llmbench.cli.console import console, err_console, note, warning
from llmbench.cli.errors import handle_errors


@handle_errors
def calibrate(
    device: Annotated[
        str | None,
        typer.Option(
            help="Device to measure: cpu, cuda or cuda:N (default: cuda:0 when there is a GPU, else cpu)."
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            envvar=CALIBRATION_ENV,
            help="Calibration file to add this device's entry to (default: "
            "$XDG_CACHE_HOME/llmbench/calibration.json, else ~/.cache/llmbench/calibration.json).",
        ),
    ] = None,
    copy_mib: Annotated[
        int | None,
        typer.Option(min=1, help="Size of the copied buffer in MiB (default: 1024 on a GPU, 256 on a CPU)."),
    ] = None,
    matmul_size: Annotated[
        int | None,
        typer.Option(
            min=16,
            help="n of the (n, n) @ (n, n) product (default: 8192 on a GPU; on a CPU, about 1 s of work).",
        ),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            min=1, help="Timed runs of each; the median is kept (default: 20 on a GPU, 5 on a CPU)."
        ),
    ] = None,
) -> None:
    """Measure device copy bandwidth and dense matmul throughput here; runs then divide by them."""
    import torch

    from llmbench.bench.calibration import calibrate as measure
    from llmbench.bench.calibration import check_device
    from llmbench.bench.hardware import busy_warning
    from llmbench.bench.peaks import calibration_path, check_writable, peak_for, store_calibration

    target = check_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    path = calibration_path(file)
    check_writable(path)  # before minutes of measuring, not after
    if target == "cpu" and (busy := busy_warning(1, what="calibration")):
        # the peaks measured now would be low, and every later run's utilisations high
        warning(f"{busy}; a CPU's peaks measured now read low and every later run's utilisations high: "
                "calibrate on an idle machine")  # fmt: skip
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )
    tasks: dict[str, int] = {}

    def on_step(what: str, done: int, total: int) -> None:
        if what not in tasks:
            tasks[what] = progress.add_task(f"{what} on {target}", total=total)
        progress.update(tasks[what], completed=done)

    with progress:
        cal = measure(
            target,
            copy_bytes=copy_mib << 20 if copy_mib else None,
            matmul_size=matmul_size,
            repeats=repeats,
            on_step=on_step,
        )
    datasheet = peak_for(cal.key["device"]) if target.startswith("cuda") else None
    console.print(_table(cal, datasheet))
    store_calibration(path, cal._asdict())
    key = ", ".join(f"{k} {v}" for k, v in cal.key.items())
    note(f"runs on this device ({key}) now divide their derived figures by these measured peaks")
    console.print(f"calibration: [bold]{escape(str(path))}[/]", highlight=False, soft_wrap=True)


def _table(cal, datasheet) -> Table:
    from llmbench.bench.calibration import WARMUP
    from llmbench.bench.peaks import format_rate

    table = Table(
        title=f"peaks of {cal.key['device']} ({cal.device})",
        caption=f"median of {cal.repeats} timed runs each, after {WARMUP} untimed ones",
        title_justify="left",
        caption_justify="left",
        show_edge=False,
    )
    table.add_column("figure", no_wrap=True)
    table.add_column("measured", justify="right")
    table.add_column("datasheet", justify="right")
    table.add_column("measured / datasheet", justify="right")
    dtype = {"bfloat16": "bf16", "float32": "fp32"}.get(cal.matmul_dtype, cal.matmul_dtype)
    rows = [
        (
            f"device copy, read + write ({cal.copy_bytes / 2**20:,.0f} MiB)",
            cal.mem_bandwidth,
            datasheet.mem_bandwidth if datasheet else None,
            "B/s",
        ),
        (
            f"matmul {dtype} {cal.matmul_size}x{cal.matmul_size}x{cal.matmul_size}",
            cal.matmul_flops,
            datasheet.bf16_flops if datasheet and cal.matmul_dtype == "bfloat16" else None,
            "FLOP/s",
        ),
    ]
    for label, measured, sheet, unit in rows:
        table.add_row(
            label,
            format_rate(measured, unit),
            format_rate(sheet, unit) if sheet else "–",
            f"{measured / sheet:.1%}" if sheet else "–",
        )
    return table
