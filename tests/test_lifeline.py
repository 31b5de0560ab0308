"""A child started by llmbench ends with its parent, however the parent ended; a record left saying it is
running by a process that died reads as died."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmbench.bench.report import build_report
from llmbench.bench.store import died, owner

ROOT = Path(__file__).resolve().parents[1]

# The parent starts a child tied to it and prints the child's pid; the child records a SIGTERM in a file.
_PARENT = """
import subprocess, sys, os
from llmbench.lifeline import child_env
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=child_env(dict(os.environ)))
print(child.pid, flush=True)
child.wait()
"""
_CHILD = """
import signal, sys, time
from llmbench.lifeline import follow_parent
def stop(signum, frame):
    open(sys.argv[1], "w").write("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
follow_parent()
open(sys.argv[1] + ".ready", "w").close()
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_child_gets_sigterm_when_its_parent_is_killed_outright(tmp_path):
    mark = tmp_path / "stopped"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, _CHILD, str(mark)], stdout=subprocess.PIPE, text=True, env=env
    )
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 60
    while not Path(f"{mark}.ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    parent.kill()  # SIGKILL: no handler runs in the parent
    parent.wait()
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.read_text() == "SIGTERM"
    try:  # and it ended (reaped by init)
        for _ in range(100):
            os.kill(child, 0)
            time.sleep(0.05)
        pytest.fail("the child outlived its parent")
    except ProcessLookupError:
        pass


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_record_that_says_running_reads_as_died_once_its_process_is_gone():
    alive = {"status": "running", **owner()}
    assert died(alive) is None
    gone = {**alive, "pid": _dead_pid()}
    assert "is gone: it died before it ended" in died(gone)
    assert died({**gone, "status": "complete"}) is None
    assert died({**gone, "host": platform.node() + "-elsewhere"}) is None  # another machine's: unknown


def test_a_report_says_when_the_ablation_holding_its_runs_died(tmp_path):
    folder = tmp_path / "s" / "20260101-000000-ablate"
    run = folder / "baseline-r0"
    run.mkdir(parents=True)
    meta = {"status": "complete", "scenario_name": "s", "variant": "baseline", "ablation": folder.name}
    summary = {"status": "complete", "points": [{"label": "offline", "repeats": [], "metrics": {}}]}
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "summary.json").write_text(json.dumps(summary))
    record = {"status": "running", "baseline": "baseline", "pid": _dead_pid(), "host": platform.node()}
    (folder / "ablation.json").write_text(json.dumps(record))
    (doubt,) = [d for d in build_report([tmp_path]).doubts if d.path.name == "ablation.json"]
    assert "it died before it ended; its runs are shown as it left them" in doubt.reason
    (folder / "ablation.json").write_text(json.dumps({**record, **owner()}))  # this process: still running
    assert not [d for d in build_report([tmp_path]).doubts if d.path.name == "ablation.json"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to tell processes apart")
def test_a_record_whose_process_id_now_names_another_process_reads_as_died(tmp_path):
    record_file = tmp_path / "ablation.json"
    record_file.write_text("{}")
    hour_ago = time.time() - 3600
    os.utime(record_file, (hour_ago, hour_ago))  # last written an hour before either process started
    not_python = subprocess.Popen(["sleep", "60"])
    newer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = {"status": "running", "host": platform.node()}
        assert "is gone" in died({**running, "pid": not_python.pid}, record_file)
        assert "is gone" in died({**running, "pid": newer.pid}, record_file)
        assert died({**running, "pid": newer.pid}) is None  # no file to date it by: a live id is trusted
        assert died({**running, "pid": os.getpid()}, tmp_path / "missing.json") is None
    finally:
        not_python.kill()
        newer.kill()
        not_python.wait()
        newer.wait()
