"""``llmbench report`` and ``llmbench compare`` over real run folders (qwen3-tiny), broken ones too."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.report.compare import Change, verdict
from llmbench.bench.report.frame import TIDY_COLUMNS
from llmbench.bench.runner import RunRequest, execute_run
from llmbench.bench.scenario import load_scenario
from llmbench.cli.app import app

runner = CliRunner()

SCENARIO = {
    "name": "rep",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 5, "input_len": {"dist": "uniform", "min": 8, "max": 24}, "output_len": 4},
    "arrival": {"kind": "offline"},
    "repeats": 2,
    "telemetry": {"period_ms": 20},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A baseline and a variant (torch attention) in one session, like an ablation writes them."""
    root = tmp_path_factory.mktemp("results")
    path = root / "rep.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    out = {}
    for variant, sets in (("baseline", []), ("attention_backend=torch", ["engine.attention_backend=torch"])):
        resolved = load_scenario(path, sets)
        outcome = execute_run(RunRequest(resolved, root / "runs", variant, session="s1"))
        out[variant] = outcome.run_dir
    return out


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})  # tables unwrapped
    assert "Traceback" not in res.output, res.output
    return res


def test_table_report_groups_by_scenario_and_compares_to_the_baseline(runs):
    res = invoke("report", runs["baseline"].parent)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "rep (changes against baseline)" in out
    assert "attention_backend=torch against baseline" in out
    assert "outputs identical (greedy)" in out and "yes" in out  # sdpa and torch agree on greedy tokens here
    assert "startup seconds" in out


def test_markdown_and_csv_are_views_of_one_tidy_frame(runs):
    md = invoke("report", runs["baseline"].parent, "--format", "markdown")
    assert md.exit_code == 0 and "| metric |" in md.stdout and "---:" in md.stdout
    csv = invoke("report", runs["baseline"].parent, "--format", "csv")
    assert csv.exit_code == 0
    df = pd.read_csv(io.StringIO(csv.stdout))
    assert list(df.columns) == list(TIDY_COLUMNS)
    assert set(df["variant"]) == {"baseline", "attention_backend=torch"}
    summary = json.loads((runs["baseline"] / "summary.json").read_text())
    expected = summary["points"][0]["metrics"]["ttft_p50"]["value"]
    got = df[(df["variant"] == "baseline") & (df["metric"] == "ttft_p50")]["value"].item()
    assert got == pytest.approx(expected)
    assert (df[df["metric"] == "ttft_p50"]["n"] == 2).all()


def test_html_report_is_self_contained_with_plots(runs, tmp_path):
    target = tmp_path / "out" / "report.html"
    res = invoke(
        "report", runs["baseline"], runs["attention_backend=torch"], "--format", "html", "--out", target
    )
    assert res.exit_code == 0, res.output
    html = target.read_text()
    assert html.count("data:image/png;base64,") >= 3  # CDFs, throughput, telemetry
    assert "<table>" in html and 'class="num"' in html
    assert "http://" not in html and "https://" not in html


def test_broken_and_incomplete_folders_are_reported_and_skipped(runs, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(runs["baseline"], mixed / "good")
    (mixed / "corrupt").mkdir()
    (mixed / "corrupt" / "meta.json").write_text("{")
    shutil.copytree(runs["baseline"], mixed / "partial")
    meta = json.loads((mixed / "partial" / "meta.json").read_text())
    (mixed / "partial" / "meta.json").write_text(
        json.dumps({**meta, "status": "incomplete", "stop_reason": "interrupted"})
    )
    res = invoke("report", mixed)
    assert res.exit_code == 0, res.output
    assert (
        "skipped" in res.stderr and "corrupt" in res.stderr and "incomplete run (interrupted)" in res.stderr
    )


@pytest.mark.parametrize("make", ["empty", "missing", "only_broken"])
def test_nothing_to_report_is_a_clean_error(tmp_path, make):
    target = tmp_path / "d"
    if make != "missing":
        target.mkdir()
    if make == "only_broken":
        (target / "summary.json").write_text("[]")
    res = invoke("report", target)
    assert res.exit_code == 2 and "no complete run to report" in res.stderr


def test_unknown_baseline_is_an_error(runs):
    res = invoke("report", runs["baseline"].parent, "--baseline", "nonexistent")
    assert res.exit_code == 2 and "--baseline nonexistent" in res.stderr


def test_compare_a_run_with_itself_passes(runs):
    res = invoke("compare", runs["baseline"], runs["baseline"])
    assert res.exit_code == 0, res.output
    assert "no regression beyond 5%" in res.stderr


def doctored(src: Path, dst: Path, factor: float) -> Path:
    """A copy of a run whose repeats both read like its first, with every latency times ``factor``.

    Equal repeats make the bootstrap interval of the change exactly ``factor - 1``, whatever noise the
    machine put into the original measurements.
    """
    shutil.copytree(src, dst)
    summary = json.loads((dst / "summary.json").read_text())
    for point in summary["points"]:
        first = point["repeats"][0]["metrics"]
        for rep in point["repeats"]:
            rep["metrics"] = {
                k: v * factor if v is not None and k.split("_")[0] in ("ttft", "tpot", "itl", "e2e") else v
                for k, v in first.items()
            }
    (dst / "summary.json").write_text(json.dumps(summary))
    return dst


def test_compare_fails_on_a_regression_beyond_threshold_and_ci(runs, tmp_path):
    base = doctored(runs["baseline"], tmp_path / "base", 1.0)
    slow = doctored(runs["baseline"], tmp_path / "slow", 3.0)
    res = invoke("compare", base, slow, "--fail-above", "10")
    assert res.exit_code == 1
    assert "worse" in res.stdout and "got worse by more than 10%" in res.stderr
    res = invoke(
        "compare", base, doctored(runs["baseline"], tmp_path / "slightly", 1.05), "--fail-above", "10"
    )
    assert res.exit_code == 0 and "worse" not in res.stdout  # beyond its CI, within the threshold
    fast = doctored(runs["baseline"], tmp_path / "fast", 0.5)
    res = invoke("compare", base, fast)
    assert res.exit_code == 0 and "better" in res.stdout and "worse" not in res.stdout


def test_compare_needs_one_configuration_per_side(runs):
    res = invoke("compare", runs["baseline"].parent, runs["baseline"])
    assert res.exit_code == 2 and "holds several configurations" in res.stderr


def test_verdicts():
    mk = lambda m, rel, lo, hi: Change(m, 1.0, 1.0 + rel, rel, lo, hi, "repeats" if lo == lo else None)  # noqa: E731
    nan = float("nan")
    assert verdict(mk("ttft_p50", 0.2, 0.1, 0.3), 0.05) == "worse"
    assert verdict(mk("ttft_p50", 0.2, -0.1, 0.5), 0.05) == "noise"  # beyond the threshold, not beyond the CI
    assert verdict(mk("ttft_p50", 0.03, 0.01, 0.05), 0.05) == "noise"  # beyond the CI, not the threshold
    assert verdict(mk("ttft_p50", 0.2, nan, nan), 0.05) == "worse (no CI)"
    assert verdict(mk("output_throughput", -0.2, -0.3, -0.1), 0.05) == "worse"  # higher is better
    assert verdict(mk("output_throughput", 0.2, 0.1, 0.3), 0.05) == "better"
    assert verdict(mk("num_requests", 0.5, 0.1, 0.9), 0.05) == "n/a"


def test_baseline_can_be_a_run_folder(runs):
    res = invoke("report", runs["baseline"].parent, "--baseline", runs["attention_backend=torch"])
    assert res.exit_code == 0, res.output
    assert "rep (changes against attention_backend=torch)" in res.stdout
    assert "baseline against attention_backend=torch" in res.stdout


def test_runs_resized_by_a_profile_are_not_compared_with_full_size_runs(tmp_path):
    """A `cpu` profile swaps the model and the load: such runs get their own table, never a delta
    against the same scenario measured at full size."""
    import json
    import shutil
    from pathlib import Path

    from llmbench.bench.report.frame import load_groups

    src = next((Path(__file__).parent.parent / "results/h200/chat").glob("*-default"))
    full = tmp_path / "chat" / src.name
    shutil.copytree(src, full)
    small = tmp_path / "chat" / (src.name + "-cpu")
    shutil.copytree(src, small)
    meta = json.loads((small / "meta.json").read_text())
    meta["profile"] = {"name": "cpu", "reason": "torch sees no CUDA device"}
    meta["session"] = "another-session"
    (small / "meta.json").write_text(json.dumps(meta))
    groups, problems = load_groups([tmp_path])
    assert not problems
    assert sorted(g.scenario for g in groups) == ["chat", "chat (cpu profile)"]
