"""Synthetic prompts of random token ids: exact lengths, no tokenizer involved.

Random ids keep the prompt length exact (512 means 512 tokens) and defeat any accidental prefix
sharing; ``shared_prefix`` adds sharing back on purpose, with a known number of distinct prefixes.
Ids are uniform over the vocabulary, or over ``workload.token_ids`` ([min, max)) when it is given.
"""

from __future__ import annotations

import numpy as np

from llmbench.bench.errors import WorkloadError
from llmbench.bench.scenario.workload_schema import Workload
from llmbench.bench.workload.lengths import sample_lengths
from llmbench.bench.workload.spec import Fits, RequestSpec, require_fit


def _tokens(rng: np.random.Generator, n: int, ids: tuple[int, int]) -> list[int]:
    return rng.integers(ids[0], ids[1], size=int(n)).tolist()


def token_range(workload: Workload, vocab_size: int) -> tuple[int, int]:
    """[low, high) of the prompt ids: ``workload.token_ids``, or the whole vocabulary."""
    r = workload.token_ids
    if r is None:
        return 0, vocab_size
    if r.max > vocab_size:
        raise WorkloadError(
            f"workload.token_ids.max: {r.max} is past the model's vocabulary ({vocab_size} ids: max <= {vocab_size})"
        )
    return r.min, r.max


def _check(fits: Fits | None, prompts: np.ndarray, outputs: np.ndarray) -> None:
    """Every request's lengths through ``fits``, before any token is drawn: a length mistyped by a few
    orders of magnitude is an error, not an exhausted memory."""
    if fits is not None:
        for i, (prompt, output) in enumerate(zip(prompts.tolist(), outputs.tolist(), strict=True)):
            require_fit(fits, str(i), prompt, output)


def synthetic_requests(
    workload: Workload,
    vocab_size: int,
    rng: np.random.Generator,
    token_rng: np.random.Generator,
    fits: Fits | None = None,
) -> list[RequestSpec]:
    """Lengths come from ``rng``, token ids from ``token_rng`` (so repeats can share lengths, not prompts)."""
    n = workload.num_requests
    ids = token_range(workload, vocab_size)
    inputs = sample_lengths(workload.input_len, n, rng)
    outputs = sample_lengths(workload.output_len, n, rng)
    _check(fits, inputs, outputs)
    return [RequestSpec(str(i), _tokens(token_rng, inputs[i], ids), int(outputs[i])) for i in range(n)]


def shared_prefix_requests(
    workload: Workload,
    vocab_size: int,
    rng: np.random.Generator,
    token_rng: np.random.Generator,
    fits: Fits | None = None,
) -> list[RequestSpec]:
    """Request i = prefix[i % num_prefixes] + its own random suffix of ``input_len`` tokens."""
    n = workload.num_requests
    ids = token_range(workload, vocab_size)
    prefix_lens = sample_lengths(workload.prefix_len, workload.num_prefixes, rng)
    suffixes = sample_lengths(workload.input_len, n, rng)
    outputs = sample_lengths(workload.output_len, n, rng)
    _check(fits, prefix_lens[np.arange(n) % len(prefix_lens)] + suffixes, outputs)
    prefixes = [_tokens(token_rng, length, ids) for length in prefix_lens]
    return [
        RequestSpec(
            str(i), prefixes[i % len(prefixes)] + _tokens(token_rng, suffixes[i], ids), int(outputs[i])
        )
        for i in range(n)
    ]
