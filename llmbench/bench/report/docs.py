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

A marker is a line of its own, from its first column; one shown inside a fenced code block (```) is an
example, not a marker. An indented marker, a marker left open, a closing one without an opening, a bad
option of a command, a view that has nothing to show, or a run folder that is skipped or read in part is
an error naming the line (never a block skipped, left empty or short in silence).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from llmbench.bench.errors import BenchError
from llmbench.bench.store import find_runs

OPEN = "<!-- llmbench:"
CLOSE = "<!-- /llmbench -->"
_OPENING = re.compile(r"<!-- llmbench: (?P<command>.+?) -->")


class Block(NamedTuple):
    command: str
    body: str
    start: int  # offsets of the body in the document
    end: int
    line: int = 0  # of the opening marker, from 1


def blocks(text: str) -> list[Block]:
    """The generated blocks of a document, in order (a marker is a line starting with one: a marker quoted
    within a sentence, or shown in a fenced code block, is not one)."""
    out: list[Block] = []
    opened: tuple[str, int, int] | None = None  # command, body start, line
    fence: str | None = None  # the fence of the code block the line is in
    end = 0
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        start, end = end, end + len(line)
        stripped = line.rstrip()
        if fence is not None or (opened is None and stripped.lstrip().startswith(("```", "~~~"))):
            opens = fence is None
            fence = stripped.lstrip()[:3] if opens else fence
            if not opens and stripped.lstrip().startswith(fence):
                fence = None
            continue
        if stripped.lstrip().startswith((OPEN, CLOSE)) and stripped[0].isspace():
            raise BenchError(
                f"line {number}: an indented marker is not read as one: a marker starts its line (an example "
                "goes inside a ``` fence)"
            )
        if stripped.startswith(OPEN):
            if opened is not None:
                raise BenchError(
                    f"line {opened[2]}: {OPEN} {opened[0]} --> is not closed by {CLOSE} before the next "
                    f"marker, line {number}"
                )
            m = _OPENING.fullmatch(stripped)
            if m is None:
                raise BenchError(
                    f"line {number}: {stripped[:60]!r}: a marker reads `{OPEN} COMMAND -->` on a line of its own"
                )
            opened = (m["command"], end, number)
        elif stripped == CLOSE:
            if opened is None:
                raise BenchError(f"line {number}: {CLOSE} closes no {OPEN} COMMAND --> marker")
            out.append(Block(opened[0], text[opened[1] : start], opened[1], start, opened[2]))
            opened = None
    if opened is not None:
        raise BenchError(f"line {opened[2]}: {OPEN} {opened[0]} --> is not closed by {CLOSE}")
    return out


def _report(args: list[str], root: Path) -> str:
    from llmbench.bench.report import build_report
    from llmbench.bench.report.views import to_markdown

    dirs, options = _parse_report_args(args)
    paths = [root / d for d in dirs]
    missing = [str(d) for d, p in zip(dirs, paths, strict=True) if not p.exists()]
    if missing:
        raise BenchError(
            f"no such result folder: {', '.join(missing)} (a document's result folders are relative to the "
            f"document's own folder, here {root})"
        )
    baseline = options["baseline"]
    if baseline is not None and (root / baseline).exists():  # a run folder, named as the dirs are
        options["baseline"] = str(root / baseline)
    rep = build_report(paths, **options)
    if rep.empty:  # a table the document asks for by name would be missing
        raise BenchError("; ".join(rep.empty))
    broken = [f"{p.path}: {p.reason}" for p in rep.problems + rep.doubts]
    if broken:  # a document's table shows every run it names, whole
        raise BenchError(f"{broken[0]}" + (f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""))
    tables = "\n".join(to_markdown(v) for s in rep.sections for v in s.views)
    return f"{provenance('llmbench report ' + shlex.join(args), paths)}\n\n{tables}"


def _parse_report_args(args: list[str]) -> tuple[list[str], dict]:
    """The subset of ``llmbench report``'s options a document may use."""
    dirs: list[str] = []
    options: dict = {"baseline": None, "threshold": 0.01, "metrics": [], "views": [], "intervals": False}
    it = iter(args)

    def value(option: str) -> str:
        v = next(it, None)
        if v is None:
            raise BenchError(f"report option {option} needs a value")
        return v

    for a in it:
        if a in ("-m", "--metric"):
            options["metrics"] += [m for m in value(a).split(",") if m]
        elif a == "--view":
            options["views"].append(value(a))
        elif a == "--intervals":
            options["intervals"] = True
        elif a == "--baseline":
            options["baseline"] = value(a)
        elif a == "--min-effect":
            text = value(a)
            try:
                percent = float(text)
            except ValueError:
                percent = math.nan
            if not percent >= 0 or math.isinf(percent):
                raise BenchError(
                    f"report option --min-effect {text!r}: not a percentage (a number, 0 or more)"
                )
            options["threshold"] = percent / 100
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
    if not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows)):
        raise BenchError(f"kernels {args[0]}: holds no list of rows (objects), as a kernel benchmark writes")
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
        "`python devtools/splitk_matmul.py --json FILE` for products cut along their inputs, "
        "`python devtools/bench_overlap.py --json FILE` for a decode step's layers on two streams, "
        "`python devtools/bench_host.py --json FILE` for the host's part of a step).",
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
    names = sorted({str(g.get("name", "?")) for g in gpus if isinstance(g, dict)})
    if names:
        return (
            f"a host with {len(gpus)}× {' + '.join(names)}" if len(gpus) > 1 else f"a host with an {names[0]}"
        )
    return f"a CPU ({(meta.get('machine') or {}).get('cpu') or 'unknown'})"


def _commit(meta: dict) -> str:
    git = meta.get("git") or {}
    commit, source = git.get("commit"), git.get("source")
    if not commit:
        return f"at an unknown commit (source {source})" if source else "at an unknown commit"
    if git.get("dirty"):  # which code ran: the digest tells two such runs apart
        return f"at {commit[:10]} with uncommitted changes" + (f" (source {source})" if source else "")
    return f"at {commit[:10]}"


def _made(block: Block, root: Path) -> str:
    """``make``, its errors led by the block's line."""
    try:
        return make(block.command, root)
    except BenchError as e:
        raise BenchError(f"line {block.line}, `{block.command}`: {e}") from None


def render(text: str, root: Path) -> str:
    """``text`` with every generated block made anew."""
    out, last = [], 0
    for b in blocks(text):
        out += [text[last : b.start], _made(b, root)]
        last = b.end
    return "".join(out) + text[last:]


def stale(text: str, root: Path) -> list[str]:
    """The commands of the blocks whose text is not what the command makes now."""
    return [b.command for b in blocks(text) if b.body != _made(b, root)]
