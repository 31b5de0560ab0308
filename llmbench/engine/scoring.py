"""Teacher-forced scoring: what an engine configuration predicts along a given continuation.

``score(engine, prompts, continuations)`` runs each prompt as a prefill and then each continuation token
as a decode step, as generation would run them (the same scheduler and batches, CUDA Graphs, a float8 KV
cache written and read back), except that the token fed next is the given one, not a sample. Position i
of a continuation gets ``log p(continuation[i] | prompt + continuation[:i])`` and, with ``full=True``,
the whole next-token distribution: the log-softmax over the vocabulary in float32, on the CPU (4 bytes
per vocabulary entry per token: keep such continuations short).

Steps run one at a time even when the engine schedules asynchronously (that overlaps host and device
work and changes no numerics). The engine must hold no other requests meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, NamedTuple

import torch

from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.step_inputs import build_step

if TYPE_CHECKING:
    from llmbench.engine.llm_engine import LLMEngine


class ScoreOutput(NamedTuple):
    prompt_token_ids: list[int]
    token_ids: list[int]  # the continuation scored
    logprobs: list[float]  # per position: log-probability of token_ids[i] given what precedes it
    distributions: torch.Tensor | None  # (len(token_ids), vocab) float32 log-softmax; with full=True


def score(
    engine: LLMEngine,
    prompts: Seq[list[int]],
    continuations: Seq[list[int]],
    full: bool = False,
) -> list[ScoreOutput]:
    from llmbench.engine.llm_engine import RequestError

    for what, seqs in (("prompt", prompts), ("continuation", continuations)):
        for i, ids in enumerate(seqs):
            if isinstance(ids, str) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise RequestError(
                    f"{what} {i} is {ids!r}: score takes token ids, a list of lists of ints (encode text with "
                    "llm.tokenizer.encode first)"
                )
    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts for {len(continuations)} continuations")
    if engine.has_unfinished():
        raise RequestError(f"score needs the engine to itself: it holds {engine.num_unfinished} request(s)")
    vocab = engine.model_config.vocab_size
    for i, cont in enumerate(continuations):  # every check before the first request goes in
        if not cont:
            raise RequestError(f"continuation {i} is empty: there is nothing to score")
        bad = [t for t in cont if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"continuation {i} has token ids outside [0, {vocab}): {bad[:5]}")
    forced: dict[str, list[int]] = {}
    try:
        for i, (prompt, cont) in enumerate(zip(prompts, continuations, strict=True)):
            rid = f"score-{i}"
            params = SamplingParams(temperature=0.0, max_tokens=len(cont), ignore_eos=True)
            engine.add_request(rid, list(prompt), params)
            forced[rid] = list(cont)
    except RequestError:  # a prompt the engine refuses: leave it as it was
        for rid in forced:
            engine.abort(rid)
        raise
    prompts_kept = {rid: engine._seqs[rid].token_ids[:] for rid in forced}
    logprobs: dict[str, list[float]] = {rid: [] for rid in forced}
    rows: dict[str, list[torch.Tensor]] = {rid: [] for rid in forced}
    scheduler = engine.scheduler
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        if batch is None:
            raise RuntimeError("score: the scheduler could not schedule the requests left")
        arrays = build_step(batch.seqs, batch.num_new_tokens, engine.config.block_size, engine.tables)
        logits = engine._execute(arrays).logits
        sampling = scheduler.advance(batch)
        if not sampling:  # a step of prompt chunks only: nothing predicted yet
            continue
        logp = torch.log_softmax(logits[:, :vocab].float(), dim=-1)  # (N, vocab)
        targets = [forced[s.request_id][s.num_output_tokens] for s in sampling]
        picked = logp[
            torch.arange(len(sampling), device=logp.device), torch.tensor(targets, device=logp.device)
        ]
        full_rows = logp.cpu() if full else None
        for i, (seq, token, lp) in enumerate(zip(sampling, targets, picked.tolist(), strict=True)):
            logprobs[seq.request_id].append(lp)
            if full_rows is not None:
                rows[seq.request_id].append(full_rows[i])
            seq.token_ids.append(token)
            if seq.num_output_tokens == len(forced[seq.request_id]):
                engine._finish(seq, "length", time.perf_counter())
    return [
        ScoreOutput(
            prompts_kept[rid],
            forced[rid],
            logprobs[rid],
            torch.stack(rows[rid]) if full else None,
        )
        for rid in forced
    ]
