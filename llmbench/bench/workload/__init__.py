"""Workloads: a scenario's ``workload:`` turned into a list of :class:`RequestSpec`.

``build_requests`` is deterministic in ``(seed, salt)``: lengths, file records and their order depend on
``seed`` alone; random prompt token ids depend on ``salt`` too. The runner salts by (sweep point, repeat),
the same in every ablation variant, so variants see identical requests (their outputs are comparable
request by request) while successive repeats and points in one engine do not hit each other's
prefix-cache blocks.
"""

from __future__ import annotations

import numpy as np

from llmbench.bench.errors import WorkloadError
from llmbench.bench.scenario.workload_schema import Workload
from llmbench.bench.workload.files import (
    check_prompt_file,
    prompt_file_requests,
    sharegpt_requests,
    trace_requests,
)
from llmbench.bench.workload.spec import Encoder, RequestSpec
from llmbench.bench.workload.synthetic import Fits, shared_prefix_requests, synthetic_requests


def build_requests(
    workload: Workload,
    encoder: Encoder,
    vocab_size: int,
    seed: int,
    salt: int = 0,
    fits: Fits | None = None,
) -> list[RequestSpec]:
    """``fits(request_id, prompt_tokens, output_tokens)`` raises for a request the backend cannot take;
    every request passes it, synthetic ones and traces before any token is drawn."""
    rng = np.random.default_rng(seed)
    token_rng = np.random.default_rng([seed, salt])
    if workload.source == "synthetic":
        return synthetic_requests(workload, vocab_size, rng, token_rng, fits)
    if workload.source == "shared_prefix":
        return shared_prefix_requests(workload, vocab_size, rng, token_rng, fits)
    if workload.source == "trace":
        return trace_requests(workload, vocab_size, token_rng, fits)
    if workload.source == "file":
        specs = prompt_file_requests(workload, encoder, vocab_size, rng)
    else:
        specs = sharegpt_requests(workload, encoder, rng)
    for spec in specs if fits else ():  # their lengths are known once their text is encoded
        fits(spec.request_id, spec.input_len, spec.max_tokens)
    return specs


def context_check(max_model_len: int | None, backend: str) -> Fits | None:
    """The check that a request's prompt and output fit the backend's context (None for a remote server:
    it says so per request, HTTP 400, counted as failed)."""
    if max_model_len is None:
        return None
    what = "engine's max_model_len" if backend == "engine" else f"{backend} model's context length"
    fix = "shorten the workload" + (" or raise engine.max_model_len" if backend != "openai" else "")

    def fits(request_id: str, prompt: int, output: int) -> None:
        if prompt + output > max_model_len:
            raise WorkloadError(
                f"request {request_id}: {prompt} prompt + {output} output tokens exceed the {what} "
                f"({max_model_len}); {fix}"
            )

    return fits


__all__ = ["Encoder", "Fits", "RequestSpec", "build_requests", "check_prompt_file", "context_check"]
