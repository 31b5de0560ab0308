"""One configuration's side of a quality comparison, run in a process of its own.

The baseline's process builds its engine, generates greedily from the scenario's first ``prompts``
requests (``tokens`` new tokens each, EOS ignored), scores that continuation teacher-forced, one decode
step per token (``LLM.score``: full next-token distributions), and saves all of it in a file. Each
variant's process builds its own engine, does the same in the same order (so a float8 cache calibrates
its scales on the same first prefill), forced along the baseline's continuation instead of its own,
and writes its figures against the baseline's (``compare.py``). The prefix cache is emptied between the
two passes, so the second does not reuse blocks of the first.

With a text file, both also score its first ``text_tokens`` tokens, in windows of ``WINDOW`` tokens
(each window's first token is its prompt), for perplexity.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import torch

from llmbench.bench.errors import BenchError
from llmbench.bench.quality.compare import perplexity, summarise
from llmbench.bench.scenario.loader import ResolvedScenario
from llmbench.bench.store import write_json
from llmbench.bench.workload import build_requests

WINDOW = 512  # tokens per perplexity window: long enough for context to matter, short enough to batch


class QualitySettings(NamedTuple):
    prompts: int = 8  # the scenario's first requests
    tokens: int = 32  # positions compared per prompt (each keeps vocabulary-sized distributions)
    text: str | None = None  # a text file for perplexity
    text_tokens: int = 4096  # at most this many of its tokens


def _greedy(llm: Any, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    from llmbench import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)]


def _text_windows(path: str, llm: Any, settings: QualitySettings) -> list[list[int]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"--quality-text {path}: cannot read it as UTF-8 text ({exc})") from None
    ids = llm.tokenizer.encode(text)[: settings.text_tokens]
    width = min(WINDOW, llm.engine.max_model_len)
    windows = [ids[i : i + width] for i in range(0, len(ids), width)]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise BenchError(f"--quality-text {path}: fewer than two tokens of text to score")
    return windows


def _measure(llm: Any, prompts: list[list[int]], forced: list[list[int]] | None, settings: QualitySettings):
    """Greedy outputs, then the teacher-forced distributions along ``forced`` (None: along those outputs),
    then the text's windows' log-probabilities (or None)."""
    greedy = _greedy(llm, prompts, settings.tokens)
    llm.engine.reset_prefix_cache()
    scored = llm.score(prompts, forced if forced is not None else greedy, full=True)
    text = None
    if settings.text:
        llm.engine.reset_prefix_cache()
        windows = _text_windows(settings.text, llm, settings)
        text = [s.logprobs for s in llm.score([w[:1] for w in windows], [w[1:] for w in windows])]
    return greedy, [s.distributions for s in scored], text


def run_side(
    resolved: ResolvedScenario,
    options: dict[str, Any],
    settings: QualitySettings,
    baseline: Path,
    out: Path | None,
) -> None:
    """The baseline's side (``out`` None: write ``baseline``) or a variant's (read ``baseline``, write ``out``)."""
    from llmbench import LLM
    from llmbench.models.registry import resolve_model

    sc = resolved.scenario
    llm = LLM(sc.model, **{**sc.engine, **options})
    try:
        if out is None:
            specs = build_requests(sc.workload, llm.tokenizer, llm.engine.model_config.vocab_size, sc.seed)
            prompts = [list(s.prompt) for s in specs[: settings.prompts]]
            greedy, dists, text = _measure(llm, prompts, None, settings)
            record = {
                "prompts": prompts,
                "greedy": greedy,
                "distributions": dists,
                "text_logprobs": text,
                "random_weights": resolve_model(sc.model)[1] is None,
            }
            torch.save(record, baseline)
            return
        base = torch.load(baseline, weights_only=True)
        greedy, dists, text = _measure(llm, base["prompts"], base["greedy"], settings)
    finally:
        llm.engine.shutdown()
    figures = summarise(base["distributions"], dists, base["greedy"], greedy)
    figures["perplexity_baseline"] = perplexity(base["text_logprobs"]) if base["text_logprobs"] else None
    figures["perplexity"] = perplexity(text) if text else None
    figures["random_weights"] = base["random_weights"]
    write_json(out, figures)


def read_side(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
