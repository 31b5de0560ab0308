"""What a workload's build leaves out reaches the run's warnings, once: a ShareGPT file with a conversation
the engine's context cannot hold runs with the rest, and says how many it skipped."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from llmbench.bench.store import find_runs
from llmbench.cli.app import app


def exchange(prompt: str, reply: str) -> dict:
    return {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]}


def test_a_sharegpt_conversation_past_max_model_len_is_skipped_and_said_once(tmp_path: Path):
    # before: "error: request 1: 300 prompt + 4 output tokens exceed the engine's max_model_len (256)", exit 2
    data = tmp_path / "sg.json"
    data.write_text(
        json.dumps([exchange("hello there", "abcd"), exchange("x" * 300, "abcd"), exchange("hi", "ab")])
    )
    scenario = tmp_path / "sg.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "name": "sg",
                "model": "qwen3-tiny",
                "engine": {"device": "cpu", "max_model_len": 256},
                "workload": {"source": "sharegpt", "path": str(data)},
                "repeats": 2,
                "telemetry": {"enabled": False},
            }
        )
    )
    res = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    warning = (
        f"{data}: 1 of 3 conversations skipped: 1 that cannot be served (the first, conversation 2: 300 prompt "
        "+ 4 output tokens exceed the engine's max_model_len (256); shorten the workload or raise "
        "engine.max_model_len)"
    )
    assert warning in res.stderr
    (run,), _ = find_runs([tmp_path / "r"])
    assert run.summary["warnings"].count(warning) == 1  # two repeats, one warning
    assert [r["metrics"]["num_completed"] for r in run.summary["points"][0]["repeats"]] == [2, 2]
