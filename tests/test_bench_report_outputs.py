"""Generated tokens compared request by request: counts, first divergence, agreement; kept in
comparison.json for reports over folders without request tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from llmbench.bench.ablation.execute import write_comparison
from llmbench.bench.report import build_report
from llmbench.bench.report.frame import load_groups
from llmbench.bench.report.outputs import (
    COMPARISON_FILE,
    compare_outputs,
    compare_tokens,
    describe,
    first_divergence,
)


def test_first_divergence_positions():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([5, 2], [6, 2]) == 0
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # the shorter one ends: that is where they part
    assert first_divergence([], []) is None


def test_counts_divergence_and_agreement_of_constructed_outputs():
    base = [[1, 2, 3, 4], [1, 2, 3, 4], [7, 7, 7, 7], [5, 6, 7, 8]]
    new = [[1, 2, 3, 4], [1, 2, 9, 9], [7, 7, 7, 7], [0, 6, 7, 8]]
    c = compare_tokens(base, new)
    assert (c.compared, c.identical) == (4, 2)
    assert c.mean_first_divergence == pytest.approx((3 + 1) / 2)  # 3rd token and 1st token
    assert c.agreement == pytest.approx((4 + 2 + 4 + 0) / 16)
    assert describe(c) == (
        "2/4 identical · first divergence at token 2 (mean of 2) · 62.5% of tokens agree before it"
    )
    same = compare_tokens(base, base)
    assert describe(same) == "4/4 identical" and math.isnan(same.mean_first_divergence)


def fake_run(folder: Path, variant: str, tokens: list[list[int]], temperature: float = 0.0) -> Path:
    """A run folder as ``run`` writes one, reduced to what a report of outputs reads."""
    folder.mkdir(parents=True)
    meta = {
        "status": "complete",
        "scenario_name": "toy",
        "variant": variant,
        "ablation": folder.parent.name,
        "backend": "engine",
        "scenario": {"sampling": {"temperature": temperature}},
    }
    metrics = {"ttft_p50": 0.1, "output_throughput": 50.0}
    repeats = [{"repeat": r, "status": "complete", "metrics": metrics} for r in (0, 1)]
    summary = {"points": [{"label": "offline", "repeats": repeats, "metrics": {}}], "warnings": []}
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / "summary.json").write_text(json.dumps(summary))
    rows = [
        {"point": "offline", "repeat": r, "request_id": f"p0r{r}-{i}", "token_ids": t, "output_len": len(t)}
        for r in (0, 1)
        for i, t in enumerate(tokens)
    ]
    pd.DataFrame(rows).to_parquet(folder / "requests.parquet", index=False)
    return folder


def runs_without_tables(folder):
    """A baseline and a variant run under ``folder`` whose request tables were not kept."""
    fake_run(folder / "baseline-r0", "baseline", [[1, 2]])
    fake_run(folder / "x-r0", "x", [[1, 2]])
    for parquet in folder.glob("*/requests.parquet"):
        parquet.unlink()


def baseline_and_variant(folder):
    """The two groups of runs under ``folder``: the baseline first."""
    groups, _ = load_groups([folder])
    base, new = sorted(groups, key=lambda g: g.variant != "baseline")
    return base, new


def test_a_request_cut_short_on_a_side_is_left_out_not_counted_as_a_divergence(tmp_path):
    fake_run(tmp_path / "baseline-r0", "baseline", [[1, 2, 3], [4, 5, 6]])
    new = fake_run(tmp_path / "x-r0", "x", [[1, 2, 3], [4]])  # the second stopped by an interrupt
    table = pd.read_parquet(new / "requests.parquet")
    table["finish_reason"] = ["length" if len(t) == 3 else "abort" for t in table["token_ids"]]
    table.to_parquet(new / "requests.parquet", index=False)
    base, variant = baseline_and_variant(tmp_path)
    c = compare_outputs(base, variant, "offline")
    assert (c.compared, c.identical, c.cut_short) == (2, 2, 2)  # one request in each of two repeats
    assert describe(c) == "2/2 identical · 2 unfinished on a side, not compared"


def test_an_ablation_keeps_the_comparison_for_reports_without_request_tables(tmp_path):
    folder = tmp_path / "20250101-100000-ablate"
    fake_run(folder / "baseline-r0", "baseline", [[1, 2, 3, 4], [5, 6, 7, 8]])
    fake_run(folder / "x-r0", "x", [[1, 2, 3, 4], [5, 6, 0, 0]])
    write_comparison(folder, "baseline")
    record = json.loads((folder / COMPARISON_FILE).read_text())
    (row,) = record["comparisons"]
    assert (row["variant"], row["point"], row["compared"], row["identical"]) == ("x", "offline", 4, 2)
    expected = "2/4 identical · first divergence at token 3 (mean of 2) · 75.0% of tokens agree before it"
    base, new = baseline_and_variant(folder)
    assert describe(compare_outputs(base, new, "offline")) == expected  # measured from the tables
    for parquet in folder.glob("*/requests.parquet"):
        parquet.unlink()
    rep = build_report([folder])
    (delta,) = [v for v in rep.sections[0].views if "against" in v.title and "·" in v.title]
    (outputs,) = [r for r in delta.rows if r[0].startswith("outputs")]
    assert outputs[2] == expected  # read back from comparison.json


def test_without_tables_or_a_record_the_report_says_so(tmp_path):
    folder = tmp_path / "s"
    runs_without_tables(folder)
    base, new = baseline_and_variant(folder)
    assert compare_outputs(base, new, "offline") == "n/a (requests.parquet not kept)"


def test_sampled_runs_are_not_compared(tmp_path):
    fake_run(tmp_path / "s" / "baseline-r0", "baseline", [[1, 2]], temperature=0.7)
    fake_run(tmp_path / "s" / "x-r0", "x", [[1, 2]], temperature=0.7)
    base, new = baseline_and_variant(tmp_path / "s")
    assert compare_outputs(base, new, "offline") == "n/a (sampling)"


def test_a_temperature_not_recorded_is_not_greedy(tmp_path):
    fake_run(tmp_path / "s" / "baseline-r0", "baseline", [[1, 2]], temperature=None)
    fake_run(tmp_path / "s" / "x-r0", "x", [[1, 2]])
    base, new = baseline_and_variant(tmp_path / "s")
    assert compare_outputs(base, new, "offline") == "n/a (sampling)"


def test_a_stored_comparison_of_the_wrong_shape_is_not_used_and_is_named(tmp_path):
    folder = tmp_path / "20250101-100000-ablate"
    runs_without_tables(folder)
    record = {
        "baseline": "baseline",
        "comparisons": [{"variant": "x", "point": "offline", "compared": "4"}, 7],
    }
    for content, expected in (
        (json.dumps(record), "comparisons[0]: compared/identical are not integers; comparisons[1] is 7"),
        ("[]", "holds an array, not a JSON object"),
    ):
        (folder / COMPARISON_FILE).write_text(content)
        rep = build_report([folder])
        (delta,) = [v for v in rep.sections[0].views if "against" in v.title and "·" in v.title]
        (outputs,) = [r for r in delta.rows if r[0].startswith("outputs")]
        assert outputs[2] == "n/a (requests.parquet not kept)"
        (doubt,) = rep.doubts
        assert doubt.path == folder / COMPARISON_FILE and doubt.reason.startswith(expected)
