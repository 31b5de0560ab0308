"""Measured figures in Markdown documents, regenerated from result folders kept in the repository.

A document marks each generated table with the command that makes it, and the table follows:

    <!-- llmbench: report results/h200/bench-throughput --view deltas -m output_throughput -->
    ...generated Markdown...
    <!-- /llmbench -->

``report ARGS`` renders ``llmbench report ARGS --format markdown`` under a provenance line (the command,
when the runs were measured, on which device, at which commit); ``stats-calibration`` renders the
simulated A/A calibration of the ablation verdicts (bench/stats_calibration.py). ``render`` rewrites
every block; ``stale`` lists the blocks whose text differs from what their command makes now, which is
how a test keeps the documents honest. Nothing between the markers is ever typed by hand.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from llmbench.bench.errors import BenchError
from llmbench.bench.store import find_runs

BLOCK = re.compile(r"(<!-- llmbench: (?P<command>[^\n]+?) -->\n)(?P<body>.*?)(<!-- /llmbench -->)", re.S)


class Block(NamedTuple):
    command: str
    body: str
    start: int  # offsets of the body in the document
    end: int


def blocks(text: str) -> list[Block]:
    """The generated blocks of a document, in order."""
    return [Block(m["command"], m["body"], m.start("body"), m.end("body")) for m in BLOCK.finditer(text)]


def _report(args: list[str], root: Path) -> str:
    from llmbench.bench.report import build_report
    from llmbench.bench.report.views import to_markdown

    dirs, options = _parse_report_args(args)
    paths = [root / d for d in dirs]
    missing = [str(d) for d, p in zip(dirs, paths, strict=True) if not p.exists()]
    if missing:
        raise BenchError(f"report {' '.join(args)}: no such result folder: {', '.join(missing)}")
    rep = build_report(paths, **options)
    tables = "\n".join(to_markdown(v) for s in rep.sections for v in s.views)
    return f"{provenance('llmbench report ' + shlex.join(args), paths)}\n\n{tables}"


def _parse_report_args(args: list[str]) -> tuple[list[str], dict]:
    """The subset of ``llmbench report``'s options a document may use."""
    dirs: list[str] = []
    options: dict = {"baseline": None, "threshold": 0.01, "metrics": [], "views": [], "intervals": False}
    it = iter(args)
    for a in it:
        if a in ("-m", "--metric"):
            options["metrics"] += [m for m in next(it, "").split(",") if m]
        elif a == "--view":
            options["views"].append(next(it, ""))
        elif a == "--intervals":
            options["intervals"] = True
        elif a == "--baseline":
            options["baseline"] = next(it, None)
        elif a == "--min-effect":
            options["threshold"] = float(next(it, "1")) / 100
        elif a.startswith("-"):
            raise BenchError(
                f"report option {a!r} is not supported in documents (use --metric, --view, --intervals, "
                "--baseline, --min-effect)"
            )
        else:
            dirs.append(a)
    if not dirs:
        raise BenchError("report: name at least one result folder")
    options["metrics"] = options["metrics"] or None
    options["views"] = options["views"] or None
    return dirs, options


def _stats_calibration(args: list[str], root: Path) -> str:
    from llmbench.bench import stats_calibration as sc

    if args:
        raise BenchError(f"stats-calibration takes no arguments, got {' '.join(args)}")
    tables = "\n".join(
        sc.format_table(
            sc.calibration_table(sc.TRIALS, sc.THRESHOLD, noise=noise), sc.TRIALS, sc.THRESHOLD, noise
        )
        for noise in (sc.NoiseModel(), sc.MODAL)
    )
    return f"Computed by `python -m llmbench.bench.stats_calibration` (seeded: the same tables on any machine).\n\n{tables}"


def _kernels(args: list[str], root: Path) -> str:
    """A kernel benchmark's JSON (a list of rows: kernel, shape, time_us, gb_per_s, frac_peak, tflops,
    max_rel_diff) as a table; ``--match REGEX`` keeps the rows whose kernel name it matches, ``--shape
    REGEX`` those whose shape it matches."""
    import json
    import re

    usage = "kernels takes the JSON file a kernel benchmark wrote, then optionally --match REGEX and --shape REGEX"
    options = dict(zip(args[1::2], args[2::2], strict=False))
    if len(args) % 2 == 0 or len(options) != len(args) // 2 or not set(options) <= {"--match", "--shape"}:
        raise BenchError(f"{usage}; got {' '.join(args) or 'nothing'}")
    filters = {}
    for option, pattern in options.items():
        try:
            filters[option] = re.compile(pattern)
        except re.error as e:
            raise BenchError(f"kernels {option} {pattern!r}: not a regular expression ({e})") from None
    path = root / args[0]
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BenchError(f"kernels {args[0]}: cannot read it ({e})") from None
    fields = {"--match": "kernel", "--shape": "shape"}
    for option, pattern in filters.items():
        rows = [r for r in rows if pattern.search(str(r.get(fields[option], "")))]
    which = " and ".join(f"whose {fields[o]} matches `{options[o]}`" for o in fields if o in options)
    which = f" (the rows {which})" if which else ""
    lines = [
        f"From `{args[0]}`{which}, written by a kernel benchmark (`python devtools/bench_kernels.py --json FILE`; "
        "`python devtools/bench_sampler.py --tune --json FILE` for the sampler, "
        "`python devtools/bench_linear.py --json FILE` for the linear layers, "
        "`python devtools/bench_gemv.py --json FILE` for the skinny matmul, "
        "`python devtools/bench_overlap.py --json FILE` for a decode step's layers on two streams).",
        "",
        "| kernel | shape | µs | GB/s | of the copy ceiling | TFLOP/s | largest relative difference from the reference |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:

        def num(key: str, fmt: str, r: dict = r) -> str:
            v = r.get(key)
            return format(v, fmt) if isinstance(v, (int, float)) else "–"

        lines.append(
            f"| {r.get('kernel', '?')} | {r.get('shape', '')} | {num('time_us', '.1f')} | {num('gb_per_s', ',.0f')} | "
            f"{num('frac_peak', '.1%')} | {num('tflops', '.1f')} | {num('max_rel_diff', '.1e')} |"
        )
    return "\n".join(lines)


KINDS: dict[str, Callable[[list[str], Path], str]] = {
    "report": _report,
    "stats-calibration": _stats_calibration,
    "kernels": _kernels,
}


def make(command: str, root: Path) -> str:
    """The Markdown one block's command makes (``root``: what the command's paths are relative to)."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise BenchError(f"generated block {command!r}: {e}") from None
    if not words or words[0] not in KINDS:
        raise BenchError(
            f"Unsupported generated block: {command!r}. Supported: {', '.join(KINDS)} (followed by arguments)"
        )
    return KINDS[words[0]](words[1:], root).rstrip("\n") + "\n"


def provenance(command: str, paths: list[Path]) -> str:
    """One line: the command, the days the runs were measured, the devices, the commits."""
    runs, _ = find_runs(paths)
    days = sorted({str(r.meta.get("started_at", ""))[:10] for r in runs} - {""})
    devices = sorted({_device(r.meta) for r in runs})
    commits = sorted({_commit(r.meta) for r in runs})
    when = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}" if days else "an unknown date"
    return (
        f"`{command}` · measured {when} on {', '.join(devices) or 'an unknown device'} · llmbench "
        f"{', '.join(commits) or 'at an unknown commit'}"
    )


def _device(meta: dict) -> str:
    gpus = (meta.get("machine") or {}).get("gpus") or []
    names = sorted({g.get("name", "?") for g in gpus if isinstance(g, dict)})
    if names:
        return (
            f"a host with {len(gpus)}× {' + '.join(names)}" if len(gpus) > 1 else f"a host with an {names[0]}"
        )
    return f"a CPU ({(meta.get('machine') or {}).get('cpu') or 'unknown'})"


def _commit(meta: dict) -> str:
    git = meta.get("git") or {}
    commit = git.get("commit")
    if not commit:
        return "at an unknown commit"
    return f"at {commit[:10]}" + (" with uncommitted changes" if git.get("dirty") else "")


def render(text: str, root: Path) -> str:
    """``text`` with every generated block made anew."""
    out, last = [], 0
    for b in blocks(text):
        out += [text[last : b.start], make(b.command, root)]
        last = b.end
    return "".join(out) + text[last:]


def stale(text: str, root: Path) -> list[str]:
    """The commands of the blocks whose text is not what the command makes now."""
    return [b.command for b in blocks(text) if b.body != make(b.command, root)]
