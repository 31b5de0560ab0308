"""What ``report`` and ``compare`` show of damaged or hand-edited runs, and the exit codes they end with.

A damaged table costs only the parts drawn from it; an impossible figure in summary.json reads as missing
with a warning; a report of something the runs do not hold is a usage error (2); a closed pipe ends quietly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.runner import RunRequest, execute_run
from llmbench.bench.scenario import load_scenario
from llmbench.cli.app import app

runner = CliRunner()

SCENARIO = {
    "name": "dmg",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 4, "input_len": {"dist": "uniform", "min": 8, "max": 16}, "output_len": 4},
    "arrival": {"kind": "offline"},
    "repeats": 2,
    "telemetry": {"period_ms": 20},
}


@pytest.fixture(scope="module")
def ablation(tmp_path_factory) -> Path:
    """A baseline and a variant of one ablation, greedy, with every table kept."""
    root = tmp_path_factory.mktemp("results")
    path = root / "dmg.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    for variant, sets in (("baseline", []), ("attention_backend=torch", ["engine.attention_backend=torch"])):
        execute_run(RunRequest(load_scenario(path, sets), root / "runs", variant, ablation="a1"))
    return root / "runs" / "dmg"


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})
    assert "Traceback" not in res.output, res.output
    return res


def copy(ablation: Path, dst: Path) -> dict[str, Path]:
    shutil.copytree(ablation, dst)
    return {json.loads((d / "meta.json").read_text())["variant"]: d for d in dst.iterdir()}


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_damaged_request_table_hides_only_what_is_drawn_from_it(ablation, tmp_path):
    runs = copy(ablation, tmp_path / "a")
    damaged = runs["attention_backend=torch"] / "requests.parquet"
    truncate(damaged)
    for fmt in ("table", "markdown", "csv"):
        res = invoke("report", tmp_path / "a", "-f", fmt)
        assert res.exit_code == 0, res.output
        assert f"{damaged}: unreadable (" in res.stderr and "output comparison" in res.stderr
        assert "TTFT p50" in res.stdout or "ttft_p50" in res.stdout  # every figure of summary.json is shown
    res = invoke("report", tmp_path / "a", "--view", "deltas", "-f", "markdown")
    assert res.exit_code == 0 and f"n/a (not compared: {damaged} is unreadable (" in res.stdout
    out = tmp_path / "r.html"
    res = invoke("report", tmp_path / "a", "-f", "html", "-o", out)
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert f"{damaged}: unreadable (" in page and "<table>" in page and "output tok/s" in page


def test_a_damaged_step_table_costs_the_html_its_step_plot_only(ablation, tmp_path):
    runs = copy(ablation, tmp_path / "a")
    damaged = runs["baseline"] / "steps.parquet"
    damaged.write_bytes(b"not a parquet file at all")
    out = tmp_path / "r.html"
    res = invoke("report", runs["baseline"], "-f", "html", "-o", out)
    assert res.exit_code == 0, res.output
    assert f"{damaged}: unreadable (" in res.stderr and "decode-step plot" in res.stderr
    assert "decode-step plot" in out.read_text() and "<img" in out.read_text()


def test_a_request_table_missing_on_one_side_says_the_outputs_were_not_compared(ablation, tmp_path):
    runs = copy(ablation, tmp_path / "a")
    (runs["attention_backend=torch"] / "requests.parquet").unlink()
    res = invoke("report", tmp_path / "a", "--view", "changes")
    assert res.exit_code == 0, res.output
    assert "(greedy): n/a (requests.parquet not kept)" in res.stdout


def test_compare_judges_runs_whose_tables_are_damaged(ablation, tmp_path):
    runs = copy(ablation, tmp_path / "a")
    truncate(runs["attention_backend=torch"] / "requests.parquet")
    truncate(runs["baseline"] / "telemetry.parquet")
    res = invoke("compare", runs["baseline"], runs["attention_backend=torch"], "--fail-above", "1000")
    assert res.exit_code in (0, 3), res.output  # judged, or too few repeats: never refused
    assert "requests.parquet: unreadable" in res.stderr and "telemetry.parquet: unreadable" in res.stderr


def edit_repeat(run: Path, metric: str, value: str) -> None:
    """Set repeat 0's figure of ``metric`` as JSON text (NaN and Infinity as Python's json writes them)."""
    text = (run / "summary.json").read_text()
    summary = json.loads(text)
    summary["points"][0]["repeats"][0]["metrics"][metric] = "@@"
    (run / "summary.json").write_text(json.dumps(summary).replace('"@@"', value))


@pytest.mark.parametrize(
    "metric, value",
    [("ttft_p50", "NaN"), ("ttft_p50", "Infinity"), ("ttft_p50", "-5.0"), ("output_throughput", "-1e3"),
     ("num_completed", "-4"), ("tpot_p50", '"fast"')],
)  # fmt: skip
def test_an_impossible_figure_reads_as_missing_with_a_warning(ablation, tmp_path, metric, value):
    runs = copy(ablation, tmp_path / "a")
    run = runs["baseline"]
    edit_repeat(run, metric, value)
    res = invoke("report", run, "-m", metric)
    assert res.exit_code == 0, res.output
    warned = " ".join(res.stderr.split())
    assert f"{run}: values of the wrong type read as missing" in warned
    assert f"{metric} is {json.dumps(json.loads(value))}" in warned or f"{metric} is 'fast'" in warned
    assert "(1 of 2)" in res.stdout  # the figure is one repeat's, beside "repeats 2"
    out = tmp_path / "r.html"
    res = invoke("report", run, runs["attention_backend=torch"], "-f", "html", "-o", out)
    assert res.exit_code == 0, res.output


def test_a_signed_figure_below_zero_is_kept(ablation, tmp_path):
    run = copy(ablation, tmp_path / "a")["baseline"]
    edit_repeat(run, "decode_fixed", "-0.001")  # a fit's intercept: below 0 is a measurement
    res = invoke("report", run, "-m", "decode_fixed")
    assert res.exit_code == 0 and "wrong type" not in res.stderr


def test_an_html_plot_that_cannot_be_drawn_becomes_a_note(ablation, monkeypatch, tmp_path):
    from llmbench.bench.report import html

    def broken(groups):
        raise ValueError("'yerr' must not contain negative values")

    monkeypatch.setattr(html, "PLOTS", (*html.PLOTS[:2], ("output throughput per variant", broken)))
    out = tmp_path / "r.html"
    res = invoke("report", ablation, "-f", "html", "-o", out)
    assert res.exit_code == 0, res.output
    assert (
        "output throughput per variant: not drawn (ValueError: &#x27;yerr&#x27; must not" in out.read_text()
    )


def test_error_bars_never_reach_below_zero():
    from llmbench.bench.report.html import _bar

    assert _bar(-2.0, 0.0) == 0.0 and _bar(None, 1.0) == 0.0 and _bar(3.0, 1.0) == 2.0
    assert _bar(float("nan"), 1.0) == 0.0


@pytest.mark.parametrize(
    "args, says",
    [(["--view", "quality"], "no quality rows"), (["--view", "deltas", "--baseline", "nope"], "--baseline nope"),
     (["-m", "nosuch"], "Unknown metric"), (["--view", "profile"], "--view profile")],
)  # fmt: skip
def test_what_cannot_be_shown_is_a_usage_error(ablation, args, says):
    res = invoke("report", ablation, *args)
    assert res.exit_code == 2, res.output
    assert says in res.stderr


def test_what_cannot_be_shown_is_a_usage_error_without_a_baseline_or_folder(ablation, tmp_path):
    assert invoke("report", tmp_path / "nope").exit_code == 2
    one = copy(ablation, tmp_path / "a")["baseline"]
    res = invoke("report", one, "--view", "deltas")
    assert res.exit_code == 2 and "--view deltas" in res.stderr


@pytest.mark.parametrize("args", [["report", "{a}"], ["report", "{a}", "-f", "csv"], ["report", "--help"]])
def test_a_closed_pipe_ends_quietly(ablation, args):
    # The reader is gone before the command writes: every write fails (EPIPE), as under `| head -3`.
    cmd = [sys.executable, "-m", "llmbench", *(a.format(a=ablation) for a in args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 141), err
    assert err == "", err
