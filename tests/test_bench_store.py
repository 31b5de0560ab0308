"""The result store: atomic folders, never overwritten, and readers that survive broken folders."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from llmbench.bench.errors import StoreError
from llmbench.bench.store import RESULT_FORMAT, RunWriter, find_runs, load_run, slug, write_json

META = {"status": "complete", "scenario_name": "s", "variant": "v"}
SUMMARY = {"status": "complete", "points": []}


def finish(writer: RunWriter, meta=META, summary=SUMMARY):
    tables = {
        "requests": pd.DataFrame({"a": [1, 2]}),
        "steps": pd.DataFrame({"b": [0.5]}),
        "telemetry": pd.DataFrame(),
    }
    return writer.finish(meta, summary, tables)


def test_run_is_built_hidden_then_renamed_into_place(tmp_path):
    w = RunWriter(tmp_path, "scen", "cuda_graph=off")
    assert (
        w.tmp.name.startswith(".tmp-")
        and json.loads((w.tmp / "meta.json").read_text())["status"] == "running"
    )
    final = finish(w)
    assert final.parent == tmp_path / "scen" and final.name.endswith("-cuda_graph-off")
    assert not w.tmp.exists()
    assert sorted(p.name for p in final.iterdir()) == [
        "meta.json",
        "requests.parquet",
        "steps.parquet",
        "summary.json",
        "telemetry.parquet",
    ]
    run = load_run(final)
    assert run.complete and run.table("requests")["a"].tolist() == [1, 2]


def test_nothing_is_overwritten(tmp_path):
    a = finish(RunWriter(tmp_path, "scen", "v"))
    w = RunWriter(tmp_path, "scen", "v")
    w.name = a.name  # the same second: the name is taken
    b = finish(w)
    assert a != b and b.name == a.name + "-2" and (a / "meta.json").exists()
    with pytest.raises(StoreError, match="never overwritten"):
        RunWriter(tmp_path, "scen", "v", exact=a)


def test_json_has_null_for_nan_not_a_number(tmp_path):
    write_json(tmp_path / "x.json", {"a": math.nan, "b": [1.0, math.inf], "c": {"d": 2}})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": None, "b": [1.0, None], "c": {"d": 2}}


def test_slug():
    assert slug("attention_backend=sdpa+tp=2") == "attention_backend-sdpa-tp-2"
    assert slug("///") == "run"


def test_find_runs_walks_nested_folders_and_reports_every_broken_one(tmp_path):
    good = finish(RunWriter(tmp_path / "deep" / "er", "scen", "ok"))
    (tmp_path / "empty_run").mkdir()
    (tmp_path / "empty_run" / "meta.json").write_text("")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "meta.json").write_text(json.dumps(META))
    (corrupt / "summary.json").write_text("{not json")
    no_points = tmp_path / "no_points"
    no_points.mkdir()
    (no_points / "meta.json").write_text(json.dumps(META))
    (no_points / "summary.json").write_text("{}")
    leftover = RunWriter(tmp_path, "scen", "died")  # never finished
    edit_json_file(leftover.tmp / "meta.json", pid=dead_pid())
    runs, problems = find_runs([tmp_path, tmp_path / "missing"])
    assert [r.path for r in runs] == [good]
    reasons = {p.path.name: p.reason for p in problems}
    assert "meta.json is unreadable" in reasons["empty_run"]
    assert "summary.json is unreadable" in reasons["corrupt"]
    assert "lacks its 'points' list" in reasons["no_points"]
    assert reasons[leftover.tmp.name] == "left over by a run that died before it measured a repeat"
    assert reasons["missing"] == "no such file or directory"


def test_a_run_of_a_newer_format_is_refused_not_misread(tmp_path):
    old = finish(RunWriter(tmp_path, "scen", "old"))  # written before the files named a format: format 1
    newer = finish(RunWriter(tmp_path, "scen", "newer"), summary={**SUMMARY, "format": RESULT_FORMAT + 1})
    runs, problems = find_runs([tmp_path])
    assert [r.path for r in runs] == [old]
    (problem,) = problems
    assert problem.path == newer and f"summary.json is of format {RESULT_FORMAT + 1}" in problem.reason
    assert "written by a newer llmbench" in problem.reason


@pytest.mark.parametrize(
    "written, ok", [(2.0, True), (1, True), ("2", False), (0, False), (-5, False), (True, False)]
)
def test_a_format_is_a_whole_number_from_one(tmp_path, written, ok):
    run = finish(RunWriter(tmp_path, "scen", "v"), summary={**SUMMARY, "format": written})
    runs, problems = find_runs([tmp_path])
    if ok:  # 2.0 is format 2, as JSON from another tool may write it
        assert [r.path for r in runs] == [run] and not problems
    else:
        (problem,) = problems
        assert "which no llmbench writes" in problem.reason and "newer" not in problem.reason


def test_a_run_names_the_format_of_its_files(tmp_path):
    from llmbench.bench.runner import RunRequest, execute_run
    from llmbench.bench.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"model": "qwen3-tiny", "engine": {"device": "cpu"},
                                "workload": {"num_requests": 2, "input_len": 8, "output_len": 2}}))  # fmt: skip
    run = load_run(execute_run(RunRequest(load_scenario(path, []), tmp_path / "r", "v")).run_dir)
    assert run.meta["format"] == run.summary["format"] == RESULT_FORMAT


def test_a_folder_without_runs_is_a_problem_not_a_crash(tmp_path):
    runs, problems = find_runs([tmp_path])
    assert runs == [] and "holds no run folder" in problems[0].reason


def test_corrupt_table_is_a_store_error(tmp_path):
    final = finish(RunWriter(tmp_path, "scen", "v"))
    (final / "steps.parquet").write_bytes(b"garbage")
    with pytest.raises(StoreError, match="steps.parquet is unreadable"):
        load_run(final).table("steps")
    assert load_run(final).table("nonexistent").empty


def test_discard_removes_the_working_folder_and_an_empty_scenario_folder_it_made(tmp_path):
    w = RunWriter(tmp_path, "scen", "v")
    w.discard()
    assert not w.tmp.exists() and not (tmp_path / "scen").exists()
    kept = finish(RunWriter(tmp_path, "scen", "v"))  # a folder that holds a run stays
    RunWriter(tmp_path, "scen", "w").discard()
    assert kept.exists()


def test_a_folder_given_twice_or_inside_another_given_is_read_once(tmp_path):
    run = finish(RunWriter(tmp_path, "scen", "v"))
    runs, problems = find_runs([tmp_path, tmp_path, run, tmp_path / "scen"])
    assert [r.path for r in runs] == [run] and problems == []


def dead_pid() -> int:
    """The pid of a process that has ended."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def edit_json_file(path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def checkpointed(tmp_path, pid: int, host: str) -> RunWriter:
    """A working folder holding a checkpoint written by process ``pid`` on machine ``host``."""
    writer = RunWriter(tmp_path, "scen", "v")
    meta = {**META, "status": "incomplete", "stop_reason": "died", "pid": pid, "machine": {"hostname": host}}
    writer.checkpoint(meta, {**SUMMARY, "status": "incomplete"}, {"requests": pd.DataFrame({"a": [7]})})
    return writer


def test_a_checkpoint_left_by_a_dead_process_is_an_incomplete_run(tmp_path):
    import platform
    import subprocess
    import sys

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    writer = checkpointed(tmp_path, int(gone.stdout), platform.node())
    assert sorted(p.name for p in writer.tmp.iterdir()) == ["meta.json", "requests.parquet", "summary.json"]
    runs, problems = find_runs([tmp_path])
    assert problems == [] and [r.path for r in runs] == [writer.tmp]
    assert not runs[0].complete and runs[0].meta["stop_reason"] == "died"
    assert runs[0].table("requests")["a"].tolist() == [7]
    # the run that writes it finishes: its own record replaces the checkpoint, moved into place
    final = finish(writer)
    assert [r.path for r in find_runs([tmp_path])[0]] == [final] and load_run(final).complete


def test_a_checkpoint_whose_process_still_runs_is_being_written(tmp_path):
    import os
    import platform

    here = checkpointed(tmp_path / "here", os.getpid(), platform.node())
    elsewhere = checkpointed(tmp_path / "elsewhere", os.getpid(), "another-host")  # copied from a GPU host
    starting = RunWriter(tmp_path / "starting", "scen", "v")  # this process, before its first repeat ends
    runs, problems = find_runs([tmp_path])
    assert [r.path for r in runs] == [elsewhere.tmp]
    being_written = f"being written by process {os.getpid()}, which is still running"
    assert sorted((p.path, p.reason) for p in problems) == sorted(
        [(here.tmp, being_written), (starting.tmp, being_written)]
    )


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to tell processes apart")
def test_a_checkpoint_whose_process_id_now_names_another_process_is_shown(tmp_path):
    # After a reboot, or in a container, a killed run's process id is soon another process's.
    import os
    import platform
    import subprocess
    import sys

    not_python = subprocess.Popen(["sleep", "60"])
    newer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = checkpointed(tmp_path / "other", not_python.pid, platform.node())
        before = checkpointed(tmp_path / "before", newer.pid, platform.node())
        hour_ago = time.time() - 3600  # written an hour before that process started
        os.utime(before.tmp / "meta.json", (hour_ago, hour_ago))
        runs, problems = find_runs([tmp_path])
    finally:
        not_python.kill()
        newer.kill()
        not_python.wait()
        newer.wait()
    assert problems == [], problems
    assert sorted(r.path for r in runs) == sorted([other.tmp, before.tmp])
    assert all(r.meta["stop_reason"] == "died" for r in runs)


def test_a_file_where_a_folder_must_be_is_named_as_such(tmp_path):
    from llmbench.bench.store import os_reason

    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(StoreError, match=f"{blocked} is a file, not a folder"):
        RunWriter(blocked, "scen", "v")
    with pytest.raises(StoreError, match=f"{blocked} is a file, not a folder"):
        RunWriter(blocked / "deeper", "scen", "v")
    assert os_reason(PermissionError(13, "Permission denied"), tmp_path / "free") == "Permission denied"


@pytest.mark.parametrize("tp,kept", [(1, True), (2, False)])
def test_an_older_runs_group_peak_memory_is_not_read_as_one_devices(tmp_path, tp, kept):
    # Format 1 summed the GPUs of a tensor-parallel group into peak_memory; now it is one device's peak.
    metrics = {"peak_memory": {"value": 80e9}, "gpu_memory_max": {"value": 80e9}}
    point = {
        "label": "offline",
        "metrics": metrics,
        "repeats": [{"repeat": 0, "metrics": {"peak_memory": 80e9}}],
    }
    old = finish(
        RunWriter(tmp_path, "scen", "old"),
        meta={**META, "engine_config": {"tp": tp}},
        summary={**SUMMARY, "points": [point]},
    )
    run = load_run(old)
    (got,) = run.summary["points"]
    assert ("peak_memory" in got["metrics"]) is kept and (
        "peak_memory" in got["repeats"][0]["metrics"]
    ) is kept
    assert got["metrics"]["gpu_memory_max"]["value"] == 80e9
    assert (
        "sum over the tensor-parallel GPUs" in run.summary.get("unavailable", {}).get("peak_memory", "")
    ) is not kept


def test_every_figure_a_repeat_measures_is_a_metric_kept_in_the_summary(tmp_path):
    # A figure a repeat computes but METRICS does not name would be missing from summary.json's estimates
    # (which iterate METRICS), and a step figure missing from ENGINE_ONLY would read "–" on a peer backend
    # instead of unavailable with its reason.
    from llmbench.bench.backends.base import ENGINE_ONLY
    from llmbench.bench.derived import StepUtilisation, step_summary
    from llmbench.bench.metrics import METRICS, STEP_FIGURES
    from llmbench.bench.runner import RunRequest, execute_run
    from llmbench.bench.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"model": "qwen3-tiny", "engine": {"device": "cpu"}, "warmup": 0,
                                "workload": {"num_requests": 2, "input_len": 8, "output_len": 3}}))  # fmt: skip
    summary = execute_run(RunRequest(load_scenario(path, []), tmp_path / "r", "v")).summary
    (point,) = summary["points"]
    measured = set(point["repeats"][0]["metrics"])
    assert measured - set(METRICS) == set(), "figures measured but not kept as metrics"
    assert set(point["metrics"]) == set(METRICS)
    none = StepUtilisation(*(np.array([]) for _ in StepUtilisation._fields))
    assert set(step_summary([], none)) == set(STEP_FIGURES) <= measured
    assert set(STEP_FIGURES) <= set(ENGINE_ONLY)
