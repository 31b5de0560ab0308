"""Workload files that cannot be read as they claim: not UTF-8, a trace out of order, a ShareGPT file in
JSONL, text prompts for a model folder without a tokenizer. Each is one WorkloadError (or ModelError)
naming the file and the line, raised by the reader and by the check the runner makes before the backend
starts."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from llmbench.bench.errors import WorkloadError
from llmbench.bench.scenario.workload_schema import Workload
from llmbench.bench.workload import build_requests, check_prompt_file
from llmbench.models.errors import ModelError
from llmbench.models.tokenizer import ByteTokenizer, load_tokenizer

TOK = ByteTokenizer(4096)
VOCAB = 4096
CSV_HEADER = "timestamp,input_len,output_len\n"


def wl(**kw) -> Workload:
    return Workload.model_validate(kw)


def refused(workload: Workload) -> str:
    """The message the reader gives for ``workload``; the runner's early check must give the same."""
    with pytest.raises(WorkloadError) as built:
        build_requests(workload, TOK, VOCAB, seed=0)
    with pytest.raises(WorkloadError) as early:
        check_prompt_file(workload, VOCAB)
    assert str(early.value) == str(built.value)
    return str(built.value)


def refused_early(workload: Workload, model: str) -> str:
    with pytest.raises(WorkloadError) as info:
        check_prompt_file(workload, VOCAB, model)
    return str(info.value)


# (file name, source, text whose second line holds the byte 0xff)
NOT_UTF8 = [
    ("p.txt", "file", "first prompt\nsecond \xff prompt\n"),
    ("p.jsonl", "file", '{"prompt": "a", "output_len": 2}\n{"prompt": "\xff", "output_len": 2}\n'),
    ("sg.json", "sharegpt", '[\n{"conversations": "\xff"}]\n'),
    ("sg.jsonl", "sharegpt", '{"conversations": []}\n{"conversations": "\xff"}\n'),
    ("t.csv", "trace", CSV_HEADER + "0,\xff,2\n"),
    ("t.jsonl", "trace", '{"timestamp": 0, "input_len": 2, "output_len": 2}\n{"x": "\xff"}\n'),
]


@pytest.mark.parametrize(("name", "source", "text"), NOT_UTF8, ids=[n for n, _, _ in NOT_UTF8])
def test_a_file_that_is_not_utf8_names_the_file_line_and_byte(tmp_path, name, source, text):
    path = tmp_path / name
    data = text.encode("latin-1")
    path.write_bytes(data)
    extra = {"output_len": 2} if source == "file" else {}
    message = refused(wl(source=source, path=str(path), **extra))
    at = data.index(0xFF)
    assert message == (
        f"{path}:2: not a UTF-8 text file (byte 0xff at position {at}); workload files are read as UTF-8"
    )


def test_a_utf8_byte_order_mark_is_read_past(tmp_path):
    # spreadsheets save CSV with one; before, it made the first column '\ufefftimestamp', so "missing"
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (CSV_HEADER + "0,3,2\n1,4,2\n").encode())
    reqs = build_requests(wl(source="trace", path=str(path)), TOK, VOCAB, seed=0)
    assert [(len(r.prompt), r.arrival) for r in reqs] == [(3, 0.0), (4, 1.0)]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (
            "0,2,2\n5,2,2\n3,2,2\n",
            "t.csv:4: timestamp 3 comes before the previous row's 5; a trace is a recording",
        ),
        ("-1,2,2\n0,2,2\n", "t.csv:2: timestamp must be a finite number of seconds >= 0, got '-1'"),
        ("0,2,2\n1,2,2,7\n", "t.csv:3: 4 fields, but the header names 3 (timestamp, input_len, output_len)"),
        # a blank line is skipped: the line named is still the file's own
        ("0,2,2\n\n1,2,2,7,8\n", "t.csv:4: 5 fields, but the header names 3"),
    ],
)
def test_trace_rows_out_of_order_negative_or_too_long_name_their_line(tmp_path, rows, expected):
    path = tmp_path / "t.csv"
    path.write_text(CSV_HEADER + rows)
    assert expected in refused(wl(source="trace", path=str(path)))


def test_equal_timestamps_are_in_order(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [(2.0, 3, 1), (2.0, 4, 1), (2.5, 5, 1)]
    path.write_text(
        "".join(
            json.dumps(dict(zip(("timestamp", "input_len", "output_len"), r, strict=True))) + "\n"
            for r in rows
        )
    )
    reqs = build_requests(wl(source="trace", path=str(path)), TOK, VOCAB, seed=0)
    assert [(len(r.prompt), r.arrival) for r in reqs] == [(3, 0.0), (4, 0.0), (5, 0.5)]


CONVERSATIONS = [
    {"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello!"}]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "abc"}]},
]


def test_sharegpt_as_jsonl_is_read_one_conversation_a_line(tmp_path):
    path = tmp_path / "sg.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    reqs = build_requests(wl(source="sharegpt", path=str(path)), TOK, VOCAB, seed=0)
    assert [(bytes(r.prompt).decode(), r.max_tokens) for r in reqs] == [("hi there", 6), ("q", 3)]


def test_sharegpt_jsonl_in_a_json_file_says_which_forms_are_read(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    forms = (
        "a ShareGPT file is a JSON list of conversations, or JSONL (one conversation a line) in a .jsonl file"
    )
    assert refused(wl(source="sharegpt", path=str(path))) == f"{path}:2: not valid JSON (Extra data); {forms}"
    path.write_text(json.dumps(CONVERSATIONS[0]))
    assert refused(wl(source="sharegpt", path=str(path))) == f"{path}: {forms}; got one dict"


@pytest.fixture(scope="module")
def folder_without_tokenizer(tmp_path_factory) -> Path:
    """A real model folder (config.json, safetensors) with no tokenizer files."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_models import make_tiny

    folder = tmp_path_factory.mktemp("model")
    make_tiny("qwen3", folder)  # vocabulary of 384: the byte-level tokenizer would fit it
    assert not any(folder.glob("tokenizer*"))
    return folder


def test_a_model_folder_without_tokenizer_files_refuses_text_not_ids(folder_without_tokenizer):
    # before: a ByteTokenizer, which encoded text byte by byte into the checkpoint's own ids (and took
    # its id 257 for EOS)
    tok = load_tokenizer(folder_without_tokenizer, 384)
    assert tok.eos_token_id is None
    with pytest.raises(ModelError) as info:
        tok.encode("hello")
    assert str(info.value).startswith(
        f"a text prompt needs the model's tokenizer, and the model folder {folder_without_tokenizer} has no "
        "tokenizer files (tokenizer.json, tokenizer_config.json, tokenizer.model): add its tokenizer.json / "
        "tokenizer_config.json, or give prompts as token ids"
    )
    assert isinstance(load_tokenizer(None, 384), ByteTokenizer)  # a preset keeps the byte-level one


def test_text_prompts_for_a_folder_without_tokenizer_are_refused_before_the_backend(
    tmp_path, folder_without_tokenizer
):
    model = str(folder_without_tokenizer)
    needs = re.escape(f"a text prompt needs the model's tokenizer, and the model folder {model} has no")
    text = tmp_path / "p.jsonl"
    text.write_text('{"prompt": [1, 2], "output_len": 2}\n{"prompt": "hello", "output_len": 2}\n')
    assert re.match(
        rf"{re.escape(str(text))}:2: {needs}", refused_early(wl(source="file", path=str(text)), model)
    )
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(json.dumps(CONVERSATIONS))
    message = refused_early(wl(source="sharegpt", path=str(sharegpt)), model)
    assert re.match(rf"{re.escape(str(sharegpt))} \(ShareGPT prompts are text\): {needs}", message)
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"prompt": [1, 2], "output_len": 2}\n')
    check_prompt_file(wl(source="file", path=str(ids)), VOCAB, model)  # token ids need no tokenizer
    check_prompt_file(wl(source="file", path=str(text)), VOCAB, "qwen3-tiny")  # a preset: bytes stand in
