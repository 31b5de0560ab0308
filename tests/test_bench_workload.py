"""Workload generators: exact lengths, distributions, shared prefixes, prompt files, ShareGPT, traces."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.bench.errors import WorkloadError
from llmbench.bench.scenario.workload_schema import LengthDist, Workload
from llmbench.bench.workload import build_requests, check_prompt_file
from llmbench.bench.workload.lengths import sample_lengths
from llmbench.models.tokenizer import ByteTokenizer

TOK = ByteTokenizer(4096)
VOCAB = 4096


def wl(**kw) -> Workload:
    return Workload.model_validate(kw)


def test_fixed_length_is_exact():
    reqs = build_requests(wl(num_requests=5, input_len=512, output_len=7), TOK, VOCAB, seed=0)
    assert [len(r.prompt) for r in reqs] == [512] * 5
    assert [r.max_tokens for r in reqs] == [7] * 5
    assert all(0 <= t < VOCAB for r in reqs for t in r.prompt)
    assert [r.request_id for r in reqs] == ["0", "1", "2", "3", "4"]


def test_uniform_covers_both_ends_and_nothing_outside():
    x = sample_lengths(LengthDist(dist="uniform", min=100, max=104), 5000, np.random.default_rng(0))
    assert set(x.tolist()) == {100, 101, 102, 103, 104}


@pytest.mark.parametrize("dist", ["normal", "lognormal"])
def test_normal_and_lognormal_have_the_requested_mean_and_std(dist):
    x = sample_lengths(LengthDist(dist=dist, mean=400, std=100), 40000, np.random.default_rng(1))
    assert abs(x.mean() - 400) < 4  # standard error is 0.5; rounding and clipping at 1 are negligible here
    assert abs(x.std() - 100) < 4
    if dist == "lognormal":
        assert np.median(x) < x.mean()  # right-skewed, unlike the normal


def test_clipping_to_min_and_max():
    x = sample_lengths(
        LengthDist(dist="normal", mean=40, std=100, min=20, max=60), 2000, np.random.default_rng(2)
    )
    assert x.min() == 20 and x.max() == 60


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(["uniform", "normal", "lognormal"]),
    st.integers(1, 500),
    st.integers(0, 500),
    st.integers(0, 2**31 - 1),
)
def test_any_distribution_stays_within_its_bounds(dist, lo, span, seed):
    from llmbench.bench.scenario.workload_schema import MEAN_SHIFT, clipped_mean

    hi = lo + span
    kw = (
        {"min": lo, "max": hi}
        if dist == "uniform"
        else {"mean": lo + span / 2 + 1, "std": span / 3 + 1, "min": lo, "max": hi}
    )
    if (
        dist != "uniform"
        and abs(clipped_mean(dist, kw["mean"], kw["std"], lo, hi) / kw["mean"] - 1) > MEAN_SHIFT
    ):
        with pytest.raises(ValueError, match="have a mean of"):  # the clipping would move its mean
            LengthDist(dist=dist, **kw)
        return
    x = sample_lengths(LengthDist(dist=dist, **kw), 200, np.random.default_rng(seed))
    assert x.dtype == np.int64 and x.min() >= lo and x.max() <= hi


def test_same_seed_same_requests_and_salt_changes_tokens_not_lengths():
    w = wl(
        num_requests=20,
        input_len={"dist": "uniform", "min": 5, "max": 50},
        output_len={"dist": "uniform", "min": 1, "max": 9},
    )
    a = build_requests(w, TOK, VOCAB, seed=3)
    b = build_requests(w, TOK, VOCAB, seed=3)
    c = build_requests(w, TOK, VOCAB, seed=3, salt=1)
    d = build_requests(w, TOK, VOCAB, seed=4)
    assert a == b
    assert [(len(r.prompt), r.max_tokens) for r in a] == [(len(r.prompt), r.max_tokens) for r in c]
    assert [r.prompt for r in a] != [r.prompt for r in c]
    assert [len(r.prompt) for r in a] != [len(r.prompt) for r in d]


def test_shared_prefix_groups_share_exactly_their_prefix():
    w = wl(source="shared_prefix", num_requests=12, num_prefixes=3, prefix_len=40, input_len=8, output_len=2)
    reqs = build_requests(w, TOK, VOCAB, seed=0)
    assert all(len(r.prompt) == 48 for r in reqs)
    prefixes = [tuple(r.prompt[:40]) for r in reqs]
    assert len(set(prefixes)) == 3
    assert all(prefixes[i] == prefixes[i % 3] for i in range(12))
    assert len({tuple(r.prompt[40:]) for r in reqs}) == 12  # suffixes are unique


@pytest.mark.parametrize("source", ["synthetic", "shared_prefix"])
def test_token_ids_range_bounds_every_prompt_id(source):
    extra = {"num_prefixes": 2, "prefix_len": 30} if source == "shared_prefix" else {}
    w = wl(
        source=source,
        num_requests=40,
        input_len=50,
        output_len=2,
        token_ids={"min": 100, "max": 110},
        **extra,
    )
    ids = {t for r in build_requests(w, TOK, VOCAB, seed=0) for t in r.prompt}
    assert ids == set(range(100, 110))  # every id of [min, max), nothing else


def test_token_ids_past_the_vocabulary_are_an_error_and_empty_ranges_invalid():
    w = wl(num_requests=2, input_len=5, output_len=2, token_ids={"max": VOCAB + 1})
    with pytest.raises(
        WorkloadError, match=rf"workload.token_ids.max: {VOCAB + 1} is past the model's vocabulary"
    ):
        build_requests(w, TOK, VOCAB, seed=0)
    with pytest.raises(ValueError, match=r"must be > min \(5\)"):
        wl(num_requests=2, input_len=5, output_len=2, token_ids={"min": 5, "max": 5})
    with pytest.raises(ValueError, match="token_ids"):  # not for sources that read their prompts
        wl(source="file", path=__file__, token_ids={"max": 10})


def test_jsonl_prompts_text_ids_and_output_lengths(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [
        {"prompt": "héllo", "output_len": 3},
        {"prompt": [5, 6, 7]},
        {"prompt_token_ids": [9, 9], "max_tokens": 4},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    reqs = build_requests(wl(source="file", path=str(path), output_len=11), TOK, VOCAB, seed=0)
    assert [r.prompt for r in reqs] == [list("héllo".encode()), [5, 6, 7], [9, 9]]
    assert [r.max_tokens for r in reqs] == [3, 11, 4]


class _DropsBraces:
    """A tokenizer that encodes the text it cannot read to no token (as a broken tokenizer may)."""

    def encode(self, text: str) -> list[int]:
        return [] if "{" in text else list(text.encode())


def test_prompts_that_encode_to_no_token_are_counted_not_dropped_in_silence(tmp_path):
    from llmbench.bench.workload import build_workload

    path = tmp_path / "p.txt"
    path.write_text("hello\n{x}\nworld\n{y}\n")
    built = build_workload(
        wl(source="file", path=str(path), num_requests=2, output_len=3), _DropsBraces(), VOCAB, 0
    )
    assert sorted(bytes(r.prompt).decode() for r in built.requests) == ["hello", "world"]
    (warning,) = built.warnings
    assert (
        f"{path}: 2 of its 4 prompts encode to no token with the model's tokenizer and are left out"
        in warning
    )
    assert f"{path}:2" in warning and f"{path}:4" in warning
    path.write_text("{a}\n{b}\n")  # all of them: an error that says why, not "holds no prompt"
    with pytest.raises(WorkloadError, match=r"every one of its 2 prompts encodes to no token"):
        build_workload(
            wl(source="file", path=str(path), num_requests=2, output_len=3), _DropsBraces(), VOCAB, 0
        )


def test_text_file_one_prompt_per_line_and_sampling_cycles(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("a b\n\nccc\n")
    reqs = build_requests(wl(source="file", path=str(path), output_len=2, num_requests=5), TOK, VOCAB, seed=0)
    assert len(reqs) == 5 and {tuple(r.prompt) for r in reqs} == {tuple(b"a b"), tuple(b"ccc")}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"prompt": "x"}\n{broken\n', "p.jsonl:2: not valid JSON"),
        ('{"text": "x"}\n', "p.jsonl:1: needs 'prompt'"),
        ('["x"]\n', "p.jsonl:1: each record must be a JSON object"),
        ('{"prompt": [1, -2]}\n', "token ids must be a non-empty list of non-negative integers"),
        ('{"prompt": "x", "output_len": 0}\n', "output_len must be a positive integer"),
        ('{"prompt": "x"}\n', "some prompts give no output_len; set workload.output_len"),
    ],
)
def test_bad_prompt_files_name_the_line(tmp_path, content, expected):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(WorkloadError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        build_requests(wl(source="file", path=str(path)), TOK, VOCAB, seed=0)


@pytest.mark.parametrize(
    ("content", "line", "bad"),
    [
        (
            '{"prompt_token_ids": [1, 2], "output_len": 2}\n{"prompt_token_ids": [3, 4096], "output_len": 2}\n',
            2,
            4096,
        ),
        ('{"prompt": [99999, 1], "output_len": 2}\n', 1, 99999),
    ],
)
def test_token_ids_outside_the_vocabulary_name_the_file_line_and_id(tmp_path, content, line, bad):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    expected = f"{path}:{line}: token id {bad} is outside the model's vocabulary of 4096 ids (0 to 4095)"
    with pytest.raises(WorkloadError) as info:
        build_requests(wl(source="file", path=str(path)), TOK, VOCAB, seed=0)
    assert str(info.value) == expected
    with pytest.raises(WorkloadError) as info:  # the check the runner makes before the backend starts
        check_prompt_file(wl(source="file", path=str(path)), VOCAB)
    assert str(info.value) == expected


def test_the_early_check_needs_no_tokenizer_and_passes_good_files(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "text is left for the tokenizer", "output_len": 2}\n{"prompt": [4095]}\n')
    assert check_prompt_file(wl(source="file", path=str(path)), VOCAB) is None
    (tmp_path / "p.txt").write_text("one prompt\n")
    assert check_prompt_file(wl(source="file", path=str(tmp_path / "p.txt")), VOCAB) is None


def test_sharegpt_takes_the_first_user_turn_and_the_reply_length(tmp_path):
    data = [
        {"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello!"}]},
        {
            "messages": [
                {"role": "system", "content": "be kind"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "abc"},
            ]
        },
        {"conversations": [{"from": "human", "value": "alone"}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    reqs = build_requests(wl(source="sharegpt", path=str(path)), TOK, VOCAB, seed=0)
    assert [(bytes(r.prompt).decode(), r.max_tokens) for r in reqs] == [("hi there", 6), ("q", 3)]
    fixed = build_requests(wl(source="sharegpt", path=str(path), output_len=9), TOK, VOCAB, seed=0)
    assert [r.max_tokens for r in fixed] == [9, 9]


def test_sharegpt_errors(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text('{"a": 1}')
    with pytest.raises(WorkloadError, match="a JSON list of conversations"):
        build_requests(wl(source="sharegpt", path=str(path)), TOK, VOCAB, seed=0)
    path.write_text("[]")
    with pytest.raises(WorkloadError, match="no conversation"):
        build_requests(wl(source="sharegpt", path=str(path)), TOK, VOCAB, seed=0)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_trace_replay_lengths_and_offsets(tmp_path, suffix):
    rows = [(10.0, 20, 2), (10.5, 30, 4), (12.0, 8, 1)]
    path = tmp_path / f"t{suffix}"
    if suffix == ".csv":
        path.write_text("timestamp,input_len,output_len\n" + "".join(f"{t},{i},{o}\n" for t, i, o in rows))
    else:
        path.write_text(
            "".join(json.dumps({"timestamp": t, "input_len": i, "output_len": o}) + "\n" for t, i, o in rows)
        )
    reqs = build_requests(wl(source="trace", path=str(path), time_scale=2.0), TOK, VOCAB, seed=0)
    assert [(len(r.prompt), r.max_tokens) for r in reqs] == [(20, 2), (30, 4), (8, 1)]
    assert [r.arrival for r in reqs] == [0.0, 1.0, 4.0]


def context_check(context: int):
    """A ``fits`` for build_requests that records (prompt, output) of each request it is asked about and
    refuses one longer than ``context``."""
    seen: list[tuple[int, int]] = []

    def fits(prompt: int, output: int) -> str | None:
        seen.append((prompt, output))
        return f"{prompt} + {output} tokens are past {context}" if prompt + output > context else None

    return seen, fits


def test_trace_errors_name_the_problem(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("time,input_len\n1,2\n")
    with pytest.raises(WorkloadError, match="missing: timestamp, output_len"):
        build_requests(wl(source="trace", path=str(path)), TOK, VOCAB, seed=0)
    path.write_text("timestamp,input_len,output_len\n1,abc,2\n")
    with pytest.raises(WorkloadError, match=r"t.csv:2: timestamp, input_len and output_len must be numbers"):
        build_requests(wl(source="trace", path=str(path)), TOK, VOCAB, seed=0)
    path.write_text("timestamp,input_len,output_len\ninf,2,2\n")
    with pytest.raises(WorkloadError, match=r"t.csv:2: timestamp must be a finite number of seconds"):
        build_requests(wl(source="trace", path=str(path)), TOK, VOCAB, seed=0)
    path.write_text("timestamp,input_len,output_len\n0,2,2\n1000000000,2,2\n")  # milliseconds, likely
    with pytest.raises(WorkloadError, match=r"its arrivals span 277,778 hours; timestamps are seconds"):
        build_requests(wl(source="trace", path=str(path)), TOK, VOCAB, seed=0)
    scaled = build_requests(wl(source="trace", path=str(path), time_scale=1e-6), TOK, VOCAB, seed=0)
    assert [r.arrival for r in scaled] == [0.0, 1000.0]
    path.write_text("timestamp,input_len,output_len\n0,2,2\n1,9000000,2\n")  # refused on its length
    seen, fits = context_check(4096)
    with pytest.raises(WorkloadError, match=r"^request 1: 9000000 \+ 2 tokens are past 4096$"):
        build_requests(wl(source="trace", path=str(path)), TOK, VOCAB, seed=0, fits=fits)
    assert seen == [(2, 2), (9_000_000, 2)]


def test_missing_file_is_caught_by_the_schema(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="file not found"):
        wl(source="file", path=str(Path(tmp_path) / "none.jsonl"))


@pytest.mark.parametrize("source", ["synthetic", "shared_prefix"])
def test_lengths_are_checked_before_any_token_is_drawn(source, monkeypatch):
    # a prompt length mistyped by orders of magnitude is refused on its length, not after building it
    import llmbench.bench.workload.synthetic as synthetic

    def no_tokens(*args):
        raise AssertionError("tokens drawn before the lengths were checked")

    monkeypatch.setattr(synthetic, "_tokens", no_tokens)
    seen, fits = context_check(4096)
    extra = {"prefix_len": 100, "num_prefixes": 2} if source == "shared_prefix" else {}
    w = wl(source=source, num_requests=3, input_len=9_000_000, output_len=8, **extra)
    prompt = 9_000_000 + (100 if source == "shared_prefix" else 0)
    with pytest.raises(WorkloadError, match=rf"^request 0: {prompt} \+ 8 tokens are past 4096$"):
        build_requests(w, TOK, VOCAB, seed=0, fits=fits)
    assert seen == [(prompt, 8)]


def test_lengths_and_request_counts_past_any_model_are_scenario_errors():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="less than or equal to 10000000"):
        wl(source="synthetic", num_requests=1, input_len=1_000_000_000, output_len=8)
    with pytest.raises(ValidationError, match="less than or equal to 1000000"):
        wl(source="synthetic", num_requests=10**9, input_len=8, output_len=8)


def test_requests_of_a_prompt_file_pass_the_context_check_too(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("short\n" + "long " * 2000 + "\n")
    seen, fits = context_check(4096)
    with pytest.raises(WorkloadError, match=r"^request 1: 10000 \+ 8 tokens are past 4096$"):
        build_requests(wl(source="file", path=str(path), output_len=8), TOK, VOCAB, seed=0, fits=fits)
    assert len(seen) == 2


def test_a_trace_refuses_more_requests_than_it_has_rows(tmp_path):
    # before: num_requests=5 on a 3-row trace replayed 3 requests, silently
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_len,output_len\n0,2,2\n1,3,2\n2,4,2\n")
    expected = (
        f"{path}: workload.num_requests is 5, but the trace has 3 rows; a trace replays its rows once, in "
        "order (its timestamps cannot repeat): give num_requests <= 3, or leave it out to replay every row"
    )
    w = wl(source="trace", path=str(path), num_requests=5)
    for refuse in (lambda: build_requests(w, TOK, VOCAB, seed=0), lambda: check_prompt_file(w, VOCAB)):
        with pytest.raises(WorkloadError) as info:
            refuse()
        assert str(info.value) == expected
    first_two = build_requests(wl(source="trace", path=str(path), num_requests=2), TOK, VOCAB, seed=0)
    assert [(len(r.prompt), r.arrival) for r in first_two] == [(2, 0.0), (3, 1.0)]
    assert len(build_requests(wl(source="trace", path=str(path), num_requests=3), TOK, VOCAB, seed=0)) == 3


RECORDS = [{"prompt": "hello", "output_len": 4}, {"prompt_token_ids": [7, 8, 9]}]


def test_a_json_prompt_file_may_hold_one_array_of_records(tmp_path):
    # before: "p.json:1: not valid JSON (Expecting value)": a .json file was read as JSONL only
    as_array = tmp_path / "p.json"
    as_array.write_text(json.dumps(RECORDS, indent=1))
    as_lines = tmp_path / "p.jsonl"
    as_lines.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    as_json_lines = tmp_path / "lines.json"  # JSONL in a .json file, read as before
    as_json_lines.write_text(as_lines.read_text())
    built = [
        build_requests(wl(source="file", path=str(p), output_len=2), TOK, VOCAB, seed=0)
        for p in (as_array, as_lines, as_json_lines)
    ]
    assert [(r.prompt, r.max_tokens) for r in built[0]] == [(list(b"hello"), 4), ([7, 8, 9], 2)]
    assert built[0] == built[1] == built[2]
    assert check_prompt_file(wl(source="file", path=str(as_array), output_len=2), VOCAB) is None


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([{"prompt": "x"}, "y"], "p.json: record 2: each record must be a JSON object"),
        ([{"prompt": [5, 4096]}], "p.json: record 1: token id 4096 is outside the model's vocabulary"),
        ({"prompt": "x"}, "p.json: a .json prompt file holds one JSON array of records, or JSONL"),
    ],
)
def test_records_of_a_json_array_are_named_by_their_place(tmp_path, records, expected):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(records, indent=1))
    with pytest.raises(WorkloadError, match=re.escape(expected)):
        check_prompt_file(wl(source="file", path=str(path), output_len=2), VOCAB)


def test_a_json_trace_may_hold_one_array_of_rows(tmp_path):
    path = tmp_path / "t.json"
    rows = [
        {"timestamp": 3.0, "input_len": 4, "output_len": 1},
        {"timestamp": 3.5, "input_len": 5, "output_len": 2},
    ]
    path.write_text(json.dumps(rows, indent=1))
    reqs = build_requests(wl(source="trace", path=str(path)), TOK, VOCAB, seed=0)
    assert [(len(r.prompt), r.max_tokens, r.arrival) for r in reqs] == [(4, 1, 0.0), (5, 2, 0.5)]


def exchange(prompt: str, reply: str) -> dict:
    return {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]}


SHAREGPT = [
    exchange("a" * 10, "b" * 5),  # 15 tokens (the byte-level tokenizer: one a character)
    exchange("c" * 90, "d" * 20),  # 110: past a context of 100
    exchange("", "x"),  # an empty prompt
    {"conversations": [{"from": "human", "value": "alone"}]},  # no reply
    exchange("e" * 20, "f" * 3),  # 23
    exchange("g" * 99, "h"),  # 100: fits exactly
]


def built_sharegpt(path: Path, context: int, seed: int = 0, **kw):
    from llmbench.bench.workload import build_workload

    return build_workload(
        wl(source="sharegpt", path=str(path), **kw), TOK, VOCAB, seed, fits=context_check(context)[1]
    )


def test_sharegpt_skips_conversations_that_cannot_be_served_and_says_so_once(tmp_path):
    # before: the 110-token conversation stopped the run ("request 1: ... exceed the engine's max_model_len")
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    built = built_sharegpt(path, 100)
    assert [(len(r.prompt), r.max_tokens) for r in built.requests] == [(10, 5), (20, 3), (99, 1)]
    assert built.warnings[0] == (
        f"{path}: 3 of 6 conversations skipped: 1 without a user turn followed by a reply; 1 whose prompt "
        "is empty; 1 that cannot be served (the first, conversation 2: 90 + 20 tokens are past 100)"
    )
    assert len(built.warnings) == 2 and "byte-level stand-in tokenizer" in built.warnings[1]  # TOK's
    # sampling draws from the conversations kept only, the same under the same seed
    sampled = built_sharegpt(path, 100, seed=5, num_requests=40)
    assert {len(r.prompt) for r in sampled.requests} == {10, 20, 99}
    assert sampled == built_sharegpt(path, 100, seed=5, num_requests=40)
    assert len(sampled.warnings) == 2


def test_sharegpt_with_output_len_keeps_what_leaves_room_for_its_longest_output(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    built = built_sharegpt(path, 100, output_len={"dist": "uniform", "min": 1, "max": 80})
    assert {len(r.prompt) for r in built.requests} == {10, 20}  # 90 + 80 and 99 + 80 do not fit
    assert (
        "2 that cannot be served (the first, conversation 2: 90 + 80 tokens are past 100)"
        in built.warnings[0]
    )


def test_sharegpt_where_no_conversation_fits_is_an_error_saying_why(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    with pytest.raises(WorkloadError) as info:
        built_sharegpt(path, 8)
    assert str(info.value) == (
        f"{path}: no conversation of 6 can be sent: 1 without a user turn followed by a reply; 1 whose prompt "
        "is empty; 4 that cannot be served (the first, conversation 1: 10 + 5 tokens are past 8)"
    )


def test_sharegpt_without_a_context_limit_keeps_every_conversation_with_a_prompt(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    reqs = build_requests(wl(source="sharegpt", path=str(path)), TOK, VOCAB, seed=0)
    assert [len(r.prompt) for r in reqs] == [10, 90, 20, 99]
