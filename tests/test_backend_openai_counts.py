"""How the openai backend counts a server's output tokens (bench/backends/openai_counts.py), against the
stub server of test_backend_openai.py told to miscount: streamed token ids beat a ``usage`` that
disagrees; chunks of several tokens without usage or ids are not taken for one token each; and an output
of the length asked for is not called a length mismatch because the server counted it (or its prompt)
differently. TPOT, ITL and output throughput follow the count chosen.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_backend_openai import SCENARIO, TTFT, Stub, backend_for, by_id, specs

from llmbench.bench.backends.openai import OpenAIBackend
from llmbench.bench.backends.openai_counts import Streamed, settle
from llmbench.bench.driver import DriveResult
from llmbench.bench.metrics import request_metrics, request_summary
from llmbench.bench.repeat_warnings import repeat_warnings
from llmbench.bench.scenario.schema import SLO, Scenario

POINT = {"kind": "concurrency", "label": "c1"}


def served(stub: Stub, n: int = 3, **options):
    backend = backend_for(stub.url, **options)
    result = backend.run(specs(n), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    return backend, result


def said(result: DriveResult) -> str:
    return " | ".join(repeat_warnings("c1 repeat 0", result, POINT, open_loop=False))


def tpot_from_stamps(r) -> float:
    """What TPOT must be when the record's count is right: the stream's span over its tokens' gaps."""
    return (r.token_times[-1] - r.token_times[0]) / (r.num_output_tokens - 1)


@pytest.mark.parametrize("scale", [1.5, 0.5])
def test_streamed_token_ids_win_over_a_usage_that_disagrees(scale):
    with Stub(usage_scale=scale) as stub:
        _, result = served(stub, token_ids=True)
    wrong = round(scale * 6)
    for r in result.requests:
        assert r.reported_output_len == wrong and r.token_ids == list(range(6))
        assert r.num_output_tokens == 6 and len(r.token_times) == 6 and r.output_len_source == "ids"
        assert r.output_check is None  # the output is the 6 tokens asked for
        assert f"the stream carried 6 token ids, the server's usage counted {wrong}" in r.count_check
        m = request_metrics(r)
        assert m.output_len == 6 and m.tpot == pytest.approx(tpot_from_stamps(r))
    warning = said(result)
    assert "carried 6 token ids" in warning and f"counted {wrong}" in warning
    assert "token_ids" not in warning  # they are on: no advice to turn them on
    summary = request_summary(result.requests, SLO())
    assert summary["output_tokens"] == 18 and summary["num_output_mismatch"] == 0


@pytest.mark.parametrize(("scale", "count", "source"), [(1.5, 9, "usage"), (0.5, 6, "chunks")])
def test_without_ids_usage_counts_but_never_below_what_the_stream_showed(scale, count, source):
    with Stub(usage_scale=scale) as stub:
        _, result = served(stub)
    for r in result.requests:
        assert r.num_output_tokens == count and r.output_len_source == source
        assert len(r.token_times) == count  # one time per token counted: ITL and TPOT use the same count
        assert "the server's usage counted" in r.count_check
        assert request_metrics(r).tpot == pytest.approx(tpot_from_stamps(r))
    assert "backend_options.openai.token_ids" in said(result)  # off here: turning them on would settle it


def test_multi_token_chunks_without_usage_or_ids_are_not_counted_one_per_chunk():
    # 3 tokens a chunk, no usage, EOS not ignored: the stream shows 2 chunks, yet finish_reason "length"
    # says the server reached max_tokens (6). Counting 2 would give a TPOT three times too long.
    with Stub(per_chunk=3, usage=False) as stub:
        data = {**SCENARIO, "sampling": {"ignore_eos": False}}
        data["backend_options"] = {"openai": {"url": stub.url, "model": "stub-model"}}
        backend = OpenAIBackend(Scenario.model_validate(data))
        backend.start()
        result = backend.run(specs(2), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    for r in result.requests:
        assert r.finish_reason == "length" and r.output_len_source == "finish_reason"
        assert r.num_output_tokens == 6 and len(r.token_times) == 6
        assert "finish_reason length after 2 tokens shown of max_tokens 6" in r.count_check
        gaps = np.diff(r.token_times)
        assert (gaps[[0, 1, 3, 4]] == 0).all() and gaps[2] > 0  # tokens of one chunk share its time
        assert request_metrics(r).tpot == pytest.approx(tpot_from_stamps(r))
    assert "disagree on how many output tokens 2 of 2 requests had" in said(result)  # not silent
    assert request_summary(result.requests, SLO())["output_tokens"] == 12


def test_without_usage_the_text_is_counted_with_the_served_models_tokenizer():
    # The request stops (EOS) after 5 tokens sent 3 to a chunk: only the text can say there were 5.
    with Stub(per_chunk=3, usage=False, short={0: 5}) as stub:
        backend = backend_for(stub.url)
        assert backend.count_text is None  # a preset's byte-level stand-in is not the server's tokenizer
        backend.count_text = lambda text: len(text.split())  # the stub's tokens are words
        result = backend.run(specs(1), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    (r,) = result.requests
    assert r.finish_reason == "stop" and r.output_len_source == "text" and r.num_output_tokens == 5
    assert r.output_check == "asked for 6 tokens, got 5 (text)"  # EOS ignored: really short
    assert "counted from: text 1" in said(result)


def test_chunks_alone_are_a_count_in_doubt():
    with Stub(per_chunk=3, usage=False, short={0: 5}) as stub:
        _, result = served(stub, n=1)
    (r,) = result.requests
    assert r.output_len_source == "chunks" and r.num_output_tokens == 2
    assert "no usage and no token ids: counted 2 from the chunks" in r.count_check


def test_a_count_disagreement_or_a_prompt_counted_differently_is_no_output_length_mismatch():
    with Stub(per_chunk=2) as stub:  # usage right; the stream shows 3 chunks of 2 tokens as text
        _, merged = served(stub)
    with Stub(prompt_extra=3) as stub:  # the server counts 3 more prompt tokens (a chat template?)
        _, prompt = served(stub)
    with Stub(short={1: 4}) as stub:  # a real mismatch: EOS ignored, yet 4 tokens of 6
        _, short = served(stub)
    assert all(r.output_check is None and r.num_output_tokens == 6 for r in merged.requests)
    assert "outputs are not the length asked for" not in said(merged)
    assert "disagree on how many output tokens 3 of 3 requests had" in said(merged)
    assert request_summary(merged.requests, SLO())["num_output_mismatch"] == 0
    assert all(r.output_check is None and r.count_check is None for r in prompt.requests)
    assert all(r.prompt_check == "the prompt has 4 tokens, the server counted 7" for r in prompt.requests)
    assert "the server counted 3 of 3 requests' prompts differently" in said(prompt)
    assert "not the length asked for" not in said(prompt)
    assert request_summary(prompt.requests, SLO())["num_output_mismatch"] == 0
    assert by_id(short)["1"].output_check == "asked for 6 tokens, got 4 (usage)"
    assert "1 of 3 requests' outputs are not the length asked for" in said(short)
    assert request_summary(short.requests, SLO())["num_output_mismatch"] == 1


def _streamed(**kw) -> Streamed:
    base = dict(
        asked=20, finish_reason="length", shown=20, ids=None, usage=None, text_tokens=None, prompt_len=8,
        usage_prompt=None, ids_asked=False,
    )  # fmt: skip
    return Streamed(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "n", "source", "doubt"),
    [
        ({"ids": 20, "usage": 30}, 20, "ids", True),  # ids exact; usage counts what was not streamed
        ({"ids": 20, "usage": 20}, 20, "ids", False),
        ({"shown": 5, "usage": 20}, 20, "usage", True),  # several tokens a chunk, seen by usage only
        ({"shown": 20, "usage": 10}, 20, "chunks", True),  # usage below what the stream showed
        ({"shown": 5}, 20, "finish_reason", True),  # "length": max_tokens reached, in 5 chunks
        ({"shown": 5, "text_tokens": 21}, 20, "finish_reason", True),  # the server's word over a re-count
        ({"shown": 20}, 20, "chunks", False),  # one token a chunk, as "length" confirms
        ({"shown": 25}, 25, "chunks", False),  # past max_tokens: a real overrun, not hidden by "length"
        ({"shown": 5, "finish_reason": "stop", "text_tokens": 17}, 17, "text", False),  # an EOS stop
        ({"shown": 5, "finish_reason": "stop", "text_tokens": 3}, 5, "text", False),  # never below the chunks
        ({"shown": 5, "finish_reason": "stop"}, 5, "chunks", True),
    ],
)  # fmt: skip
def test_which_count_wins(kw, n, source, doubt):
    counted = settle(_streamed(**kw), ignore_eos=False)
    assert (counted.n, counted.source, counted.count_check is not None) == (n, source, doubt), counted


def test_ttft_is_still_the_first_chunk_when_a_chunk_carries_several_tokens():
    with Stub(per_chunk=3) as stub:
        _, result = served(stub, n=1)
    (r,) = result.requests
    assert r.token_times[0] - r.arrival >= TTFT and r.token_times[0] == r.token_times[2]
