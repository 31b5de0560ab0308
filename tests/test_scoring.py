"""Teacher-forced scoring (``LLM.score``): the log-probabilities of a given continuation, one decode step per
token, equal transformers' over the whole sequence at once; on the engine's own greedy continuation every
position's best token is the one it generated."""

from __future__ import annotations

import pytest
import torch

from llmbench import LLM, SamplingParams
from llmbench.engine.llm_engine import RequestError

from tiny_models import make_tiny

PROMPTS = [[5, 9, 13], [(3 * i + 1) % 384 for i in range(11)]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3")
    return folder, make_tiny("qwen3", folder)


def test_scores_equal_transformers_teacher_forced_log_probabilities(tiny) -> None:
    folder, hf = tiny
    llm = LLM(str(folder), dtype="float32", attention_backend="torch", num_kv_blocks=64, block_size=8)
    continuations = [[7, 8, 9, 10, 11], [300, 2, 71]]
    out = llm.score(PROMPTS, continuations, full=True)
    for prompt, cont, scored in zip(PROMPTS, continuations, out, strict=True):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + cont])).logits[0].float()  # (S, V)
        expected = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # rows predicting cont[i]
        diff = (scored.distributions - expected).abs().max().item()
        print(f"prompt of {len(prompt)}: max |engine - transformers| log-prob = {diff:.3g}")
        assert scored.distributions.shape == expected.shape and diff < 1e-4
        picked = expected[torch.arange(len(cont)), torch.tensor(cont)]
        assert torch.allclose(torch.tensor(scored.logprobs), picked, atol=1e-4)
        assert scored.prompt_token_ids == prompt and scored.token_ids == cont


def test_the_greedy_continuation_is_each_positions_best_token(tiny) -> None:
    folder, _ = tiny
    llm = LLM(str(folder), dtype="float32", attention_backend="sdpa", num_kv_blocks=64, block_size=8)
    greedy = [
        o.token_ids
        for o in llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    ]
    out = llm.score(PROMPTS, greedy, full=True)
    for tokens, scored in zip(greedy, out, strict=True):
        assert scored.distributions.argmax(dim=-1).tolist() == tokens
    assert out[0].distributions is not None and llm.score(PROMPTS, greedy)[0].distributions is None
    assert not llm.engine.has_unfinished()  # every scored request was finished and released


def test_scoring_refuses_what_it_cannot_do(tiny) -> None:
    folder, _ = tiny
    llm = LLM(str(folder), dtype="float32", attention_backend="torch", num_kv_blocks=64, block_size=8)
    with pytest.raises(RequestError, match="continuation 1 is empty"):
        llm.score(PROMPTS, [[1], []])
    with pytest.raises(ValueError, match="2 prompts for 1 continuations"):
        llm.score(PROMPTS, [[1]])
    llm.engine.add_request("busy", [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(RequestError, match="needs the engine to itself"):
        llm.score(PROMPTS, [[1], [2]])
