"""``llmbench run`` with two or more repeats measures each in a process of its own and writes one run folder
(bench/repeat_processes.py, bench/repeat_parts.py): what its intervals hold, the merged tables' one time
axis, a repeat's process that fails or is interrupted, and ``--one-process``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from child_hooks import in_child_processes
from typer.testing import CliRunner

from llmbench.bench.repeat_parts import Part, merge_parts
from llmbench.bench.store import find_runs
from llmbench.cli.app import app

runner = CliRunner()

TINY = {
    "name": "tiny",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 5, "input_len": {"dist": "uniform", "min": 8, "max": 24}, "output_len": 4},
    "arrival": {"kind": "poisson", "rate": [40, 80]},
    "warmup": 1,
    "repeats": 2,
    "telemetry": {"period_ms": 20},
}


def scenario(tmp_path: Path, **patch) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, **patch}))
    return path


def only_run(root: Path):
    runs, problems = find_runs([root])
    assert len(runs) == 1 and not problems, (runs, problems)
    return runs[0]


def test_each_repeat_runs_in_a_process_of_its_own_and_the_run_is_one_folder(tmp_path):
    res = runner.invoke(app, ["run", str(scenario(tmp_path)), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "repeat 1/2, in a process of its own" in res.stderr and "repeat 2/2, in a" in res.stderr
    assert "backend_options" not in res.stderr  # what the scenario did not set is not said to be set
    run = only_run(tmp_path / "r")
    pids = [p["pid"] for p in run.meta["repeat_processes"]]
    assert len(set(pids)) == 2 and os.getpid() not in pids and run.meta["pid"] == os.getpid()
    assert [p["repeat"] for p in run.meta["repeat_processes"]] == [0, 1]
    assert run.summary["repeat_processes"] == "own" and run.meta["status"] == "complete"
    assert not any(run.path.parent.glob(".tmp-*")) and not (run.path / "parts").exists()
    for point in run.summary["points"]:
        assert [e["repeat"] for e in point["repeats"]] == [0, 1]
        # a point's figures: the mean over both repeats' processes, with an interval over them
        values = [e["metrics"]["output_throughput"] for e in point["repeats"]]
        merged = point["metrics"]["output_throughput"]
        assert (
            merged["value"] == pytest.approx(np.mean(values))
            and merged["n"] == 2
            and merged["ci"] == "repeats"
        )
    reqs, steps, tele = run.table("requests"), run.table("steps"), run.table("telemetry")
    assert sorted(set(zip(reqs["point"], reqs["repeat"], strict=True))) == [
        (p, r) for p in ("rate=40", "rate=80") for r in (0, 1)
    ]
    # one time axis: the second process's requests and steps come after the first's
    assert reqs[reqs["repeat"] == 1]["arrival"].min() > reqs[reqs["repeat"] == 0]["last_token"].max()
    assert steps[steps["repeat"] == 1]["start"].min() > steps[steps["repeat"] == 0]["end"].max()
    assert tele["time"].max() > reqs[reqs["repeat"] == 1]["arrival"].min()  # both processes' samples
    window = run.summary["points"][0]["repeats"][1]["window"]
    first = reqs[(reqs["repeat"] == 1) & (reqs["point"] == "rate=40")]["arrival"].min()
    assert window[0] == pytest.approx(first, abs=0.05)  # the summary's windows are on the same axis
    assert "each in a process of its own" in " ".join(res.stderr.split())  # the intervals' note
    assert "(the first of 2 processes; `report --view startup` has their mean)" in " ".join(
        res.stderr.split()
    )
    shown = runner.invoke(app, ["report", str(run.path), "--intervals", "-m", "output_throughput"])
    assert "95% t-interval over the repeats" in shown.stdout and "shared one process" not in shown.stdout
    shown = runner.invoke(app, ["report", str(run.path), "--view", "startup", "--format", "markdown"])
    (row,) = [line for line in shown.stdout.splitlines() if line.startswith("| default")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    inits = [p["startup"]["engine_init_time"] for p in run.meta["repeat_processes"]]
    assert cells[1] == "2" and float(cells[2]) == pytest.approx(np.mean(inits), abs=0.006)  # both start-ups


def test_one_process_measures_every_repeat_in_the_run_s_own(tmp_path):
    path = scenario(tmp_path, arrival={"kind": "poisson", "rate": 40})
    res = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "r"), "--one-process"])
    assert res.exit_code == 0, res.output
    assert "repeat 1/2, in a process of its own" not in res.stderr
    run = only_run(tmp_path / "r")
    assert "repeat_processes" not in run.meta and run.summary.get("repeat_processes") is None
    assert run.meta["pid"] == os.getpid() and len(run.summary["points"][0]["repeats"]) == 2
    assert "all in one process (--one-process)" in " ".join(res.stderr.split())
    shown = runner.invoke(app, ["report", str(run.path), "--intervals", "-m", "output_throughput"])
    assert "the repeats of default shared one process" in " ".join(shown.stdout.split())


def test_a_repeat_process_that_fails_at_start_up_is_the_runs_error(tmp_path, monkeypatch):
    # The repeats' processes meet a model that fails as its engine is built.
    in_child_processes(
        tmp_path,
        monkeypatch,
        """
        from llmbench.engine import llm_engine
        from llmbench.models.errors import ModelError
        def broken(self, *args, **kwargs):
            raise ModelError('the model broke as its engine was built\\nsecond line of the message')
        llm_engine.LLMEngine.__init__ = broken
        """,
    )
    res = runner.invoke(app, ["run", str(scenario(tmp_path)), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2, res.output  # the model's error, as a run in one process gives it
    said = res.stderr
    assert "error: the model broke as its engine was built\nsecond line of the message" in said, said
    assert "error: error:" not in said and "Traceback" not in res.output
    assert "repeat 2/2" not in said  # the first repeat's failure ends the run
    assert not (tmp_path / "r" / "tiny").exists() or not any((tmp_path / "r" / "tiny").iterdir())


def test_every_repeat_runs_the_scenario_as_resolved_when_its_file_changes_during_the_run(
    tmp_path, monkeypatch
):
    path = scenario(tmp_path, arrival={"kind": "poisson", "rate": 40})
    monkeypatch.setenv("EDIT_ME", str(path))
    in_child_processes(  # the first repeat's process rewrites the user's file as it starts
        tmp_path,
        monkeypatch,
        """
        import os, pathlib
        if REPEAT == 0:
            p = pathlib.Path(os.environ["EDIT_ME"])
            p.write_text(p.read_text().replace("output_len: 4", "output_len: 9"))
        """,
    )
    res = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "r"), "--set", "warmup=0"])
    assert res.exit_code == 0, res.output
    assert "output_len: 9" in path.read_text()  # the edit happened
    run = only_run(tmp_path / "r")
    assert set(run.table("requests")["output_len"]) == {4}  # both repeats ran the scenario as it was
    # meta.json says what the user ran: the file, the overrides, the profile as chosen for the run
    assert run.meta["scenario_path"] == str(path) and run.meta["overrides"] == ["warmup=0"]
    assert run.meta["profile"]["reason"] == "no profile for the CPU (engine.device is 'cpu')"


def test_a_repeat_that_ran_other_code_is_left_out_and_stops_the_run(tmp_path, monkeypatch):
    in_child_processes(
        tmp_path,
        monkeypatch,
        """
        if REPEAT == 1:
            from llmbench.bench import hardware
            hardware.source_digest = lambda: "edited meanwhile"
        """,
    )
    path = scenario(tmp_path, arrival={"kind": "poisson", "rate": 40}, repeats=3)
    res = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "r")])
    assert res.exit_code == 1, res.output
    said = " ".join(res.stderr.split())
    assert "repeat 2 of 3: it ran other llmbench's code than repeat 1" in said, said
    run = only_run(tmp_path / "r")
    assert run.meta["status"] == "incomplete" and run.meta["stop_reason"] == "failed"
    assert [e["repeat"] for e in run.summary["points"][0]["repeats"]] == [0]  # the other code's is left out


def test_a_repeat_process_killed_by_a_signal_says_so(tmp_path, monkeypatch):
    in_child_processes(
        tmp_path,
        monkeypatch,
        """
        import os, signal
        if REPEAT == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    path = scenario(tmp_path, arrival={"kind": "poisson", "rate": 40})
    res = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "r")])
    assert res.exit_code == 1, res.output
    said = " ".join(res.stderr.split())
    assert "repeat 2 of 2: its process was killed by SIGKILL (signal 9)" in said, said
    run = only_run(tmp_path / "r")
    assert "killed by SIGKILL" in run.meta["error"] and len(run.summary["points"][0]["repeats"]) == 1


@pytest.mark.slow
def test_an_interrupt_during_a_later_repeat_keeps_the_repeats_measured(tmp_path):
    path = scenario(
        tmp_path,
        workload={**TINY["workload"], "num_requests": 300, "output_len": 40},
        arrival={"kind": "concurrency", "concurrency": 2},
        warmup=0,
    )
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "llmbench", "run", str(path), "--out", str(out), "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 600  # the first repeat whole, on a loaded machine
    while time.monotonic() < deadline:  # until the second repeat's process has measured a little
        logs = list(out.glob("tiny/.tmp-*/parts/r1.events"))
        if logs and '"progress"' in logs[0].read_text():
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    else:
        pytest.fail("the second repeat never started")
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at the terminal: the run's process and its repeat's
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()
    run = only_run(out)
    assert run.meta["status"] == "incomplete" and run.meta["stop_reason"] == "interrupted"
    point = run.summary["points"][0]
    assert [e["status"] for e in point["repeats"]] == ["complete", "interrupted"]
    assert point["repeats"][1]["metrics"]["num_completed"] < 300  # kept, as it was when stopped
    assert point["metrics"]["num_completed"]["value"] == 300 and point["metrics"]["num_completed"]["n"] == 1
    assert not (run.path / "parts").exists()


def _part(
    repeat: int, started: float, status: str, completed: float, warnings: list[str], slow: str = ""
) -> Part:
    entry = {
        "repeat": repeat,
        "status": status,
        "window": [1.0, 2.0],
        "metrics": {"num_completed": completed},
    }
    summary = {
        "points": [{"label": "offline", "arrival": {}, "repeats": [entry], "metrics": {}}],
        "warnings": warnings,
        "unavailable": {f"x{repeat}": "why"},
    }
    meta = {"started_unix": started, "repeat_index": repeat, "pid": 100 + repeat, "status": status}
    steps = {"repeat": [repeat] * 2, "step": [5, 6], "start": [1.2, 1.25], "end": [1.3, 1.35]}
    tables = {
        "requests": pd.DataFrame({"repeat": [repeat], "arrival": [1.0], "token_times": [[1.5, 2.0]]}),
        "steps": pd.DataFrame({**steps, "slow": [bool(slow), False], "slow_causes": [slow, ""]}),
        "telemetry": pd.DataFrame({"time": [1.1]}),
    }
    return Part(Path(f"r{repeat}"), meta, summary, tables)


def test_parts_merge_on_one_clock_and_a_stopped_repeat_is_left_out_of_the_figures():
    parts = [_part(0, 1000.0, "complete", 10, ["w", "a"]), _part(1, 1010.0, "failed", 3, ["w", "b"])]
    meta, summary, tables = merge_parts(
        parts, "failed", "it broke", {"pid": 1, "command_line": "llmbench run"}
    )
    assert meta["status"] == summary["status"] == "incomplete" and meta["error"] == "it broke"
    assert meta["pid"] == 1 and meta["command_line"] == "llmbench run" and meta["repeat_index"] is None
    assert summary["warnings"] == ["w", "a", "b"] and set(summary["unavailable"]) == {"x0", "x1"}
    point = summary["points"][0]
    assert [e["window"] for e in point["repeats"]] == [
        [1.0, 2.0],
        [11.0, 12.0],
    ]  # the second process's + 10 s
    assert point["metrics"]["num_completed"]["value"] == 10 and point["metrics"]["num_completed"]["n"] == 1
    assert list(tables["requests"]["arrival"]) == [1.0, 11.0]
    assert [list(t) for t in tables["requests"]["token_times"]] == [[1.5, 2.0], [11.5, 12.0]]
    assert list(tables["steps"]["end"]) == [1.3, 1.35, 11.3, 11.35]
    assert list(tables["telemetry"]["time"]) == [1.1, 11.1]
    assert list(tables["steps"]["step"]) == [5, 6, 7, 8]  # numbered on, as one process numbers them
    whole = merge_parts([parts[0], _part(1, 1010.0, "complete", 12, [])], None, None, {})
    assert whole[1]["points"][0]["metrics"]["num_completed"]["value"] == 11  # both repeats: their mean


def test_the_parts_slow_step_lines_become_one_and_a_sweeps_rate_is_the_mean_of_its_repeats():
    line = "1 slow step (>5x the median of their kind): 1 {} (steps.parquet: slow, slow_causes)"
    parts = [
        _part(0, 1000.0, "complete", 10, [line.format("Triton compile"), "w"], "Triton compile"),
        _part(1, 1010.0, "complete", 10, [line.format("telemetry sample")], "telemetry sample, preemption"),
    ]
    for part, rate in zip(parts, (4.0, 6.0), strict=True):
        part.summary["points"][0]["arrival"] = {"sweep": "fraction", "rate": rate, "capacity": 2 * rate}
    _, summary, _ = merge_parts(parts, None, None, {})
    assert summary["warnings"] == [
        "w",
        "2 slow steps (>5x the median of their kind): 1 Triton compile, 1 preemption, 1 telemetry sample "
        "(steps.parquet: slow, slow_causes)",
    ]
    point = summary["points"][0]
    assert point["arrival"]["rate"] == 5.0 and point["arrival"]["capacity"] == 10.0
    assert [e["arrival"]["rate"] for e in point["repeats"]] == [4.0, 6.0]  # each repeat's own


def test_telemetry_lines_break_where_no_process_was_sampling():
    from llmbench.bench.report.html import _with_gaps

    t, v = _with_gaps([0.0, 0.2, 0.4, 0.6, 3.0, 3.2, 3.4], [1, 2, 3, 4, 5, 6, 7])
    assert list(t) == pytest.approx([0.0, 0.2, 0.4, 0.6, 1.8, 3.0, 3.2, 3.4])  # a point between the processes
    assert np.isnan(v[4]) and list(v[:4]) == [1, 2, 3, 4] and list(v[5:]) == [5, 6, 7]
    t, v = _with_gaps([0.0, 0.2, 0.5, 0.7], [1, 2, 3, 4])  # no gap past three periods: as it was
    assert list(t) == [0.0, 0.2, 0.5, 0.7] and list(v) == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_second_interrupt_while_the_last_repeat_writes_keeps_it_and_exits_as_interrupted(
    tmp_path, monkeypatch
):
    marker = tmp_path / "writing"
    in_child_processes(  # the last repeat's process takes 3 s to write its folder
        tmp_path,
        monkeypatch,
        f"""
        import pathlib, time
        if REPEAT == 1:
            from llmbench.bench import store
            write = store.RunWriter.finish
            def slow(self, *args, **kwargs):
                pathlib.Path({str(marker)!r}).touch()
                time.sleep(3)
                return write(self, *args, **kwargs)
            store.RunWriter.finish = slow
        """,
    )
    path = scenario(tmp_path, arrival={"kind": "poisson", "rate": 40}, warmup=0)
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "llmbench", "run", str(path), "--out", str(out), "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C while the last repeat writes what it measured ...
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # ... and again, impatient
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()  # the command was interrupted, and says so
    run = only_run(out)  # and the repeat it was writing is kept: the run is whole
    assert run.meta["status"] == "complete" and [
        e["repeat"] for e in run.summary["points"][0]["repeats"]
    ] == [0, 1]
    assert run.meta["points"] == [p["arrival"] for p in run.summary["points"]]
