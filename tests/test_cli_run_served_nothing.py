"""A run or a gate that lost requests must not read as a success: ``llmbench run`` exits non-zero when a
repeat completed no request (every one failed), and ``llmbench compare`` fails when NEW lost more of its
requests than BASE (failed, or stopped short of the length asked), whatever its latencies say."""

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


def test_a_run_with_some_requests_served_exits_zero(tmp_path):
    # the other side of the rule: one failure of four is a warning (test_backend_openai), not a failed run
    with Stub(fail={2: "500"}) as stub:
        res = CliRunner().invoke(
            app, ["run", _scenario(tmp_path, stub.url, "one"), "--out", str(tmp_path / "r")]
        )
    assert res.exit_code == 0 and "1 of 4 requests failed" in " ".join(res.output.split()), res.output


def test_compare_fails_when_new_lost_requests_that_base_served(tmp_path):
    runner = CliRunner()
    repeats = {"repeats": 3, "warmup": 0}
    with Stub() as stub:
        base = runner.invoke(
            app, ["run", _scenario(tmp_path, stub.url, "base", **repeats), "--out", str(tmp_path / "a")]
        )
    assert base.exit_code == 0, base.output
    # NEW: one request of each repeat fails, one stops short; the rest are served as fast as BASE's
    with Stub(fail={1: "500", 5: "500", 9: "500"}, short={2: 3, 6: 3, 10: 3}) as stub:
        new = runner.invoke(
            app, ["run", _scenario(tmp_path, stub.url, "base", **repeats), "--out", str(tmp_path / "b")]
        )
    assert new.exit_code == 0, new.output
    (a,), _ = find_runs([tmp_path / "a"])
    (b,), _ = find_runs([tmp_path / "b"])
    res = runner.invoke(app, ["compare", str(a.path), str(b.path)], env={"COLUMNS": "200"})
    said = " ".join(res.output.split())
    assert res.exit_code == 1, res.output
    assert "NEW failed 3 of 12 requests (BASE 0 of 12)" in said
    assert "NEW's outputs were not the length asked for in 3 of 12 requests (BASE 0 of 12)" in said
    # the other way round NEW lost fewer than BASE: nothing of the kind is held against it
    back = " ".join(
        runner.invoke(app, ["compare", str(b.path), str(a.path)], env={"COLUMNS": "200"}).output.split()
    )
    assert "NEW failed" not in back and "NEW's outputs" not in back, back
