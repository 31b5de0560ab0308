"""Sampler properties: greedy is argmax, top-k and top-p never leave their set, a seed repeats."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.engine.sampler import Sampler, apply_top_k_top_p
from llmbench.engine.sampling_params import SamplingParams


def _logits(seed: int, n: int = 4, v: int = 50) -> torch.Tensor:
    return torch.randn(n, v, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = _logits(0)
    ids = [str(i) for i in range(4)]
    got = Sampler(torch.device("cpu"))(logits, ids, [SamplingParams(temperature=0.0)] * 4)
    assert got == logits.argmax(-1).tolist()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 10))
def test_top_k_never_leaves_the_top_k(seed, k):
    logits = _logits(seed)
    sampler = Sampler(torch.device("cpu"))
    allowed = logits.topk(k, dim=-1).indices
    for draw in range(5):
        params = [SamplingParams(temperature=1.5, top_k=k, seed=seed * 10 + draw)] * 4
        got = sampler(logits, [f"{draw}-{i}" for i in range(4)], params)
        for row, tok in enumerate(got):
            assert tok in allowed[row].tolist()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), p=st.floats(0.05, 0.95))
def test_top_p_keeps_the_smallest_nucleus(seed, p):
    logits = _logits(seed)
    cut = apply_top_k_top_p(logits, [0] * 4, [p] * 4)
    probs = logits.softmax(-1)
    for row in range(4):
        kept = torch.isfinite(cut[row])
        mass = probs[row][kept].sum().item()
        assert mass >= p - 1e-6  # the nucleus reaches p...
        smallest_kept = probs[row][kept].min()
        assert mass - smallest_kept.item() < p + 1e-6  # ...and dropping its least likely token would not
        assert (probs[row][~kept] <= smallest_kept + 1e-7).all()  # nothing dropped beats anything kept


def test_a_seed_repeats_and_different_seeds_differ():
    logits = _logits(1, n=1, v=1000) / 10  # flat enough that draws vary

    def draws(seed):
        s = Sampler(torch.device("cpu"))
        return [s(logits, ["r"], [SamplingParams(temperature=1.0, seed=seed)])[0] for _ in range(20)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    s = Sampler(torch.device("cpu"))
    n = 3000
    counts = torch.bincount(
        torch.tensor([s(logits, ["r"], [SamplingParams(temperature=1.0, seed=3)])[0] for _ in range(n)]),
        minlength=3,
    )
    freq = counts.float() / n
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.035), freq


def test_bf16_logits_sample_as_their_float32_upcast_would():
    # The engine hands the sampler logits in the model dtype (no float copy of the vocabulary).
    torch.manual_seed(0)
    logits = (torch.randn(6, 1000) * 4).to(torch.bfloat16)
    greedy = [SamplingParams(temperature=0.0)] * 6
    ids = [f"r{i}" for i in range(6)]
    assert Sampler(torch.device("cpu"))(logits, ids, greedy) == logits.float().argmax(-1).tolist()
    seeded = [SamplingParams(temperature=0.7, top_k=50, seed=i) for i in range(6)]
    a = Sampler(torch.device("cpu"))(logits, ids, seeded)
    b = Sampler(torch.device("cpu"))(logits.float(), ids, seeded)
    assert a == b
