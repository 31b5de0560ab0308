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


def test_text_on_a_presets_byte_level_tokenizer_is_a_warning_and_token_ids_are_not(tmp_path: Path):
    from llmbench.bench.scenario.schema import Workload
    from llmbench.bench.workload import build_workload
    from llmbench.models.tokenizer import ByteTokenizer

    texts, ids = tmp_path / "t.jsonl", tmp_path / "i.jsonl"
    texts.write_text('{"prompt": "What is the capital of France?", "output_len": 2}\n')
    ids.write_text('{"prompt_token_ids": [1, 2, 3], "output_len": 2}\n')
    encoder = ByteTokenizer(4096)
    built = build_workload(Workload(source="file", path=str(texts)), encoder, 4096, 0)
    assert built.requests[0].input_len == len(b"What is the capital of France?")  # a token a byte
    (said,) = built.warnings
    assert said.startswith(f"{texts}: text prompts are encoded by the preset's byte-level stand-in tokenizer")
    assert build_workload(Workload(source="file", path=str(ids)), encoder, 4096, 0).warnings == []
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(json.dumps([exchange("hello there", "abcd")]))
    built = build_workload(Workload(source="sharegpt", path=str(sharegpt)), encoder, 4096, 0)
    assert any("byte-level stand-in tokenizer" in w for w in built.warnings)
