"""Whether an engine can serve the workload at all, decided before a run (or any run of an ablation's
variants) starts: the workload's longest request against the engine's max_model_len and, where
num_kv_blocks sizes it, the whole KV pool. The requests are built as every run builds them (their lengths depend on the seed alone),
where that needs no tokenizer (synthetic, shared_prefix and trace sources; prompt files are checked by
each run)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmbench.bench.errors import BenchError
from llmbench.bench.scenario.loader import ResolvedScenario
from llmbench.bench.workload import RequestSpec

if TYPE_CHECKING:
    from llmbench.engine.resolve import ResolvedConfig

SIZED_WITHOUT_TOKENIZER = ("synthetic", "shared_prefix", "trace")  # workload sources
_longest_built: dict[tuple[str, int, str], RequestSpec | None] = {}


def longest_request(resolved: ResolvedScenario) -> RequestSpec | None:
    """The workload's longest request (prompt plus output tokens), built as every run builds it (its
    lengths depend on the seed alone, not on the repeat); None where that needs a tokenizer (prompt files,
    ShareGPT: each run checks its own requests) or the workload cannot be built (the run says why)."""
    from llmbench.bench.workload import build_requests
    from llmbench.engine.config import ConfigError
    from llmbench.engine.resolve import find_model

    sc = resolved.scenario
    key = (sc.model, sc.seed, sc.workload.model_dump_json())
    if key not in _longest_built:
        longest = None
        if sc.workload.source in SIZED_WITHOUT_TOKENIZER:
            try:
                specs = build_requests(sc.workload, None, find_model(sc.model)[0].vocab_size, sc.seed)
            except (BenchError, ConfigError):
                specs = []
            longest = max(specs, key=lambda s: s.input_len + s.max_tokens, default=None)
        _longest_built[key] = longest
    return _longest_built[key]


def budget_warning(config: ResolvedConfig, longest: RequestSpec) -> str | None:
    """Without chunked prefill a prompt longer than the step budget still runs, whole and alone in its step:
    said, since such steps are past max_num_batched_tokens."""
    if config.chunked_prefill or longest.input_len <= config.max_num_batched_tokens:
        return None
    return (
        f"chunked_prefill=False with prompts of up to {longest.input_len} tokens: one longer than "
        f"max_num_batched_tokens={config.max_num_batched_tokens} runs whole, alone in its step, past the budget"
    )


def fit_problem(config: ResolvedConfig, longest: RequestSpec) -> str | None:
    """Why the workload's longest request cannot be served by an engine of this resolved config: past its
    max_model_len, or, where num_kv_blocks sizes the KV pool, past the whole pool."""
    from llmbench.engine.block_manager import blocks_for

    total = longest.input_len + longest.max_tokens
    request = (
        f"the workload's longest request ({longest.input_len} prompt + {longest.max_tokens} output tokens)"
    )
    if total > config.max_model_len:
        return (
            f"{request} does not fit max_model_len={config.max_model_len}: give max_model_len >= {total}, "
            "or shorten the workload"
        )
    blocks, size = config.num_kv_blocks, config.block_size
    if blocks is None:  # sized from the memory budget at start-up
        return None
    if config.paged_kv:
        need = blocks_for(total, size)
        if need > blocks:
            return (
                f"{request} needs {need} KV blocks of {size} tokens, more than the whole pool "
                f"(num_kv_blocks={blocks}): give num_kv_blocks >= {need}"
            )
        return None
    slab = blocks_for(config.max_model_len, size)
    if slab > blocks:
        return (
            f"paged_kv=False reserves max_model_len={config.max_model_len} tokens ({slab} KV blocks of {size}) "
            f"per sequence, more than the whole pool (num_kv_blocks={blocks}): give num_kv_blocks >= {slab} "
            "or a smaller max_model_len"
        )
    return None
