"""Sampling through the engine: a seeded request's tokens do not depend on what it is batched with, on
asynchronous scheduling or on which path (Triton or torch) samples; greedy requests among sampled ones
are unchanged; unseeded runs repeat from the engine's seed."""

from __future__ import annotations

import pytest
import torch

from llmbench import LLM, SamplingParams
from llmbench.engine.config import ConfigError
from llmbench.engine.facts import triton_usable
from llmbench.engine.sampler import Sampler

MINE = [(11 * i + 3) % 4000 for i in range(13)]
OTHERS = [[5], [(3 * i + 1) % 384 for i in range(9)], [(7 * i + 3) % 384 for i in range(17)], [42] * 30]
SEEDED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=77, max_tokens=10, ignore_eos=True)
OTHER_PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
    SamplingParams(temperature=1.3, max_tokens=14, ignore_eos=True),  # unseeded
    SamplingParams(temperature=0.5, min_p=0.1, seed=3, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.7, top_k=5, seed=4, max_tokens=11, ignore_eos=True),
]


def _llm(**options) -> LLM:
    options = {"max_model_len": 128, "num_kv_blocks": 64, "block_size": 8, **options}
    return LLM("qwen3-tiny", **options)


@pytest.mark.slow
def test_a_seeded_request_gives_the_same_tokens_alone_and_in_any_batch():
    alone = _llm(async_scheduling=False).generate([MINE], SEEDED)[0].token_ids
    for async_, max_num_seqs in ((False, 2), (True, 5)):  # other batch compositions step by step
        llm = _llm(async_scheduling=async_, max_num_seqs=max_num_seqs)
        outs = llm.generate([*OTHERS[:2], MINE, *OTHERS[2:]], [*OTHER_PARAMS[:2], SEEDED, *OTHER_PARAMS[2:]])
        assert outs[2].token_ids == alone, (async_, max_num_seqs)
    assert len(set(alone)) > 6  # it really samples


def test_greedy_requests_among_sampled_ones_are_unchanged():
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    want = [o.token_ids for o in _llm(max_num_seqs=4).generate(OTHERS, greedy)]
    mixed = [greedy, OTHER_PARAMS[1], greedy, OTHER_PARAMS[3]]
    got = [o.token_ids for o in _llm(max_num_seqs=4).generate(OTHERS, mixed)]
    assert got[0] == want[0] and got[2] == want[2]


def test_unseeded_runs_repeat_from_the_engine_seed():
    params = SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True)
    first = _llm(seed=1)
    a = [o.token_ids for o in first.generate(OTHERS, params)]
    assert a == [o.token_ids for o in _llm(seed=1).generate(OTHERS, params)]
    assert a != [o.token_ids for o in first.generate(OTHERS, params)]  # later requests draw anew


@pytest.mark.slow
def test_the_triton_sampler_draws_what_the_torch_one_draws():
    if not triton_usable("cpu"):
        pytest.skip("triton is not installed")
    params = [SEEDED, *OTHER_PARAMS]
    prompts = [MINE, *OTHERS]
    want = [o.token_ids for o in _llm().generate(prompts, params)]
    llm = _llm()  # the same model kernels; only the sampler's path differs
    llm.engine.sampler = Sampler(torch.device("cpu"), use_triton=True, seed=llm.engine.config.seed)
    assert [o.token_ids for o in llm.generate(prompts, params)] == want


def test_request_seeds_follow_the_scenario_sampling_seed():
    from llmbench.bench.backends.engine import request_seed
    from llmbench.bench.scenario.schema import Scenario
    from llmbench.bench.workload.spec import RequestSpec

    base = {"name": "s", "workload": {"num_requests": 1, "input_len": 4, "output_len": 2}, "seed": 3}

    def seed(request_id: str = "7", **sampling) -> int | None:
        scenario = Scenario.model_validate({**base, "sampling": sampling})
        return request_seed(scenario, RequestSpec(request_id, [1], 2))

    assert seed(temperature=0) is None  # greedy
    assert seed(temperature=0.6) == seed(temperature=0.6, seed=3)  # default base: the scenario's seed
    assert seed(temperature=0.6, seed=4) != seed(temperature=0.6) != seed("8", temperature=0.6)
    assert seed(temperature=0.6, seed="engine") is None  # the engine derives its own


@pytest.mark.gpu  # CUDA Graphs need a GPU
@pytest.mark.parametrize("with_cut", [False, True], ids=["temperature", "with-top-p"])
def test_the_graphs_draw_the_tokens_the_sampler_draws(with_cut):
    # Temperature and greedy requests (and, with_cut, one with top-p, which keeps every draw outside the
    # graphs): the same tokens with the draw inside the decode graphs or after them, and without graphs.
    params = [
        SamplingParams(temperature=0.9, seed=77, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=1.3, max_tokens=14, ignore_eos=True),  # unseeded
        # with_cut: the longest request, so that every step has a row with a cut
        SamplingParams(
            temperature=0.6,
            top_p=0.9 if with_cut else 1.0,
            seed=3,
            max_tokens=16 if with_cut else 9,
            ignore_eos=True,
        ),
    ]
    prompts = [MINE, *OTHERS[:3]]
    runs, outside = [], []
    for graphs, in_graph in ((True, False), (True, True), (False, False)):
        llm = _llm(device="cuda", cuda_graph=graphs, tuning={"graph_sampling": in_graph})
        calls = []

        def counted(*args, calls=calls, sample=llm.engine.sampler.sample):
            calls.append(1)
            return sample(*args)

        llm.engine.sampler.sample = counted
        runs.append([o.token_ids for o in llm.generate(prompts, params)])
        outside.append(len(calls))
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0][0])) > 6  # it really samples
    if with_cut:
        assert outside[1] == outside[0]
    else:  # only steps that are not replayed (prefills) sample outside the graphs
        assert outside[1] < outside[0] / 2


def test_every_allowed_engine_seed_builds_and_samples():
    """The engine's seed reaches the preset's random weights and the requests' derived seeds, both held in
    signed 64-bit integers: the largest allowed seed works and repeats; the next is refused."""
    params = SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True)
    largest = 2**63 - 1
    a = [o.token_ids for o in _llm(seed=largest).generate(OTHERS, params)]
    assert a == [o.token_ids for o in _llm(seed=largest).generate(OTHERS, params)]
    assert a != [o.token_ids for o in _llm(seed=largest - 1).generate(OTHERS, params)]
    with pytest.raises(ConfigError, match=r"^seed: expected an integer in 0\.\.9223372036854775807"):
        _llm(seed=largest + 1)
