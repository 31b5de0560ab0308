"""``llmbench report`` and ``llmbench compare`` over real run folders (qwen3-tiny), broken ones too."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.report import COMPARISON_COLUMNS
from llmbench.bench.report.compare import Change, verdict
from llmbench.bench.report.format import format_pct
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
    """A baseline and a variant (torch attention) in one ablation, like an ablation writes them."""
    root = tmp_path_factory.mktemp("results")
    path = root / "rep.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    out = {}
    for variant, sets in (("baseline", []), ("attention_backend=torch", ["engine.attention_backend=torch"])):
        resolved = load_scenario(path, sets)
        outcome = execute_run(RunRequest(resolved, root / "runs", variant, ablation="s1"))
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
    # sdpa and torch agree on greedy tokens here: 5 requests in each of 2 repeats
    assert "outputs against the baseline (greedy)" in out and "10/10 identical" in out
    other = invoke(
        "report", runs["baseline"].parent, "--baseline", "attention_backend=torch", "--view", "deltas"
    )
    assert "baseline against attention_backend=torch" in other.stdout
    assert "outputs against attention_backend=torch (greedy)" in other.stdout  # not "the baseline"
    # one ablation: paired by repeat (a repeat shorter than the telemetry period may have no memory sample,
    # and then that one metric pairs one repeat: n=1/2)
    assert re.search(r"repeats paired by index \(n=(1/)?2\)", out), out
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
    # -m picks the rows; --view deltas writes the comparisons, the figures the Markdown shows
    picked = pd.read_csv(
        io.StringIO(invoke("report", runs["baseline"].parent, "-f", "csv", "-m", "tpot_p50").stdout)
    )
    assert set(picked["metric"]) == {"tpot_p50"} and len(picked) == 2
    res = invoke(
        "report", runs["baseline"].parent, "-f", "csv", "--view", "deltas", "-m", "tpot_p50,ttft_p50"
    )
    deltas = pd.read_csv(io.StringIO(res.stdout))
    assert list(deltas.columns) == list(COMPARISON_COLUMNS) and list(deltas["metric"]) == [
        "tpot_p50",
        "ttft_p50",
    ]
    row = deltas.iloc[0]
    assert (row["baseline"], row["variant"]) == ("baseline", "attention_backend=torch")
    assert row["change"] == pytest.approx(row["new"] / row["base"] - 1)
    md = invoke(
        "report", runs["baseline"].parent, "-f", "markdown", "--view", "deltas", "-m", "tpot_p50"
    ).stdout
    assert f"| {row['verdict']} |" in md and format_pct(row["change"]) in md
    res = invoke("report", runs["baseline"].parent, "-f", "csv", "--view", "startup")
    assert res.exit_code == 2 and "--view startup" in res.stderr and "no CSV form" in res.stderr


def test_html_report_is_self_contained_with_plots(runs, tmp_path):
    target = tmp_path / "out" / "report.html"
    res = invoke(
        "report", runs["baseline"], runs["attention_backend=torch"], "--format", "html", "--out", target
    )
    assert res.exit_code == 0, res.output
    html = target.read_text()
    # CDFs, throughput, telemetry, decode steps against their K/V, decode steps by batch size
    assert html.count("data:image/png;base64,") >= 5
    assert "<table>" in html and 'class="num"' in html
    assert "http://" not in html and "https://" not in html
    # A kept result (summaries, no tables): the plots drawn from the summaries are still there, throughput
    # and decode steps by batch size.
    kept = tmp_path / "kept"
    for run in runs.values():
        shutil.copytree(run, kept / run.name, ignore=shutil.ignore_patterns("*.parquet"))
    target = tmp_path / "kept.html"
    assert invoke("report", kept, "--format", "html", "--out", target).exit_code == 0
    assert target.read_text().count("data:image/png;base64,") == 2
    # every figure begun is closed, drawn or not: a report over many kept scenarios neither warns of
    # "more than 20 figures" nor holds them all in memory
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []


def mark_incomplete(run: Path) -> None:
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "status": "incomplete", "stop_reason": "interrupted"}))


def test_broken_folders_are_skipped_and_incomplete_runs_shown_marked(runs, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(runs["baseline"], mixed / "good")
    (mixed / "corrupt").mkdir()
    (mixed / "corrupt" / "meta.json").write_text("{")
    shutil.copytree(runs["baseline"], mixed / "partial")
    mark_incomplete(mixed / "partial")
    res = invoke("report", mixed)
    assert res.exit_code == 0, res.output
    assert "skipped" in res.stderr and "corrupt" in res.stderr and "partial" not in res.stderr
    assert "baseline (incomplete) · offline" in res.stdout  # its own column, marked
    assert "incomplete (interrupted)" in res.stdout  # the status row


def test_an_incomplete_run_is_shown_but_never_judged(runs, tmp_path):
    root = tmp_path / "abl"
    shutil.copytree(runs["baseline"].parent, root)
    mark_incomplete(root / runs["attention_backend=torch"].name)
    res = invoke("report", root, "--format", "markdown")
    assert res.exit_code == 0, res.output
    md = res.stdout
    section = md[md.index("attention_backend=torch (incomplete) against baseline") :].split("###")[0]
    rows = [
        row.split(" | ")
        for row in section.splitlines()
        if row.startswith(("| TTFT", "| TPOT", "| output tok"))
    ]
    verdicts = {cells[-1].rstrip(" |") for cells in rows}
    assert verdicts == {"none (attention_backend=torch (incomplete): incomplete run)"}, verdicts
    # Only an incomplete run: still viewable.
    alone = tmp_path / "alone"
    shutil.copytree(root / runs["attention_backend=torch"].name, alone / "run")
    res = invoke("report", alone)
    assert res.exit_code == 0 and "attention_backend=torch (incomplete)" in res.stdout


def with_warnings(src: Path, dst: Path, warnings: list[str]) -> Path:
    shutil.copytree(src, dst)
    summary = json.loads((dst / "summary.json").read_text())
    (dst / "summary.json").write_text(json.dumps({**summary, "warnings": warnings}))
    return dst


BUSY = "the machine was busy when the run started (1-minute load 7.5 on 2 cores): timings will be noisy"
LAG = "offline repeat 1: the driver fell behind the arrival schedule: hand-over lag p99 50.0 ms, max 80.0 ms"


def test_run_warnings_travel_into_every_format_beside_the_figures(runs, tmp_path):
    root = tmp_path / "abl"
    with_warnings(runs["baseline"], root / runs["baseline"].name, [])  # whatever the machine's load was
    with_warnings(runs["attention_backend=torch"], root / runs["attention_backend=torch"].name, [BUSY, LAG])
    md = invoke("report", root, "--format", "markdown").stdout
    assert "| run warnings | – | busy, lagging |" in md
    assert f"- attention_backend=torch · offline: {BUSY}" in md and LAG in md
    delta = md[md.index("attention_backend=torch against baseline") :].splitlines()
    ttft = next(row for row in delta if row.startswith("| TTFT p50"))
    assert "runs flagged busy, lagging" in ttft  # the verdict says the timings are doubtful
    memory = next(row for row in delta if row.startswith("| peak memory, one device"))
    assert "flagged" not in memory  # a busy machine does not change memory
    target = tmp_path / "r.html"
    assert invoke("report", root, "--format", "html", "--out", target).exit_code == 0
    page = target.read_text()
    assert "busy, lagging" in page and "the driver fell behind the arrival schedule" in page
    csv = pd.read_csv(io.StringIO(invoke("report", root, "--format", "csv").stdout))
    flagged = csv[csv["variant"] == "attention_backend=torch"]["warnings"]
    assert (flagged == "busy; lagging").all()
    assert csv[csv["variant"] == "baseline"]["warnings"].isna().all()
    table = invoke("report", root).stdout
    assert "run warnings" in table and "fell behind the arrival schedule" in table


def test_warnings_of_one_point_stay_with_that_point():
    from llmbench.bench.report.warning_flags import concerns, flag

    points = ["rate=2", "rate=8"]
    lag = "rate=8 repeat 0: the driver fell behind the arrival schedule: hand-over lag p99 40.0 ms"
    assert concerns(lag, "rate=8", points) and not concerns(lag, "rate=2", points)
    assert concerns(BUSY, "rate=2", points) and concerns(BUSY, "rate=8", points)
    assert flag(lag) == "lagging" and flag(BUSY) == "busy"
    assert flag("rate=2 repeat 1: 3 of 40 requests failed: HTTP 500 (3)") == "failed requests"


def test_a_peer_clients_own_warnings_are_flagged_by_what_they_put_in_doubt():
    # The sentences the openai backend writes, as it writes them: a client loop held up is a timing doubt
    # (verdicts say so), counts in doubt and prompts counted differently are flags of their own.
    from llmbench.bench.backends.openai_probe import LoopLag
    from llmbench.bench.backends.openai_warnings import loop_stalls
    from llmbench.bench.records import RequestRecord
    from llmbench.bench.repeat_warnings import count_warnings
    from llmbench.bench.report.warning_flags import TIMING_FLAGS, flag, flags

    def record(**extra) -> RequestRecord:
        return RequestRecord("r0", 8, 4, 0.0, 0.0, 0.0, [0.1, 0.2], [1, 2], "length", **extra)

    held = loop_stalls(LoopLag(0.3, 0.2, [(1.0, 1.3)]), [record(client_stall=0.3)])
    assert held is not None and flag(held) == "lagging" and "lagging" in TIMING_FLAGS
    lag = "offline repeat 0: the driver fell behind the arrival schedule: hand-over lag p99 40.0 ms"
    assert flags([held, lag]) == ["lagging"]  # two wordings, one flag
    (doubt, prompt) = count_warnings(
        "offline repeat 0",
        [record(output_len_source="chunks", count_check="3 chunks", prompt_check="9 tokens")],
    )
    assert flag(doubt) == "output counts" and flag(prompt) == "prompt counts"
    (plain,) = count_warnings("offline repeat 0", [record(output_len_source="text")])
    assert flag(plain) == "output counts"


def test_a_peers_start_up_parts_it_cannot_time_are_not_shown_as_zero(tmp_path):
    from llmbench.bench.report.frame import Group
    from llmbench.bench.report.views import startup
    from llmbench.cli.common import startup_line

    line = startup_line("openai", {"engine_init_time": 0.05})
    assert line == "openai startup 0.05 s — kept apart from the measurements"
    engine = {"engine_init_time": 2.0, "load_time": 0.5, "compile_time": 0.0, "graph_capture_time": 1.0}
    assert "(weights 0.50 s, compile 0.00 s, graph capture 1.00 s)" in startup_line("engine", engine)

    class Run:
        def __init__(self, start: dict) -> None:
            self.meta = {"startup": start}

    peer, ours = (
        Group("s", "", v, [Run(s)], label=v)
        for v, s in (("openai", {"engine_init_time": 0.05}), ("engine", engine))
    )
    rows = startup("s", [peer, ours]).rows
    assert rows[0][2:] == ["0.05", "–", "–", "–"] and rows[1][2:] == ["2.00", "0.50", "0.00", "1.00"]


def test_labels_are_unique_across_ablations_and_identical_run_folders(runs, tmp_path):
    """Two ablations with a 'baseline' each, and two copies of one standalone run: every column and every
    comparison has a label of its own."""
    from llmbench.bench.report import build_report

    for ablation in ("20250101-100000-ablate", "20250102-100000-ablate"):
        for run in runs.values():
            dst = tmp_path / ablation / run.name
            shutil.copytree(run, dst)
            meta = json.loads((dst / "meta.json").read_text())
            (dst / "meta.json").write_text(json.dumps({**meta, "ablation": ablation}))
    for copy in ("a", "b"):  # the same folder name (time stamp) twice, no ablation
        dst = tmp_path / "standalone" / copy / runs["baseline"].name
        shutil.copytree(runs["baseline"], dst)
        meta = json.loads((dst / "meta.json").read_text())
        (dst / "meta.json").write_text(json.dumps({**meta, "ablation": None, "variant": "default"}))
    rep = build_report([tmp_path])
    labels = [g.label for s in rep.sections for g in s.groups]
    assert len(set(labels)) == len(labels) == 6, labels
    assert "baseline @ 20250101-100000-ablate" in labels and "baseline @ 20250102-100000-ablate" in labels
    # each ablation is its own section, judged against its own baseline; the standalone runs share one
    assert len(rep.sections) == 3
    for section in rep.sections:
        for view in section.views:
            assert len(set(view.headers)) == len(view.headers), view.headers
        titles = [v.title for v in section.views]
        assert len(set(titles)) == len(titles)
        compared = [t.split("· offline: ", 1)[1].split(" against ") for t in titles if "· offline: " in t]
        for new, base in compared:
            assert new != base and base.endswith(section.scenario.split(" · ")[-1]), (new, base)


def test_html_plots_latency_against_the_rate_a_sweep_served_and_lists_its_scenarios():
    from llmbench.bench.report.frame import Group
    from llmbench.bench.report.html import rate_curves, render_html

    def repeats(rate: float, ttft: float) -> list[dict]:
        metrics = {"request_throughput": rate, "ttft_p50": ttft, "ttft_p99": 2 * ttft, "tpot_p50": 0.01}
        return [
            {"repeat": r, "metrics": {k: v * (1 + 0.01 * r) for k, v in metrics.items()}} for r in range(2)
        ]

    sweep = Group(
        "s", "a", "v", runs=[], label="v", points={f"rate={r}": repeats(r, 0.02 * r) for r in (1, 2, 4)}
    )
    single = Group("s", "a", "w", runs=[], label="w", points={"offline": repeats(3, 0.05)})
    assert rate_curves([sweep, single]).startswith("<img") and rate_curves([single]) == ""
    page = render_html([("first", [], []), ("second", [], [])], [])
    assert "<a href='#s1'>second</a>" in page and "<h2 id='s1'>second</h2>" in page


def test_html_without_out_writes_a_file_and_prints_its_path(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("report", runs["baseline"], "--format", "html")
    assert res.exit_code == 0, res.output
    assert "<html" not in res.stdout and "base64" not in res.stdout
    (page,) = list(tmp_path.glob("llmbench-report-*.html"))
    assert page.name in res.output
    assert "<html" in page.read_text()


@pytest.mark.parametrize("make", ["empty", "missing", "only_broken"])
def test_nothing_to_report_is_a_clean_error(tmp_path, make):
    target = tmp_path / "d"
    if make != "missing":
        target.mkdir()
    if make == "only_broken":
        (target / "summary.json").write_text("[]")
    res = invoke("report", target)
    assert res.exit_code == 2 and "no run to report" in res.stderr


def test_a_view_asked_for_that_has_nothing_to_show_says_why(runs):
    # one run: nothing to compare; no profile was recorded; the exit code says nothing was shown
    res = invoke("report", runs["baseline"], "--view", "changes")
    assert res.exit_code == 2 and res.stdout.strip() == ""  # a usage error, as an unknown --baseline is
    assert "--view changes: every scenario here has one configuration" in res.stderr
    res = invoke("report", runs["baseline"].parent, "--view", "changes", "--view", "profile")
    assert res.exit_code == 0 and "rep · offline: changes against baseline" in res.stdout
    assert "--view profile: none of these runs was recorded by `llmbench profile`" in res.stderr
    assert "--view changes" not in res.stderr


def test_a_run_whose_summary_is_unreadable_is_named_once(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["baseline"], run)
    (run / "summary.json").write_text("{bad")
    res = invoke("report", run)
    assert res.exit_code == 2, res.output
    assert f"({run}: summary.json is unreadable (" in res.stderr and res.stderr.count(str(run)) == 2


def test_unknown_baseline_is_an_error(runs):
    res = invoke("report", runs["baseline"].parent, "--baseline", "nonexistent")
    assert res.exit_code == 2 and "--baseline nonexistent" in res.stderr


def test_compare_of_two_equal_runs_passes_as_equivalent_and_of_one_folder_twice_is_an_error(runs, tmp_path):
    same = doctored(runs["baseline"], tmp_path / "same", 1.0)
    twin = doctored(runs["baseline"], tmp_path / "twin", 1.0)
    res = invoke("compare", same, twin)
    assert res.exit_code == 0, res.output
    assert "no regression beyond 5% among the 4 comparison(s) judged" in res.stderr
    assert "equivalent" in res.stdout and "better" not in res.stdout and "worse" not in res.stdout
    res = invoke("compare", same, tmp_path / "same" / ".")
    assert res.exit_code == 2 and "BASE and NEW are the same folder" in res.stderr


def test_two_repeats_a_side_show_an_interval_and_no_verdict(runs, tmp_path):
    base = doctored(runs["baseline"], tmp_path / "base", 1.0, repeats=2)
    slow = doctored(runs["baseline"], tmp_path / "slow", 3.0, repeats=2)
    res = invoke("compare", base, slow, "--fail-above", "10")
    assert res.exit_code == 3, res.output  # the gate needs a verdict: none from two repeats, so no pass
    assert "+200.0%" in res.stdout and "inconclusive (n=2)" in res.stdout and "worse" not in res.stdout
    assert (
        "no verdict: none of the 4 comparisons could be judged (too few repeats: use --repeats 3"
        in res.stderr
    )
    assert "no regression beyond" not in res.stderr
    assert "none below 3 repeats (use --repeats 3 or more for one)" in res.stdout + res.stderr


def doctored(src: Path, dst: Path, factor: float | list[float], repeats: int = 3) -> Path:
    """A copy of a run with ``repeats`` repeats that all read like its first, every latency times ``factor``
    (or repeat i's times ``factor[i]``).

    Equal repeats make the interval of the change exactly ``factor - 1``, whatever noise the machine put
    into the original measurements; three of them are enough for a verdict.
    """
    shutil.copytree(src, dst)
    summary = json.loads((dst / "summary.json").read_text())
    factors = factor if isinstance(factor, list) else [factor] * repeats
    latency = ("ttft", "tpot", "itl", "e2e")
    for point in summary["points"]:
        first = point["repeats"][0]
        point["repeats"] = [
            {**first, "repeat": i, "metrics": {
                k: v * f if v is not None and k.split("_")[0] in latency else v for k, v in first["metrics"].items()
            }}
            for i, f in enumerate(factors)
        ]  # fmt: skip
    summary["warnings"] = []  # whatever the machine's load was when the fixture ran
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
    assert res.exit_code == 0 and "worse" not in res.stdout  # beyond zero, within the threshold
    assert "equivalent" in res.stdout
    fast = doctored(runs["baseline"], tmp_path / "fast", 0.5)
    res = invoke("compare", base, fast)
    assert res.exit_code == 0 and "better" in res.stdout and "worse" not in res.stdout


def test_compare_of_single_repeats_never_claims_a_regression(runs, tmp_path):
    one = {}
    for name, factor in (("base", 1.0), ("slow", 3.0)):
        one[name] = doctored(runs["baseline"], tmp_path / name, factor)
        summary = json.loads((one[name] / "summary.json").read_text())
        for point in summary["points"]:
            point["repeats"] = point["repeats"][:1]
        (one[name] / "summary.json").write_text(json.dumps(summary))
    res = invoke("compare", one["base"], one["slow"], "--fail-above", "10")
    assert res.exit_code == 3, res.output
    assert "inconclusive (n=1)" in res.stdout and "worse" not in res.stdout
    assert "one repeat per side has no run-to-run variance" in res.stderr


def test_the_gate_holds_its_false_alarms_for_all_its_comparisons_together(runs, tmp_path):
    base = doctored(runs["baseline"], tmp_path / "base", 1.0)
    # TTFT up by exp(.25), exp(.30), exp(.35): at 95% its interval lies beyond +10% (low end about +19%);
    # widened for the default gate's four metrics (98.75%), it reaches down to about +4.5%.
    slow = doctored(runs["baseline"], tmp_path / "slow", [math.exp(x) for x in (0.25, 0.30, 0.35)])
    res = invoke("compare", base, slow, "--fail-above", "10", "-m", "ttft_p50")
    assert res.exit_code == 1, res.output
    assert "95% CI" in res.stdout and "worse" in res.stdout
    res = invoke("compare", base, slow, "--fail-above", "10")
    assert res.exit_code == 0, res.output
    assert "98.8% CI" in res.stdout and "worse" not in res.stdout
    assert "4 comparisons, each interval at 98.8%" in res.stderr
    said = " ".join(res.stderr.split())  # what the 5% cannot hold: runs of --one-process (written so)
    assert "BASE and NEW's repeats share one process (--one-process)" in said
    for run in (base, slow):  # each repeat in a process of its own: the note says what is still not held
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "repeat_processes": "own"}))
    said = " ".join(invoke("compare", base, slow, "--fail-above", "10").stderr.split())
    assert "each repeat ran in a process of its own, but what differs between two sittings" in said
    assert "share one process" not in said
    assert "inconclusive: no regression shown there, none ruled out" in " ".join(res.stderr.split())
    res = invoke("compare", base, slow, "--fail-above", "10", "--require-all")  # inconclusive fails it
    assert res.exit_code == 3 and "(--require-all)" in res.stderr, res.output
    res = invoke("compare", base, slow, "--fail-above", "20", "-m", "ttft_p50,ttft_p99")  # no verdict left
    assert res.exit_code == 3 and "the repeats spread too widely" in res.stderr, res.output
    res = invoke("compare", base, slow, "-m", "output_throughputt")
    assert res.exit_code == 2 and "did you mean 'output_throughput'" in res.stderr


def test_compare_refuses_other_workloads_and_gives_no_verdict_on_an_incomplete_run(runs, tmp_path):
    base = doctored(runs["baseline"], tmp_path / "base", 1.0)
    new = doctored(runs["baseline"], tmp_path / "new", 1.0)
    edit_json(new / "meta.json", lambda m: m["scenario"]["workload"]["output_len"].update(value=8))
    res = invoke("compare", base, new)
    assert res.exit_code == 2, res.output
    assert "served different workloads (workload.output_len.value: 4 against 8)" in res.stderr
    assert invoke("compare", base, new, "--allow-other-workload").exit_code == 0
    edit_json(new / "meta.json", lambda m: m.update(status="incomplete", stop_reason="interrupted"))
    res = invoke("compare", base, new, "--allow-other-workload")
    assert res.exit_code == 3, res.output
    assert "no verdict: NEW" in res.stderr and "incomplete (interrupted)" in res.stderr
    assert "no regression" not in res.stderr


def test_compare_shows_the_rates_a_sweep_point_served_when_they_differ(runs, tmp_path):
    base = doctored(runs["baseline"], tmp_path / "base", 1.0)
    new = doctored(runs["baseline"], tmp_path / "new", 1.0)
    for side, rate in ((base, 4.0), (new, 3.0)):
        edit_json(
            side / "summary.json",
            lambda s, r=rate: s["points"][0].update(arrival={"kind": "poisson", "rate": r}),
        )
    res = invoke("compare", base, new)
    assert "(BASE at 4 req/s, NEW at 3 req/s)" in " ".join(res.stdout.split()), res.output  # title may wrap


def test_a_prefix_cache_with_nothing_to_share_is_said_beside_its_changes(runs, tmp_path):
    root = tmp_path / "abl"
    shutil.copytree(runs["baseline"].parent, root)
    variant = next(p for p in root.iterdir() if p.name.startswith(runs["attention_backend=torch"].name))
    edit_json(variant / "meta.json", lambda m: m["engine_config"].update(prefix_cache=False))
    out = invoke("report", root, "--view", "deltas").stdout
    assert "prefix_cache: no request of this workload found a cached prefix" in out  # random prompts: 0%
    edit_json(variant / "meta.json", lambda m: m["engine_config"].update(prefix_cache=True))
    assert "prefix_cache: no request" not in invoke("report", root, "--view", "deltas").stdout


def test_a_report_says_when_its_baseline_and_a_variant_ran_different_models(runs, tmp_path):
    base = doctored(runs["baseline"], tmp_path / "a" / "base", 1.0)
    new = doctored(runs["baseline"], tmp_path / "b" / "new", 1.0)
    edit_json(new / "meta.json", lambda m: m.update(model_info={"name": "qwen3-0.6b"}, ablation=None))
    edit_json(base / "meta.json", lambda m: m.update(ablation=None))  # two standalone runs
    for view in ("deltas", "changes"):
        out = invoke("report", base, new, "--baseline", base, "--view", view).stdout
        assert "ran qwen3-tiny" in out and "ran qwen3-0.6b: a comparison across models" in out, out


def test_compare_says_when_base_and_new_ran_on_different_machines(runs, tmp_path):
    base = doctored(runs["baseline"], tmp_path / "base", 1.0)
    new = doctored(runs["baseline"], tmp_path / "new", 1.0)
    same = " ".join(invoke("compare", base, new).output.split())
    assert "across machines" not in same, same  # one machine: nothing to say
    h200 = {"hostname": "gpu-box", "gpus": [{"name": "NVIDIA H200"}] * 2, "cpu_count": 64}
    edit_json(new / "meta.json", lambda m: m.update(machine=h200))
    said = " ".join(invoke("compare", base, new).output.split())
    assert "NEW on 2 x NVIDIA H200: the comparison is across machines as well as configurations" in said, said
    assert "CPUs, no GPU" in said  # BASE: this CPU host
    for side in (base, new):  # two standalone runs
        edit_json(side / "meta.json", lambda m: m.update(ablation=None))
    res = invoke("report", base, new, "--baseline", base, "--view", "changes")
    out = " ".join(res.stdout.split())
    assert "on 2 x NVIDIA H200: a comparison across machines" in out, res.output


def test_compare_needs_one_configuration_per_side(runs):
    res = invoke("compare", runs["baseline"].parent, runs["baseline"])
    assert res.exit_code == 2 and "holds several configurations" in res.stderr


def test_verdicts_are_symmetric_and_need_the_whole_interval_beyond_the_threshold():
    def mk(metric, lo, hi, n=3, rel=None):
        rel = (lo + hi) / 2 if rel is None else rel
        return Change(metric, 1.0, 1.0 + rel, rel, lo, hi, n, "paired" if lo == lo else None)

    nan = float("nan")
    h = 0.05
    assert verdict(mk("ttft_p50", 0.1, 0.3), h) == "worse"
    assert verdict(mk("ttft_p50", -0.3, -0.1), h) == "better"
    assert verdict(mk("output_throughput", -0.3, -0.1), h) == "worse"  # higher is better
    assert verdict(mk("output_throughput", 0.1, 0.3), h) == "better"
    assert verdict(mk("ttft_p50", -0.02, 0.04), h) == "equivalent"
    assert verdict(mk("ttft_p50", -0.1, 0.5), h) == "inconclusive (n=3)"  # beyond the threshold, not its CI
    assert verdict(mk("ttft_p50", 0.03, 0.08), h) == "inconclusive (n=3)"  # beyond zero, not the threshold
    assert verdict(mk("ttft_p50", nan, nan, n=1, rel=0.5), h) == "inconclusive (n=1)"  # no interval
    assert verdict(mk("ttft_p50", nan, nan, n=1, rel=-0.5), h) == "inconclusive (n=1)"  # either way
    assert verdict(mk("num_requests", 0.1, 0.9), h) == "n/a"  # no better direction


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

    src = Path(__file__).parent / "data" / "kept-ablation" / "baseline-r0"  # a run of the cpu profile
    full = tmp_path / "throughput" / src.name
    shutil.copytree(src, full)
    meta = json.loads((full / "meta.json").read_text())
    meta["profile"] = {"name": None, "reason": "torch sees a CUDA device"}
    (full / "meta.json").write_text(json.dumps(meta))
    small = tmp_path / "throughput" / (src.name + "-cpu")
    shutil.copytree(src, small)
    meta = json.loads((small / "meta.json").read_text())
    meta["profile"] = {"name": "cpu", "reason": "torch sees no CUDA device"}
    meta["ablation"] = "another-ablation"
    (small / "meta.json").write_text(json.dumps(meta))
    groups, problems = load_groups([tmp_path])
    assert not problems
    assert sorted(g.scenario for g in groups) == ["throughput", "throughput (cpu profile)"]


def test_each_ablation_is_compared_with_its_own_baseline(tmp_path):
    """Two ablations of one scenario reported together: no variant is judged against the other's baseline."""
    import json
    import shutil
    from pathlib import Path

    src = Path(__file__).parent / "data" / "kept-ablation"
    for name in ("first-ablate", "second-ablate"):
        dst = tmp_path / name
        shutil.copytree(src, dst)
        for meta_path in dst.rglob("meta.json"):
            meta = json.loads(meta_path.read_text())
            meta["ablation"] = name
            meta_path.write_text(json.dumps(meta))
    res = invoke("report", tmp_path, "--view", "changes", "-m", "output_throughput", "--format", "markdown")
    assert res.exit_code == 0, res.output
    titles = [line for line in res.stdout.splitlines() if line.startswith("### ")]
    assert len(titles) == 2 and all("changes against baseline @" in t for t in titles)
    for title, name in zip(sorted(titles), ("first-ablate", "second-ablate"), strict=True):
        assert f"· {name} ·" in title and title.endswith(f"baseline @ {name}")
    rows = [line for line in res.stdout.splitlines() if line.startswith("| baseline @")]
    assert not rows, "a baseline of one ablation was listed as a variant of the other"


def test_the_decode_step_plot_takes_each_variant_s_decode_steps(runs):
    from llmbench.bench.report.frame import load_groups
    from llmbench.bench.report.html import decode_step_points

    groups, _ = load_groups([runs["baseline"]])
    (group,) = groups
    steps = group.runs[0].table("steps")
    decode = steps[steps["kind"] == "decode"]
    x, y = decode_step_points(group)
    assert 0 < x.size == len(decode) < len(steps)  # prefills left out
    assert np.allclose(x, decode["context_tokens"] / 1e3)
    assert np.allclose(y, (decode["end"] - decode["start"]) * 1e3)


def test_decode_steps_by_batch_size_are_kept_per_repeat_and_compared_with_the_baseline(runs):
    # Every repeat's bins hold exactly its decode steps (steps.parquet, which a kept summary goes without);
    # the view's step against the baseline is the ratio of the pooled means in the same bin.
    pooled = {}
    for name, folder in runs.items():
        steps = pd.read_parquet(folder / "steps.parquet")
        summary = json.loads((folder / "summary.json").read_text())
        for entry in summary["points"][0]["repeats"]:
            decode = steps[(steps["kind"] == "decode") & (steps["repeat"] == entry["repeat"])]
            bins = entry["decode_batches"]
            assert sum(b["steps"] for b in bins) == len(decode) > 0
            assert sum(b["time"] for b in bins) == pytest.approx(decode["duration"].sum())
            assert all(b["min"] <= b["seqs"] / b["steps"] <= (b["max"] or np.inf) for b in bins)
        pooled[name] = {}
        for b in (b for e in summary["points"][0]["repeats"] for b in e["decode_batches"]):
            acc = pooled[name].setdefault((b["min"], b["max"]), [0.0, 0])
            acc[0] += b["time"]
            acc[1] += b["steps"]
    res = invoke("report", runs["baseline"].parent, "--view", "batches")
    assert res.exit_code == 0, res.output
    assert "decode steps by batch size" in res.stdout
    (lo, hi), (time, n) = max(pooled["baseline"].items(), key=lambda kv: kv[1][1])  # its most steps
    label = str(lo) if hi == lo else f"{lo}-{hi}"
    row = next(line for line in res.stdout.splitlines() if "attention_backend=torch" in line and "│" in line
               and line.split("│")[0].strip() == label)  # fmt: skip
    other_time, other_n = pooled["attention_backend=torch"][(lo, hi)]
    expected = f"{(other_time / other_n) / (time / n) - 1:+.1%}"
    assert row.split("│")[-1].strip() == expected, row
    assert "decode steps by batch size" not in invoke("report", runs["baseline"].parent).stdout  # asked for


def test_runs_without_the_record_say_so_in_the_batch_view(runs, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(runs["baseline"], old)
    summary = json.loads((old / "summary.json").read_text())
    for entry in summary["points"][0]["repeats"]:
        del entry["decode_batches"]
    (old / "summary.json").write_text(json.dumps(summary))
    res = invoke("report", old, "--view", "batches")
    assert res.exit_code == 0 and "not recorded" in res.stdout, res.output
    for entry in summary["points"][0]["repeats"]:  # recorded, but no engine steps (a peer backend)
        entry["decode_batches"] = []
    (old / "summary.json").write_text(json.dumps(summary))
    res = invoke("report", old, "--view", "batches")
    assert res.exit_code == 0 and "no engine decode steps" in res.stdout, res.output


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_temperature_stored_as_null_reads_as_not_greedy(runs, tmp_path):
    # A run made with sampling.temperature=.inf keeps null (JSON has no inf): the outputs are not compared.
    root = tmp_path / "abl"
    shutil.copytree(runs["baseline"].parent, root)
    for meta in root.glob("*/meta.json"):
        edit_json(meta, lambda m: m["scenario"]["sampling"].update(temperature=None))
    res = invoke("report", root, "--view", "deltas", "-m", "output_throughput", "--format", "markdown")
    assert res.exit_code == 0, res.output
    assert "| outputs against the baseline (greedy) |  | n/a (sampling) |" in res.stdout


def test_values_of_the_wrong_type_read_as_missing_and_the_run_is_named_once(runs, tmp_path):
    root = tmp_path / "abl"
    shutil.copytree(runs["baseline"].parent, root)
    odd = root / runs["attention_backend=torch"].name

    def summary(s):
        s["points"][0]["repeats"][0]["metrics"]["ttft_p50"] = "fast"
        s["points"][0]["repeats"][1]["metrics"]["ttft_p50"] = [1]
        s["points"][0]["repeats"][1]["decode_batches"] = {"min": 1}
        s["warnings"] = [3]

    edit_json(odd / "summary.json", summary)
    edit_json(odd / "meta.json", lambda m: m.update(startup={"load_time": "slow"}, backend=3))
    res = invoke("report", root, "--format", "markdown", "-m", "ttft_p50,output_throughput")
    assert res.exit_code == 0, res.output
    (line,) = [line for line in res.stderr.splitlines() if str(odd) in line]  # named once, all in one line
    assert (
        "values of the wrong type read as missing (–)" in line and "ttft_p50 is 'fast', not a number" in line
    )
    assert "and 3 more" in line
    row = next(r for r in res.stdout.splitlines() if r.startswith("| TTFT p50 (ms) |"))
    assert row.rstrip(" |").endswith("| –")  # the variant's TTFT: missing, not a crash
    # A variant name that is no text cannot be grouped: that run is skipped, saying why.
    edit_json(odd / "meta.json", lambda m: m.update(variant=["x"]))
    res = invoke("report", root)
    assert res.exit_code == 0 and f"skipped {odd}: meta.json 'variant' is [\"x\"], not a text" in res.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [("[1]", "holds an array, not a JSON object"), ("{bad", "not readable JSON")],
)
def test_a_quality_record_that_cannot_be_used_says_so(runs, tmp_path, content, expected):
    root = tmp_path / "abl"
    shutil.copytree(runs["baseline"].parent, root)
    (root / "quality.json").write_text(content)
    res = invoke("report", root, "--view", "quality", "--format", "markdown")
    assert res.exit_code == 0, res.output
    assert f"{root / 'quality.json'}: {expected}" in res.stderr and "quality rows are not shown" in res.stderr
    assert f"quality.json unreadable: {expected}" in res.stdout  # where the rows would be
    bad = {
        "baseline": "baseline",
        "variants": [{"name": "x", "status": "ok", "kl_mean": "abc", "kl_p99": 0.5}],
    }
    (root / "quality.json").write_text(json.dumps(bad))
    res = invoke("report", root, "--view", "quality", "--format", "markdown")
    assert res.exit_code == 0 and "x: kl_mean is 'abc', not a number: read as missing (–)" in res.stderr
    assert "| x | – | – | 0.5 |" in res.stdout


def test_an_existing_folder_as_out_gets_a_file_inside_it(runs, tmp_path):
    res = invoke("report", runs["baseline"], "--format", "markdown", "--out", tmp_path)
    assert res.exit_code == 0, res.output
    (written,) = tmp_path.glob("llmbench-report-*.md")
    assert written.read_text().startswith("### rep")
    blocked = tmp_path / "file"
    blocked.write_text("")
    res = invoke("report", runs["baseline"], "--format", "csv", "--out", blocked / "r.csv")
    assert res.exit_code == 2 and f"--out {blocked / 'r.csv'}: cannot write the report there" in res.stderr
    res = invoke("report", runs["baseline"], "--format", "csv", "--out", f"{tmp_path / 'new' / 'dir'}/")
    assert res.exit_code == 0, res.output  # a path ending in / is a folder to make, not a file named dir
    (written,) = (tmp_path / "new" / "dir").glob("llmbench-report-*.csv")
    assert written.read_text().startswith("scenario,")


def test_a_folder_given_twice_or_inside_another_is_read_once(runs):
    once = invoke("report", runs["baseline"].parent, "--format", "csv")
    for args in ((runs["baseline"], runs["baseline"]), (runs["baseline"].parent, runs["baseline"])):
        res = invoke("report", *args, "--format", "csv")
        assert res.exit_code == 0 and "skipped" not in res.stderr, res.output
        if args[0] == runs["baseline"].parent:
            assert res.stdout == once.stdout  # no run counted twice
    res = invoke("report", runs["baseline"], f"{runs['baseline']}/", "--format", "csv")
    assert res.exit_code == 0 and "skipped" not in res.stderr


def test_an_ablation_whose_variants_all_failed_says_what_its_record_says(tmp_path):
    folder = tmp_path / "tiny" / "20260101-000000-ablate"
    (folder / "baseline-r0").mkdir(parents=True)  # a child stopped before it wrote anything
    variants = [
        {
            "name": "baseline",
            "status": "failed",
            "error": "timed out after 1 s (--timeout); the run was stopped",
        },
        {
            "name": "x=1",
            "status": "failed",
            "error": "warning: the machine was busy\nerror: the engine said no",
        },
    ]
    (folder / "ablation.json").write_text(json.dumps({"baseline": "baseline", "variants": variants}))
    res = invoke("report", folder)
    assert res.exit_code == 2 and "holds no run folder" not in res.stderr
    assert (
        "ablation: every variant failed or timed out: baseline: timed out after 1 s (--timeout); the run "
        "was stopped; x=1: the engine said no)" in res.stderr
    )
    res = invoke("report", tmp_path)
    assert res.exit_code == 2 and "ablation 20260101-000000-ablate: every variant failed" in res.stderr


def test_compare_of_runs_that_share_nothing_fails_rather_than_pass(runs, tmp_path):
    base = doctored(runs["baseline"], tmp_path / "base", 1.0)
    other = doctored(runs["baseline"], tmp_path / "other", 1.0)
    edit_json(other / "summary.json", lambda s: s["points"][0].update(label="rate=4"))
    res = invoke("compare", base, other)
    assert res.exit_code == 2, res.output
    assert "share no sweep point (BASE: offline; NEW: rate=4)" in res.stderr
    assert "nothing was compared" in res.stderr and "no regression" not in res.stderr


def test_compare_warns_when_a_scenario_ran_different_models_or_one_side_has_more(runs, tmp_path):
    base = tmp_path / "base"
    doctored(runs["baseline"], base / "rep", 1.0)
    shutil.copytree(base / "rep", base / "extra")
    edit_json(base / "extra" / "meta.json", lambda m: m.update(scenario_name="extra"))
    new = doctored(runs["baseline"], tmp_path / "new", 1.0)
    edit_json(new / "meta.json", lambda m: m.update(model_info={"name": "qwen3-0.6b"}))
    res = invoke("compare", base, new)
    assert res.exit_code == 0, res.output
    assert "rep: BASE ran qwen3-tiny, NEW ran qwen3-0.6b" in res.stderr
    assert "only in BASE, not compared: extra" in res.stderr
    # one hub id, two snapshots: two models; the same folder on both sides: one
    for side, revision in ((base / "rep", "aaa"), (new, "bbb")):
        edit_json(
            side / "meta.json",
            lambda m, r=revision: m.update(model_info={"name": "o/m", "folder": f"/c/{r}"}),
        )
    res = invoke("compare", base, new)
    assert "rep: BASE ran o/m from /c/aaa, NEW ran o/m from /c/bbb" in res.stderr
    edit_json(new / "meta.json", lambda m: m.update(model_info={"name": "o/m", "folder": "/c/aaa"}))
    assert "BASE ran" not in invoke("compare", base, new).stderr


def test_a_profile_record_of_the_wrong_shape_is_named_not_shown(runs, tmp_path):
    root = tmp_path / "abl"
    shutil.copytree(runs["baseline"].parent, root)
    (root / "profile.json").write_text(
        json.dumps({"variant": "baseline", "kinds": {"decode": {"wall": "x"}}})
    )
    res = invoke("report", root, "--view", "profile")
    assert res.exit_code == 2, res.output  # the one view asked for has nothing to show
    assert f"{root / 'profile.json'}: a field is missing or of the wrong type" in res.stderr
    assert "its profile is not shown" in res.stderr


def test_runs_of_one_name_made_apart_are_labelled_by_the_options_they_differ_in(tmp_path):
    from types import SimpleNamespace

    from llmbench.bench.report.frame import Group, _label

    def group(stamp: str, options: dict) -> Group:
        run = SimpleNamespace(
            meta={"engine_options": options}, path=tmp_path / f"{stamp}-default", summary={}
        )
        return Group("s", stamp, "default", runs=[run], points={})

    one, two, again = (
        group("20261130-101010", {"max_model_len": 4096}),
        group("20261130-111111", {"max_model_len": 4096, "tp": 2}),
        group("20261130-121212", {"max_model_len": 4096, "tuning": {"tp_fuse_norm": False}}),
    )
    _label([one, two, again])
    assert one.label == "default [tp=default, tuning.tp_fuse_norm=default] @ 20261130-101010"
    assert two.label == "default [tp=2, tuning.tp_fuse_norm=default] @ 20261130-111111"
    assert again.label == "default [tp=default, tuning.tp_fuse_norm=False] @ 20261130-121212"
    alone = group("20261130-101010", {"tp": 2})
    _label([alone])
    assert alone.label == "default"  # measured once: nothing to tell apart


def test_runs_measured_apart_on_different_workloads_are_said_so_and_their_outputs_not_compared(tmp_path):
    from types import SimpleNamespace

    from llmbench.bench.report.frame import Group
    from llmbench.bench.report.outputs import compare_outputs
    from llmbench.bench.report.views import pair_notes

    def group(name: str, requests: int, ablation: str | None = None) -> Group:
        scenario = {"workload": {"num_requests": requests}, "sampling": {"temperature": 0.0}}
        meta = {"scenario": scenario, "ablation": ablation, "model": "m"}
        run = SimpleNamespace(meta=meta, path=tmp_path / name, summary={})
        return Group("s", ablation or name, name, runs=[run], label=name, points={"offline": []})

    a, b = group("a", 8), group("b", 16)
    said = compare_outputs(a, b, "offline")
    assert said == "n/a (the runs served different workloads: workload.num_requests: 8 against 16)"
    assert any(
        "a and b served different workloads (workload.num_requests: 8 against 16)" in n
        for n in pair_notes(a, b, "offline")
    )
    # variants of one ablation ran the same requests by design (a sampling toggle changes sampling only)
    x, y = group("x", 8, "abl"), group("y", 16, "abl")
    assert not any("different workloads" in n for n in pair_notes(x, y, "offline"))


def test_out_never_writes_into_a_run_folder_or_over_an_ablations_record(runs, tmp_path):
    run = shutil.copytree(runs["baseline"], tmp_path / "abl" / "baseline-r0")
    record = tmp_path / "abl" / "ablation.json"
    record.write_text('{"baseline": "baseline"}')
    kept = {p: p.read_bytes() for p in [*run.iterdir(), record]}
    for target in (run / "summary.json", run / "meta.json", run / "report.csv", run, record):
        res = invoke("report", run, "--format", "csv", "--out", target)
        assert res.exit_code == 2, (target, res.output)
        assert "write the report elsewhere" in res.stderr, res.stderr
    assert {p: p.read_bytes() for p in kept} == kept
    assert sorted(run.iterdir()) == sorted(kept.keys() - {record})  # nothing added either
    # beside the runs, over a file of the user's own: the path is theirs to name
    mine = tmp_path / "abl" / "report.csv"
    mine.write_text("an older report")
    res = invoke("report", run, "--format", "csv", "--out", mine)
    assert res.exit_code == 0 and mine.read_text().startswith("scenario,"), res.output


def test_compare_names_a_folder_that_does_not_exist_as_such(tmp_path):
    (tmp_path / "empty").mkdir()
    res = invoke("compare", tmp_path / "missing", tmp_path / "empty")
    assert res.exit_code == 2 and "BASE" in res.stderr and "no such file or folder" in res.stderr
    res = invoke("compare", tmp_path / "empty", tmp_path / "missing")
    assert res.exit_code == 2 and "empty: holds no run" in " ".join(res.stderr.split())


def test_runs_made_apart_under_names_of_their_own_are_labelled_with_the_options_they_differ_in(
    runs, tmp_path
):
    for name, src in (("A", runs["baseline"]), ("B", runs["attention_backend=torch"])):
        dst = tmp_path / "rep" / f"20261205-00000{len(name)}-{name}"
        shutil.copytree(src, dst)
        meta = json.loads((dst / "meta.json").read_text())
        (dst / "meta.json").write_text(json.dumps({**meta, "variant": name, "ablation": None}))
    res = invoke("report", tmp_path, "-m", "output_throughput")
    assert res.exit_code == 0, res.output
    # the terminal table prints the brackets as text (not as Rich markup, which would drop them)
    assert "A [attention_backend=default]" in res.stdout and "B [attention_backend=torch]" in res.stdout


def test_compare_says_which_side_a_warning_is_of_when_both_share_a_label(runs, tmp_path):
    base = doctored(runs["baseline"], tmp_path / "base", 1.0)
    new = doctored(runs["baseline"], tmp_path / "new", 1.0)
    summary = json.loads((new / "summary.json").read_text())
    (new / "summary.json").write_text(json.dumps({**summary, "warnings": ["the machine hiccuped"]}))
    res = invoke("compare", base, new, "--fail-above", "10")
    said = " ".join(res.stderr.split())
    assert "NEW (baseline): the machine hiccuped" in said and "BASE (baseline): the machine" not in said, said
