"""A run or a gate that lost requests must not read as a success: ``llmbench run`` exits non-zero when a
repeat completed no request (every one failed), and ``llmbench compare`` fails when NEW lost more of its
requests than BASE (failed, or stopped short of the length asked) by more than chance explains, whatever its
latencies say."""

from __future__ import annotations

import yaml
from test_backend_openai import SCENARIO, Stub
from typer.testing import CliRunner

from llmbench.bench.store import find_runs
from llmbench.cli.app import app


def _scenario(tmp_path, url: str, name: str, **patch) -> str:
    path = tmp_path / f"{name}.yaml"
    data = {**SCENARIO, **patch, "backend_options": {"openai": {"url": url, "model": "stub-model"}}}
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_run_whose_requests_all_failed_exits_non_zero_and_keeps_its_results(tmp_path):
    with Stub(fail=dict.fromkeys(range(4), "500")) as stub:
        res = CliRunner().invoke(
            app, ["run", _scenario(tmp_path, stub.url, "dead"), "--out", str(tmp_path / "r")]
        )
    assert "Traceback" not in res.output, res.output
    assert res.exit_code == 1, res.output
    assert "no request completed in concurrency=1 repeat 1 (of 4: 4 failed)" in " ".join(res.stderr.split())
    (run,), _ = find_runs([tmp_path / "r"])  # kept, with its failures
    assert run.summary["points"][0]["metrics"]["num_failed"]["value"] == 4


def test_a_run_whose_time_limit_cut_every_request_exits_non_zero(tmp_path):
    # the engine on the CPU: max_duration_s far below one request's time aborts all of them
    path = tmp_path / "cut.yaml"
    path.write_text(yaml.safe_dump({"model": "qwen3-tiny", "engine": {"device": "cpu"}, "warmup": 0,
                                    "max_duration_s": 0.001,
                                    "workload": {"num_requests": 3, "input_len": 8, "output_len": 64}}))  # fmt: skip
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "r")])
    said = " ".join(res.output.split())
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "no request completed in offline repeat 1 (of 3: 3 cut by max_duration_s)" in said, said


def test_a_run_whose_time_limit_ended_before_any_request_was_sent_exits_non_zero(tmp_path):
    # offline: sent as the limit allows; a limit of a nanosecond sends none, which measured nothing either
    path = tmp_path / "none.yaml"
    path.write_text(yaml.safe_dump({"model": "qwen3-tiny", "engine": {"device": "cpu"}, "warmup": 0,
                                    "max_duration_s": 1e-9,
                                    "workload": {"num_requests": 2, "input_len": 8, "output_len": 4}}))  # fmt: skip
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "r")])
    said = " ".join(res.output.split())
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "no request completed in offline repeat 1 (of 2: 2 never sent before max_duration_s ended)" in said


def test_a_run_with_some_requests_served_exits_zero(tmp_path):
    # the other side of the rule: one failure of four is a warning (test_backend_openai), not a failed run
    with Stub(fail={2: "500"}) as stub:
        res = CliRunner().invoke(
            app, ["run", _scenario(tmp_path, stub.url, "one"), "--out", str(tmp_path / "r")]
        )
    assert res.exit_code == 0 and "1 of 4 requests failed" in " ".join(res.output.split()), res.output


def _base_and_new(tmp_path, patch: dict, **new_stub) -> tuple[str, str, int]:
    """BASE served by a stub that answers every request, NEW by one told ``new_stub`` (failures, short
    outputs): their run folders, and NEW's run's exit status."""
    codes = []
    for side, stub_args in (("a", {}), ("b", new_stub)):
        with Stub(**stub_args) as stub:
            args = ["run", _scenario(tmp_path, stub.url, "s", **patch), "--out", str(tmp_path / side)]
            codes.append(CliRunner().invoke(app, args).exit_code)
    assert codes[0] == 0, "BASE's run failed"
    (a,), _ = find_runs([tmp_path / "a"])
    (b,), _ = find_runs([tmp_path / "b"])
    return str(a.path), str(b.path), codes[1]


def _compare(base: str, new: str):
    res = CliRunner().invoke(app, ["compare", base, new], env={"COLUMNS": "200"})
    return res, " ".join(res.output.split())


def test_compare_fails_when_new_lost_requests_that_base_served(tmp_path):
    repeats = {"repeats": 3, "warmup": 0, "workload": {**SCENARIO["workload"], "num_requests": 8}}
    # NEW: three requests of each repeat of eight fail, three stop short; the rest are served as fast as
    # BASE's. 9 of 24 against 0 of 24 is p = 0.5^9 = 0.002, below the gate's 0.05 / 6 (four metrics and two
    # kinds of lost request); one per repeat (3 of 12, p = 0.125) would be within chance.
    failed = {i + r: "500" for r in (0, 8, 16) for i in (1, 3, 5)}
    short = {i + r: 3 for r in (0, 8, 16) for i in (2, 4, 6)}
    a, b, new_exit = _base_and_new(tmp_path, repeats, fail=failed, short=short)
    assert new_exit == 0
    res, said = _compare(a, b)
    assert res.exit_code == 1, res.output
    assert "NEW failed 9 of 24 requests (BASE 0 of 24; p = 0.002 < 0.0083, one-sided exact binomial" in said
    assert "NEW's outputs were not the length asked for in 9 of 24 requests (BASE 0 of 24; p = 0.002" in said
    assert "6 comparisons (2 of them whether NEW lost more requests, each at p < 0.0083)" in said
    # the other way round NEW lost fewer than BASE: nothing of the kind is held against it
    _, back = _compare(b, a)
    assert "NEW failed" not in back and "NEW's outputs" not in back, back


def test_compare_fails_when_new_failed_every_request(tmp_path):
    # no latency on NEW's side to hold against BASE's: the lost requests alone are the regression (exit 1),
    # not "nothing was compared" (exit 2, which a gate may read as misconfigured and skip)
    repeats = {"repeats": 3, "warmup": 0, "workload": {**SCENARIO["workload"], "num_requests": 4}}
    a, b, new_exit = _base_and_new(tmp_path, repeats, fail=dict.fromkeys(range(12), "500"))
    assert new_exit == 1
    res, said = _compare(a, b)
    assert res.exit_code == 1 and "Traceback" not in said, said
    assert "NEW failed 12 of 12 requests (BASE 0 of 12" in said and "are the regression" in said


def test_compare_fails_a_small_new_run_that_served_nothing(tmp_path):
    # one repeat of four: 4 of 4 failed against 0 of 4 is p = 0.06, within chance for a test of shares,
    # but a run that completed no request failed outright (exit 1, not "nothing was compared")
    small = {"repeats": 1, "warmup": 0, "workload": {**SCENARIO["workload"], "num_requests": 4}}
    a, b, _ = _base_and_new(tmp_path, small, fail=dict.fromkeys(range(4), "500"))
    res, said = _compare(a, b)
    assert (
        res.exit_code == 1 and "NEW completed no request at" in said and "where BASE completed some" in said
    )
