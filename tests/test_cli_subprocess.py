"""The command line as a user meets it: ``python -m llmbench`` in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def llmbench(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "llmbench", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_help_lists_every_command(tmp_path):
    res = llmbench("--help", cwd=tmp_path)
    assert res.returncode == 0
    for cmd in ("run", "ablate", "report", "compare", "models", "env"):
        assert cmd in res.stdout


def test_the_command_list_shows_each_summary_as_one_sentence():
    """Typer's command list shows a command's ``short_help``, else its docstring's first paragraph with
    the line breaks kept, which then cut the list's column mid-sentence."""
    import typer

    from llmbench.cli.app import app

    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():
        shown = cmd.short_help or (cmd.help or "").split("\n\n")[0]
        assert shown and "\n" not in shown and "  " not in shown, (name, shown)


HEAVY = ("torch", "pandas", "pyarrow", "matplotlib")
# ``python -m llmbench ARGS``, then which of HEAVY the process had imported by the time it exited.
_PROBE = """
import json, runpy, sys
args, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["llmbench", *args]
try:
    runpy.run_module("llmbench", run_name="__main__")
except SystemExit:
    pass
print(json.dumps([m for m in heavy if m in sys.modules]))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        *([cmd, "--help"] for cmd in ("run", "ablate", "report", "profile", "compare", "calibrate", "docs")),
    ],
)
def test_help_answers_without_importing_torch_or_pandas(tmp_path, args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "Usage:" in res.stdout
    assert json.loads(res.stdout.strip().splitlines()[-1]) == []
    assert "<bool>" not in res.stdout  # a flag takes no value, and its help shows none


def test_version_is_the_installed_packages(tmp_path):
    from importlib.metadata import version

    res = llmbench("--version", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == f"llmbench {version('llmbench')}", res.stdout


def test_run_then_report_in_fresh_processes(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "model": "qwen3-tiny", "engine": {"device": "cpu"}, "arrival": {"kind": "concurrency", "concurrency": 2},
        "workload": {"num_requests": 4, "input_len": 16, "output_len": 3},
    }))  # fmt: skip
    res = llmbench("run", path, "--out", "results", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "results: " in res.stdout and (tmp_path / "results" / "s").is_dir()
    rep = llmbench("report", "results", "--format", "markdown", cwd=tmp_path)
    assert rep.returncode == 0 and "| metric |" in rep.stdout


def test_bad_input_exits_2_without_a_traceback(tmp_path):
    (tmp_path / "bad.yaml").write_text("workload: [1, 2\n")
    res = llmbench("run", "bad.yaml", cwd=tmp_path)
    assert res.returncode == 2 and "not valid YAML" in res.stderr and "Traceback" not in res.stderr


def test_models_and_env(tmp_path):
    res = llmbench("models", cwd=tmp_path)
    assert res.returncode == 0 and "qwen3-tiny" in res.stdout and "qwen3-0.6b" in res.stdout
    res = llmbench("env", cwd=tmp_path)
    assert res.returncode == 0 and "torch" in res.stdout and "nvml" in res.stdout
