"""What ``report`` and ``compare`` make of result folders that were copied, moved or slimmed by hand.

An ablation is known by its folder: two ablations of one name (started in the same second) are never
pooled, and a copy of one (a backup inside the tree reported) is read once and named. A meta.json field of
the wrong type, or a request table without the columns the output comparison needs, costs what is drawn
from it, with a warning, never the report.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.report import build_report
from llmbench.bench.runner import RunRequest, execute_run
from llmbench.bench.scenario import load_scenario
from llmbench.bench.store import slug
from llmbench.cli.app import app

runner = CliRunner()

SCENARIO = {
    "name": "mv",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 3, "input_len": {"dist": "uniform", "min": 8, "max": 16}, "output_len": 3},
    "arrival": {"kind": "offline"},
    "repeats": 2,
    "telemetry": {"period_ms": 20},
}
NAME = "20250101-120000-ablate"
VARIANT = "attention_backend=torch"


@pytest.fixture(scope="module")
def ablation(tmp_path_factory) -> Path:
    """An ablation folder as ``llmbench ablate`` writes one: a folder per variant and repeat."""
    root = tmp_path_factory.mktemp("results")
    path = root / "mv.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    folder = root / NAME
    for repeat in (0, 1):
        for variant, sets in (("baseline", []), (VARIANT, ["engine.attention_backend=torch"])):
            run_dir = folder / f"{slug(variant)}-r{repeat}"
            execute_run(RunRequest(load_scenario(path, sets), root, variant, run_dir, NAME, repeat))
    return folder


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})
    assert "Traceback" not in res.output and "unexpected" not in res.output, res.output
    return res


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def every_view_works(*paths: Path, html: Path) -> str:
    """The default report, the compact changes, CSV and HTML over ``paths``: all exit 0; the default's
    output (stdout and stderr)."""
    res = invoke("report", *paths)
    assert res.exit_code == 0, res.output
    for args in (["--view", "changes"], ["-f", "csv", "--view", "deltas"], ["-f", "html", "-o", html]):
        other = invoke("report", *paths, *args)
        assert other.exit_code == 0, other.output
    return res.output


def repeats(paths: list[Path]) -> list[int]:
    rep = build_report(paths)
    return [len(entries) for s in rep.sections for g in s.groups for entries in g.points.values()]


def test_two_ablations_of_one_name_in_two_folders_are_never_pooled(ablation, tmp_path):
    shutil.copytree(ablation, tmp_path / "a" / NAME)
    shutil.copytree(ablation, tmp_path / "b" / NAME)
    for meta in (tmp_path / "b").rglob("meta.json"):  # another ablation, started in the same second
        edit_json(meta, lambda m: m.update(pid=m["pid"] + 1, started_at=m["started_at"] + "x"))
    out = every_view_works(tmp_path, html=tmp_path / "r.html")
    assert repeats([tmp_path]) == [2, 2, 2, 2]  # not 4: each ablation's own
    rep = build_report([tmp_path])
    assert [s.scenario for s in rep.sections] == [f"mv · {tmp_path / x / NAME}" for x in "ab"]
    assert all(s.baseline is not None and len({g.home for g in s.groups}) == 1 for s in rep.sections)
    assert "a copy of" not in out


@pytest.mark.parametrize("layout", ["ablate", "profile"])
def test_a_copy_of_an_ablation_or_profile_is_read_once_and_named(ablation, tmp_path, layout):
    original, backup = tmp_path / "results" / NAME, tmp_path / "backup-of-it"
    if layout == "ablate":
        shutil.copytree(ablation, original)
    else:  # <profile>/<variant>/run/: one run per variant
        for variant in ("baseline", VARIANT):
            shutil.copytree(ablation / f"{slug(variant)}-r0", original / slug(variant) / "run")
    shutil.copytree(original, backup)
    out = every_view_works(tmp_path / "results", backup, html=tmp_path / "r.html")
    runs = 4 if layout == "ablate" else 2
    said = " ".join(out.split())
    first, copy = sorted([original, backup], key=str)  # runs are read in the order of their paths
    assert f"skipped {copy}: a copy of {first} (the same {runs} runs of {NAME}): read once" in said
    assert repeats([tmp_path / "results", backup]) == [runs // 2] * 2
    assert "identical" in invoke("report", backup, original, "--view", "changes").stdout


def test_a_request_found_twice_in_one_ablation_folder_is_compared_once(ablation, tmp_path):
    folder = tmp_path / NAME
    shutil.copytree(ablation, folder)
    twin = folder / "baseline-r0-copy"
    shutil.copytree(folder / "baseline-r0", folder / "baseline-r0-same")  # an exact copy: read once
    shutil.copytree(folder / "baseline-r0", twin)  # a copy edited by hand: its requests are there twice
    edit_json(twin / "summary.json", lambda s: s.update(warnings=["edited"]))
    out = every_view_works(folder, html=tmp_path / "r.html")
    assert (
        f"skipped {folder / 'baseline-r0-same'}: a copy of {folder / 'baseline-r0'} (the same run"
        in " ".join(out.split())
    )


@pytest.mark.parametrize(
    "field, value, wrong",
    [("command_line", 5, "5, not a list"), ("engine_options", [1], "[1], not an object"),
     ("engine_config", "x", "'x', not an object")],
)  # fmt: skip
def test_a_meta_field_of_the_wrong_type_reads_as_missing(ablation, tmp_path, field, value, wrong):
    folder = tmp_path / NAME
    shutil.copytree(ablation, folder)
    damaged = folder / "baseline-r0"
    edit_json(damaged / "meta.json", lambda m: m.update({field: value}))
    alone = tmp_path / "alone" / "run"  # the same variant name measured apart: labels compare options
    shutil.copytree(ablation / "baseline-r1", alone)
    edit_json(alone / "meta.json", lambda m: m.update(ablation=None))
    out = every_view_works(folder, alone, html=tmp_path / "r.html")
    assert (
        f"{damaged}: values of the wrong type read as missing (–): meta.json {field} is {wrong}"
        in " ".join(out.split())
    )
    assert invoke("compare", alone, damaged).exit_code in (0, 1, 3)  # a verdict or none, never a crash


def test_rows_asked_for_by_name_are_shown_when_every_figure_is_missing(ablation, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ablation / "baseline-r0", run)

    def no_throughput(summary: dict) -> None:
        for entry in summary["points"][0]["repeats"]:
            entry["metrics"]["output_throughput"] = None

    edit_json(run / "summary.json", no_throughput)
    asked = invoke("report", run, "-m", "output_throughput,ttft_p50").stdout
    assert any(line.startswith("output tok/s") and line.rstrip().endswith("–") for line in asked.splitlines())
    assert "output tok/s" not in invoke("report", run).stdout  # a default row with nothing: dropped


@pytest.mark.parametrize("table", ["no token_ids", "foreign columns"])
def test_a_request_table_without_the_compared_columns_costs_the_output_comparison_only(
    ablation, tmp_path, table
):
    folder = tmp_path / NAME
    shutil.copytree(ablation, folder)
    slimmed = folder / f"{slug(VARIANT)}-r1" / "requests.parquet"
    df = pd.read_parquet(slimmed)
    (df.drop(columns=["token_ids"]) if table == "no token_ids" else pd.DataFrame({"a": [1]})).to_parquet(
        slimmed
    )
    missing = "token_ids" if table == "no token_ids" else "point, repeat, request_id, token_ids"
    out = " ".join(every_view_works(folder, html=tmp_path / "r.html").split())
    assert f"{slimmed}: lacks the column{'s' if ',' in missing else ''} {missing} that the output" in out
    assert "TTFT p50" in out  # every figure of summary.json is shown
    changes = invoke("report", folder, "--view", "changes").stdout
    assert f"(greedy): n/a (not compared: {slimmed} lacks the column" in " ".join(changes.split())
    # the ablation's own record of the comparison, when it wrote one, is used instead
    row = {"variant": VARIANT, "point": "offline", "compared": 6, "identical": 6}
    (folder / "comparison.json").write_text(json.dumps({"baseline": "baseline", "comparisons": [row]}))
    assert "(greedy): 6/6 identical" in invoke("report", folder, "--view", "changes").stdout


def test_a_skipped_folder_is_named_once(ablation, tmp_path):
    shutil.copytree(ablation / "baseline-r0", tmp_path / "good")
    broken = tmp_path / "broken"
    shutil.copytree(ablation / "baseline-r0", broken)
    (broken / "summary.json").write_text("{")
    res = invoke("report", tmp_path)
    assert res.exit_code == 0, res.output
    said = " ".join(res.stderr.split())
    assert said.count(str(broken)) == 1 and f"skipped {broken}: summary.json is unreadable" in said
    doc = tmp_path / "DOC.md"  # a document's block over them: the same error, the path once
    doc.write_text("<!-- llmbench: report . -m output_throughput -->\n<!-- /llmbench -->\n")
    res = invoke("docs", "--check", doc)
    said = " ".join(res.output.split())
    assert (
        res.exit_code == 2
        and said.count(str(broken)) == 1
        and f"{broken}: summary.json is unreadable" in said
    )


def test_of_two_copies_the_one_where_llmbench_wrote_it_is_read_and_the_other_named():
    from pathlib import Path

    from llmbench.bench.report.copies import written_where_made
    from llmbench.bench.store import Run

    meta = {"ablation": "20260101-000000-ablate", "scenario_name": "chat"}
    made = Run(Path("/r/chat/20260101-000000-ablate/baseline-r0"), meta, {})
    copied = Run(Path("/backup/a-copy/20260101-000000-ablate/baseline-r0"), meta, {})
    alone = Run(Path("/r/chat/20260101-000000-default"), {"scenario_name": "chat"}, {})
    assert written_where_made(made) and not written_where_made(copied) and written_where_made(alone)
