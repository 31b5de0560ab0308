"""``llmbench docs``: regenerate the measured tables of the project's Markdown documents from the result
folders kept in the repository (``bench/report/docs.py`` says how a table is marked), or check them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from llmbench.bench.errors import BenchError
from llmbench.cli.console import error, note
from llmbench.cli.errors import EXIT_FAILED, handle_errors

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "BENCHMARKS.md")


@handle_errors
def docs(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Markdown files to regenerate (default: README.md and BENCHMARKS.md of the repository)."
        ),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Change nothing; exit 1 when a generated table is out of date.")
    ] = False,
) -> None:
    """Regenerate every table marked `<!-- llmbench: COMMAND -->` from the result folders it names."""
    from llmbench.bench.report.docs import blocks, render, stale

    paths = files or [REPO_ROOT / name for name in DOCUMENTS]
    out_of_date = 0
    rewritten: list[tuple[Path, str, str]] = []  # path, new text, line ending: written once all are made
    for path in paths:
        if not path.is_file():
            raise BenchError(f"no such document: {path}")
        try:
            with open(path, encoding="utf-8", newline="") as f:  # line endings as they are
                raw = f.read()
        except UnicodeDecodeError as exc:
            raise BenchError(f"{path}: not a UTF-8 text file (byte at position {exc.start})") from None
        ending = "\r\n" if "\r\n" in raw else "\n"
        text = raw.replace("\r\n", "\n")
        root = path.resolve().parent  # the commands' result folders are relative to the document
        try:
            found = blocks(text)
            commands = stale(text, root) if check else []
            new = text if check else render(text, root)
        except BenchError as exc:  # a block's error names its line: say in which document
            raise BenchError(f"{path}: {exc}") from None
        if check:
            for command in commands:
                error(
                    f"{path}: out of date: <!-- llmbench: {command} --> (run `llmbench docs` to regenerate)"
                )
                out_of_date += 1
            continue
        if new != text:
            rewritten.append((path, new, ending))
        note(f"{path}: {len(found)} generated table(s)" + (" rewritten" if new != text else ", unchanged"))
    for path, new, ending in rewritten:  # every document made without an error: now write them
        part = path.with_name(f".{path.name}.part")
        with open(part, "w", encoding="utf-8", newline="") as f:
            f.write(new.replace("\n", ending))
        os.replace(part, path)  # a reader sees the old document or the new one, never half of one
    if out_of_date:
        raise typer.Exit(EXIT_FAILED)
    if check:
        note(f"{len(paths)} document(s): every generated table is up to date")
