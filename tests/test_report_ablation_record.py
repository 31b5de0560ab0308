"""What an ablation's ablation.json recorded reaches the report: a variant that failed to start, one
stopped at --timeout, an ablation interrupted before its last repeat; and a baseline that did not finish is
named as the reason nothing is compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmbench.cli.app import app

runner = CliRunner()


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})
    assert "Traceback" not in res.output, res.output
    return res


def _run(folder: Path, variant: str, repeat: int, status: str = "complete") -> str:
    """A run folder of one repeat of ``variant`` in the ablation ``folder``, as its child leaves it."""
    run = folder / f"{variant.replace('=', '-')}-r{repeat}"
    run.mkdir(parents=True)
    meta = {
        "status": status,
        "stop_reason": None if status == "complete" else "interrupted",
        "scenario_name": "abl",
        "variant": variant,
        "ablation": folder.name,
    }
    metrics = {"output_throughput": 100.0 + repeat, "ttft_p50": 0.01}
    point = {"label": "offline", "repeats": [{"repeat": repeat, "metrics": metrics}], "metrics": {}}
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "summary.json").write_text(json.dumps({"status": status, "points": [point], "warnings": []}))
    return run.name


def _ablation(root: Path, status: str, variants: list[dict], repeats: int = 1, order=None) -> Path:
    folder = root / "abl" / "20260101-000000-ablate"
    folder.mkdir(parents=True, exist_ok=True)  # the runs' folders may be in it already
    record = {
        "scenario": "abl",
        "baseline": "baseline",
        "repeats": repeats,
        "until_ci": None,
        "repeats_run": len(order or [[v["name"] for v in variants]]),
        "order": order or [[v["name"] for v in variants]],
        "status": status,
        "variants": variants,
    }
    (folder / "ablation.json").write_text(json.dumps(record))
    return folder


def _said(root: Path, tmp_path: Path, *args: str) -> dict[str, str]:
    """What the report says in each format (the HTML as written with -o)."""
    out = {}
    for fmt in ("table", "markdown"):
        res = invoke("report", root, "-f", fmt, *args)
        assert res.exit_code == 0, res.output
        out[fmt] = " ".join(res.stdout.split())
    page = tmp_path / "r.html"
    res = invoke("report", root, "-f", "html", "-o", page, *args)
    assert res.exit_code == 0, res.output
    out["html"] = " ".join(page.read_text().split())
    return out


def test_a_variant_that_failed_to_start_is_named_under_the_tables(tmp_path):
    root = tmp_path / "r"
    folder = root / "abl" / "20260101-000000-ablate"
    error = "Loading the engine...\nerror: engine options: kv_cache_memory=2,048 bytes holds 0 blocks"
    _ablation(root, "complete", [
        {"name": "baseline", "status": "ok", "error": None, "runs": [_run(folder, "baseline", 0)]},
        {"name": "kv_cache_memory=2048", "status": "failed", "error": error, "runs": []},
        {"name": "kv_cache_memory=1GiB", "status": "ok", "error": None,
         "runs": [_run(folder, "kv_cache_memory=1GiB", 0)]},
    ])  # fmt: skip
    for fmt, text in _said(root, tmp_path).items():
        assert "variant kv_cache_memory=2048 failed: engine options: kv_cache_memory=2,048 bytes holds 0" in (
            text
        ), fmt


def test_an_interrupted_ablation_says_how_many_of_its_repeats_ran(tmp_path):
    root = tmp_path / "r"
    folder = root / "abl" / "20260101-000000-ablate"
    variants = [
        {"name": "baseline", "status": "ok", "error": None, "runs": [_run(folder, "baseline", 0)]},
        {"name": "x=1", "status": "pending", "error": None, "runs": [_run(folder, "x=1", 0, "incomplete")]},
    ]
    _ablation(root, "interrupted", variants, repeats=3, order=[["baseline", "x=1"]])
    for fmt, text in _said(root, tmp_path).items():
        assert "planned 3 repeats, ran 1 (interrupted)" in text, fmt


@pytest.mark.parametrize("view", ["overview", "changes"])
def test_a_timed_out_variant_is_said_timed_out_and_an_incomplete_baseline_named(tmp_path, view):
    root = tmp_path / "r"
    folder = root / "abl" / "20260101-000000-ablate"
    stopped = "timed out after 4 s (--timeout); the run was stopped"
    _ablation(root, "failed", [
        {"name": "baseline", "status": "failed", "error": stopped,
         "runs": [_run(folder, "baseline", 0, "incomplete")]},
        {"name": "x=1", "status": "failed", "error": stopped, "runs": [_run(folder, "x=1", 0, "incomplete")]},
    ], repeats=3, order=[["baseline", "x=1"], [], []])  # fmt: skip
    if view == "overview":
        for fmt, text in _said(root, tmp_path, "--view", "overview").items():
            assert (
                "variant baseline timed out after 4 s" in text and "variant x=1 timed out after 4 s" in text
            ), fmt
        return
    res = invoke("report", root, "--view", "changes")
    assert res.exit_code == 2
    said = " ".join(res.stderr.split())
    assert "the ablation's baseline (variant baseline) is incomplete (interrupted)" in said, said
    assert "--baseline NAME" in said and "not variants of one" not in said
    assert invoke("report", root, "--view", "changes", "--baseline", "baseline").exit_code == 0
