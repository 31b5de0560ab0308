"""``LLM``: the public, offline API. Prompts in, generated tokens out."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from llmbench.engine.config import EngineConfig
from llmbench.engine.llm_engine import LLMEngine
from llmbench.engine.outputs import RequestOutput
from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.scoring import ScoreOutput, score


class LLM:
    def __init__(self, model: str = "qwen3-tiny", **options: Any) -> None:
        self.engine = LLMEngine(EngineConfig.from_options(model, **options))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Seq[list[int] | str] | str,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = sampling_params or SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        ids = [f"gen-{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, params, strict=True):
            self.engine.add_request(rid, prompt, p)
        done: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step().finished:
                done[out.request_id] = out
        outputs = [done[rid] for rid in ids]
        for out in outputs:
            out.text = self.engine.tokenizer.decode(out.token_ids)
        return outputs

    def score(
        self, prompts: Seq[list[int]], continuations: Seq[list[int]], full: bool = False
    ) -> list[ScoreOutput]:
        """Teacher-forced log-probabilities of each continuation after its prompt, one decode step per
        token (engine/scoring.py); ``full=True`` adds every position's whole next-token distribution."""
        return score(self.engine, prompts, continuations, full)
