"""Imports point down the layers (cli -> bench -> engine -> models -> distributed -> layers -> kernels),
the engine and below import no presentation or schema library, and the peer backends load no engine."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "llmbench"
PRESENTATION = ("typer", "rich", "pandas", "yaml", "pydantic", "matplotlib")
# package -> the llmbench packages it may not import
FORBIDDEN = {
    "kernels": ("layers", "distributed", "models", "engine", "bench", "cli"),
    "layers": ("distributed", "models", "engine", "bench", "cli"),
    # communicators sit below the engine (which launches the ranks) and the models (whose fused decode
    # calls them), above the layers (which see them as Collectives) and the kernels
    "distributed": ("models", "engine", "bench", "cli"),
    "models": ("engine", "bench", "cli"),
    "engine": ("bench", "cli"),
    "bench": ("cli",),
}


def package_of(path: Path) -> str:
    """The dotted package a file's relative imports start from (a package's ``__init__`` is its own)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1])


def imports_of(source: str, package: str, filename: str = "<source>") -> set[str]:
    """Every module a file in ``package`` imports, at any depth (function-level imports included).
    Relative imports are resolved against ``package``, and ``from m import x`` also counts ``m.x``, since x
    may be a module (``from .. import engine``)."""
    here = package.split(".")
    names = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []  # level 1: the package itself
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names |= {f"{module}.{alias.name}" for alias in node.names if alias.name != "*"}
    return names


def files_of(package: str) -> list[Path]:
    return sorted((PACKAGE / package).rglob("*.py"))


def imports_in(path: Path) -> set[str]:
    return imports_of(path.read_text(), package_of(path), str(path))


def test_relative_imports_resolve_against_the_files_package():
    source = (
        "from ..engine.config import EngineConfig\nfrom .. import cli\nfrom .report import build_report\n"
    )
    assert imports_of(source, "llmbench.bench") >= {
        "llmbench.engine.config",
        "llmbench.cli",
        "llmbench.bench.report",
    }
    assert package_of(PACKAGE / "bench" / "runner.py") == "llmbench.bench"
    assert package_of(PACKAGE / "bench" / "report" / "__init__.py") == "llmbench.bench.report"


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_down_the_layers(package):
    wrong = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in files_of(package)
        for name in imports_in(path)
        if any(name == f"llmbench.{up}" or name.startswith(f"llmbench.{up}.") for up in FORBIDDEN[package])
    ]
    assert not wrong, wrong


@pytest.mark.parametrize("package", ["engine", "distributed", "layers", "kernels", "models"])
def test_the_engine_and_below_import_no_presentation_or_schema_library(package):
    wrong = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in files_of(package)
        for name in imports_in(path)
        if name.split(".")[0] in PRESENTATION
    ]
    assert not wrong, wrong


def test_the_peer_backends_load_no_engine():
    code = (
        "import sys\n"
        "import llmbench.bench.backends.transformers, llmbench.bench.backends.openai\n"
        "from llmbench.models.registry import resolve_model\n"
        "resolve_model('qwen3-tiny')\n"
        "print(sorted(m for m in sys.modules if m.startswith('llmbench.engine')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
