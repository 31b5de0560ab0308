"""Workload generators: exact lengths, distributions, shared prefixes, prompt files, ShareGPT, traces."""

from __future__ import annotations

import json
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
        LengthDist(dist="normal", mean=50, std=100, min=20, max=60), 2000, np.random.default_rng(2)
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
    hi = lo + span
    kw = (
        {"min": lo, "max": hi}
        if dist == "uniform"
        else {"mean": lo + span / 2 + 1, "std": span / 3 + 1, "min": lo, "max": hi}
    )
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
        ('["x"]\n', "p.jsonl:1: each line must be a JSON object"),
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
    """A ``fits`` for build_requests that records (id, prompt, output) of each request it is asked about
    and refuses one longer than ``context``."""
    seen: list[tuple[str, int, int]] = []

    def fits(request_id: str, prompt: int, output: int) -> None:
        seen.append((request_id, prompt, output))
        if prompt + output > context:
            raise WorkloadError(f"request {request_id} too long")

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
    with pytest.raises(WorkloadError, match="request 1 too long"):
        build_requests(wl(source="trace", path=str(path)), TOK, VOCAB, seed=0, fits=fits)
    assert [r for r, _, _ in seen] == ["0", "1"]


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
    with pytest.raises(WorkloadError, match="request 0 too long"):
        build_requests(w, TOK, VOCAB, seed=0, fits=fits)
    prompt = 9_000_000 + (100 if source == "shared_prefix" else 0)
    assert seen == [("0", prompt, 8)]


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
    with pytest.raises(WorkloadError, match="too long"):
        build_requests(wl(source="file", path=str(path), output_len=8), TOK, VOCAB, seed=0, fits=fits)
    assert len(seen) == 2
