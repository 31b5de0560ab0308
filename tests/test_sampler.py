"""The sampler: draws follow softmax(logits / T) restricted to each cut, greedy rows stay the argmax, a
seeded row draws the same token whatever else is in the batch, and bad settings are clear errors.

The distributions are checked on the torch path (thousands of draws in one call); the Triton kernels
are held to that path id for id in test_sampler_kernels.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.engine.sampler import Sampler, top_k_floor
from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.sequence import Sequence
from llmbench.kernels.sample_cut import cut_threshold_ref

CPU = torch.device("cpu")
LOGITS = torch.tensor([2.0, 1.5, 1.4, 0.9, 0.0, -0.3, -1.0, -2.5])  # a small vocabulary, no ties


def _sampler(params: list[SamplingParams], ids: list[str] | None = None) -> tuple[Sampler, list[Sequence]]:
    """A sampler holding one request per params, each with a one-token prompt of its own length."""
    sampler = Sampler(CPU)
    ids = ids or [f"r{i}" for i in range(len(params))]
    seqs = []
    for rid, p in zip(ids, params, strict=True):
        sampler.add(rid, p)
        seqs.append(Sequence(rid, [0], p, 0.0))
    return sampler, seqs


def _draw(sampler: Sampler, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
    params, keys = sampler.rows(seqs)
    rows = (torch.from_numpy(params), torch.from_numpy(keys)) if sampler.active else None
    return sampler.sample(logits, rows).tolist()


def expected(p: SamplingParams, logits: torch.Tensor = LOGITS) -> np.ndarray:
    """softmax(logits / T) cut by top-k, then top-p, then min-p, written the slow way (a sorted list)."""
    probs = torch.softmax(logits.double() / p.temperature, -1).numpy()
    order = list(np.argsort(-probs))
    if p.top_k > 0:
        order = order[: p.top_k]
    if p.top_p < 1:
        total, kept = probs[order].sum(), []
        for v in order:
            kept.append(v)
            if probs[kept].sum() >= p.top_p * total:
                break
        order = kept
    order = [v for v in order if probs[v] >= p.min_p * probs[order[0]]]
    out = np.zeros_like(probs)
    out[order] = probs[order] / probs[order].sum()
    return out


def chi2_critical(df: int, alpha_z: float = 3.719) -> float:
    """Upper quantile of chi-square at alpha = 1e-4 (z = 3.719), by Wilson and Hilferty's approximation."""
    return df * (1 - 2 / (9 * df) + alpha_z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.6),
        SamplingParams(temperature=1.7, top_k=3),
        SamplingParams(temperature=0.8, top_p=0.75),
        SamplingParams(temperature=1.2, min_p=0.2),
        SamplingParams(temperature=1.0, top_k=5, top_p=0.8, min_p=0.3),
    ],
    ids=["T1", "T0.6", "top_k", "top_p", "min_p", "all_cuts"],
)
def test_draws_follow_the_cut_softmax(params: SamplingParams) -> None:
    # 20,000 requests with distinct seeds, each drawing its first token: independent draws.
    n = 20_000
    sampler, seqs = _sampler([dataclasses.replace(params, seed=i) for i in range(n)])
    counts = np.bincount(_draw(sampler, seqs, LOGITS.expand(n, -1).contiguous()), minlength=len(LOGITS))
    probs = expected(params)
    assert (counts[probs == 0] == 0).all(), f"drew a token the cut removes: {counts} for {probs}"
    kept = probs > 0
    stat = float((((counts - n * probs)[kept]) ** 2 / (n * probs[kept])).sum())
    df = int(kept.sum()) - 1
    if df:
        assert stat < chi2_critical(df), f"chi2 {stat:.1f} on {df} df: counts {counts}, expected {n * probs}"


def test_the_distribution_check_sees_a_wrong_temperature() -> None:
    # The test above can fail: draws at T = 1 judged against T = 0.6 are rejected.
    n = 20_000
    sampler, seqs = _sampler([SamplingParams(temperature=1.0, seed=i) for i in range(n)])
    counts = np.bincount(_draw(sampler, seqs, LOGITS.expand(n, -1).contiguous()), minlength=8)
    probs = expected(SamplingParams(temperature=0.6))
    assert ((counts - n * probs) ** 2 / (n * probs)).sum() > chi2_critical(7)


def test_greedy_rows_take_the_argmax_of_the_raw_logits_among_sampled_rows() -> None:
    torch.manual_seed(0)
    logits = (torch.randn(6, 300) * 2).to(torch.bfloat16)
    logits[2, 17] = logits[2, 40] = logits[2].max() + 1  # a tie: the lower index, as torch.argmax
    params = [
        SamplingParams(temperature=0.9, top_k=3, seed=1),
        SamplingParams(temperature=0.0, top_k=3, top_p=0.1),  # cuts do not apply to greedy rows
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1e-7),  # below GREEDY_BELOW: greedy too
        SamplingParams(temperature=0.7, min_p=0.5, seed=2),
        SamplingParams(temperature=0.0, min_p=0.9),
    ]
    sampler, seqs = _sampler(params)
    got = _draw(sampler, seqs, logits)
    argmax = logits.argmax(-1).tolist()
    assert [got[i] for i in (1, 2, 3, 5)] == [argmax[i] for i in (1, 2, 3, 5)]
    assert got[2] == 17


def test_an_all_greedy_engine_takes_the_argmax_path() -> None:
    sampler, seqs = _sampler([SamplingParams(temperature=0.0)] * 3)
    assert not sampler.active
    logits = torch.randn(3, 50)
    assert sampler.sample(logits, None).tolist() == logits.argmax(-1).tolist()
    sampler.add("s", SamplingParams(temperature=0.5))
    assert sampler.active
    sampler.forget("s", SamplingParams(temperature=0.5))
    assert not sampler.active


def test_an_engine_draws_inside_its_graphs_only_while_no_request_asks_for_a_cut() -> None:
    sampler, _ = _sampler([SamplingParams(temperature=0.6), SamplingParams(temperature=0.0)])
    assert sampler.draws_in_graph
    for cut in (dict(top_k=5), dict(top_p=0.9), dict(min_p=0.1)):
        p = SamplingParams(temperature=0.6, **cut)
        sampler.add("cut", p)
        assert not sampler.draws_in_graph, cut
        sampler.forget("cut", p)
        assert sampler.draws_in_graph, cut


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 10))
def test_top_k_floor_keeps_exactly_the_k_largest(seed: int, k: int) -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(seed))
    ks = torch.tensor([k, 0, -1, 60], dtype=torch.float32)  # 0, -1 and k >= V: no cut
    floor = top_k_floor(logits, ks, max(k, 1))
    assert (logits[0] >= floor[0]).sum() == k
    assert torch.isinf(floor[1:]).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), p=st.floats(0.05, 0.95), temperature=st.floats(0.3, 2.0))
def test_top_p_keeps_the_smallest_nucleus(seed: int, p: float, temperature: float) -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(seed)) * 3
    scale = torch.full((4,), 1.4426950408889634 / temperature)
    thr = cut_threshold_ref(logits, scale, None, torch.full((4,), p), None)
    probs = (logits / temperature).softmax(-1)
    for row in range(4):
        kept = logits[row] >= thr[row]
        mass = probs[row][kept].sum().item()
        smallest = probs[row][kept].min().item()
        assert mass >= p - 1e-5  # the nucleus reaches p...
        assert mass - smallest < p + 1e-5  # ...and dropping its least likely token would not


def test_a_seeded_row_draws_the_same_token_alone_or_among_others() -> None:
    torch.manual_seed(1)
    logits = torch.randn(40, 500) / 3  # flat: the draw depends on the noise
    mine = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    alone, (seq,) = _sampler([mine])
    want = []
    for i in range(40):  # token i of the request
        seq.token_ids = [0] * (i + 1)
        want.append(_draw(alone, [seq], logits[i : i + 1])[0])
    others = [SamplingParams(temperature=0.5, top_k=7, min_p=0.1, seed=9), SamplingParams(temperature=0.0)]
    crowd, seqs = _sampler([*others, mine], ["a", "b", "mine"])
    got = []
    for i in range(40):
        seqs[2].token_ids = [0] * (i + 1)
        got.append(_draw(crowd, seqs, torch.stack([logits[(i + 1) % 40], logits[i], logits[i]]))[2])
    assert got == want
    assert len(set(want)) > 20  # and the draws do vary


def test_a_seed_repeats_and_positions_and_seeds_draw_apart() -> None:
    logits = torch.zeros(1, 1000)  # uniform: every draw is the noise's own argmax

    def first(seed: int | None, prompt_len: int = 1) -> int:
        sampler = Sampler(CPU, seed=5)
        p = SamplingParams(temperature=1.0, seed=seed)
        sampler.add("r", p)
        return _draw(sampler, [Sequence("r", [0] * prompt_len, p, 0.0)], logits)[0]

    assert first(7) == first(7)
    assert len({first(s) for s in range(20)}) > 15
    assert len({first(7, n) for n in range(1, 21)}) > 15  # the token position is part of the key
    assert first(None) == first(None)  # unseeded: derived from the engine's seed, so runs repeat


def test_bf16_logits_sample_as_their_float32_upcast_would() -> None:
    torch.manual_seed(0)
    logits = (torch.randn(6, 1000) * 4).to(torch.bfloat16)
    sampler, seqs = _sampler([SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=i) for i in range(6)])
    assert _draw(sampler, seqs, logits) == _draw(sampler, seqs, logits.float())


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"temperature": -0.1}, "temperature must be"),
        ({"temperature": float("nan")}, "temperature must be"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"top_k": -2}, "top_k must be an integer >= 1, or -1 or 0"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"min_p": -0.1}, "min_p must be in [0, 1]"),
        ({"min_p": 1.1}, "min_p must be in [0, 1]"),
        ({"seed": 1.5}, "seed must be an integer"),
    ],
)
def test_bad_sampling_params_are_clear_errors(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        SamplingParams(**bad)


def test_the_references_give_the_same_answer_a_few_rows_at_a_time(monkeypatch) -> None:
    # They bound their (rows, V) temporaries by working on chunks of rows: nothing may depend on it.
    from llmbench.kernels import sample as draw
    from llmbench.kernels import sample_cut

    torch.manual_seed(0)
    x = torch.randn(50, 1000)
    scale = torch.rand(50) + 0.5
    scale[::3] = 0
    keys, pos = torch.randint(0, 2**32, (50,)), torch.arange(50)
    floor = x.topk(30, -1).values[:, -1].contiguous()
    top_p, min_p = torch.full((50,), 0.8), torch.full((50,), 0.1)
    whole = draw.sample_ref(x, scale, floor, keys, pos), cut_threshold_ref(x, scale, floor, top_p, min_p)
    monkeypatch.setattr(draw, "REF_CHUNK_ELEMENTS", 3000)
    monkeypatch.setattr(sample_cut, "REF_CHUNK_ELEMENTS", 3000)
    chunked = draw.sample_ref(x, scale, floor, keys, pos), cut_threshold_ref(x, scale, floor, top_p, min_p)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])
