"""Workloads: a scenario's ``workload:`` turned into a list of :class:`RequestSpec`.

``build_workload`` is deterministic in ``(seed, salt)`` and the backend's context: lengths, file records
and their order depend on ``seed`` alone (and, for ShareGPT, on which conversations the context can
serve); random prompt token ids depend on ``salt`` too. The runner salts by (sweep point, repeat), the
same in every ablation variant, so variants see identical requests (their outputs are comparable request
by request) while successive repeats and points in one engine do not hit each other's prefix-cache
blocks. What a build leaves out comes back with the requests as warning lines (``Built.warnings``), the
same for every salt: the run says them once.
"""

from __future__ import annotations

import numpy as np

from llmbench.bench.scenario.backend_registry import BACKENDS
from llmbench.bench.scenario.workload_schema import Workload
from llmbench.bench.workload.files import check_prompt_file, prompt_file_requests, trace_requests
from llmbench.bench.workload.sharegpt import sharegpt_requests
from llmbench.bench.workload.spec import Built, Encoder, Fits, RequestSpec, require_fit
from llmbench.bench.workload.synthetic import shared_prefix_requests, synthetic_requests, token_range


def build_workload(
    workload: Workload,
    encoder: Encoder,
    vocab_size: int,
    seed: int,
    salt: int = 0,
    fits: Fits | None = None,
) -> Built:
    """The requests, each through ``fits`` (``context_check``): synthetic ones and traces before any token
    is drawn. A request that does not fit is a WorkloadError, except a ShareGPT conversation: that one is
    skipped, as vLLM's benchmark skips it, and counted in the warnings."""
    rng = np.random.default_rng(seed)
    token_rng = np.random.default_rng([seed, salt])
    if workload.source == "synthetic":
        return Built(synthetic_requests(workload, vocab_size, rng, token_rng, fits))
    if workload.source == "shared_prefix":
        return Built(shared_prefix_requests(workload, vocab_size, rng, token_rng, fits))
    if workload.source == "trace":
        return Built(trace_requests(workload, vocab_size, token_rng, fits))
    if workload.source == "file":
        built = prompt_file_requests(workload, encoder, vocab_size, rng)
    else:
        built = sharegpt_requests(workload, encoder, rng, fits)
    for spec in built.requests:  # their lengths are known once their text is encoded
        require_fit(fits, spec.request_id, spec.input_len, spec.max_tokens)
    return built


def build_requests(
    workload: Workload,
    encoder: Encoder,
    vocab_size: int,
    seed: int,
    salt: int = 0,
    fits: Fits | None = None,
) -> list[RequestSpec]:
    """``build_workload``'s requests, for callers that report no warnings."""
    return build_workload(workload, encoder, vocab_size, seed, salt, fits).requests


def context_check(max_model_len: int | None, backend: str) -> Fits | None:
    """Whether a request's prompt and output fit the backend's context (None when it is not known here:
    a remote server that does not say it refuses such a request itself, HTTP 400, counted as failed)."""
    if max_model_len is None:
        return None
    what = "engine's max_model_len" if backend == "engine" else f"{backend} model's context length"
    # a backend run here takes its context from engine.max_model_len; a remote server's is its own
    raise_it = "" if BACKENDS[backend].remote else " or raise engine.max_model_len"
    fix = "shorten the workload" + raise_it

    def fits(prompt: int, output: int) -> str | None:
        if prompt + output <= max_model_len:
            return None
        return f"{prompt} prompt + {output} output tokens exceed the {what} ({max_model_len}); {fix}"

    return fits


__all__ = [
    "Built",
    "Encoder",
    "Fits",
    "RequestSpec",
    "build_requests",
    "build_workload",
    "check_prompt_file",
    "context_check",
    "token_range",
]
