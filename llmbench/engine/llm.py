"""``LLM``: the public, offline API. Prompts in, generated tokens out."""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence as Seq
from typing import Any

from llmbench.engine.config import EngineConfig, Tuning
from llmbench.engine.llm_engine import LLMEngine
from llmbench.engine.outputs import RequestOutput
from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.scoring import ScoreOutput, score


class LLM:
    """An inference engine on one model, every optimisation a switch.

        from llmbench import LLM, SamplingParams
        with LLM("qwen3-0.6b", device="cuda", cuda_graph=True) as llm:
            outs = llm.generate([[1, 2, 3], "Hello"], SamplingParams(temperature=0.0, max_tokens=16))
        outs[0].token_ids  # the generated tokens only; outs[0].text, their text

    ``model`` is a preset name (``llmbench models``: real shapes, random weights) or a folder holding
    config.json and *.safetensors. Every engine option below is a keyword with a default; a value that
    is malformed, or an option that cannot apply on this machine, is a ``ConfigError`` naming it and what
    is allowed (all malformed values at once). ``tuning`` takes a mapping (or a ``Tuning``) of the
    tuning knobs, e.g. ``LLM(..., tuning={"skinny_fusion": "none"})``.

    ``shutdown()`` (or leaving the ``with`` block) frees the model, its KV pool and, at tp > 1, the
    ranks' processes; an engine dropped without it is shut down when collected. A process holds one
    tensor-parallel engine at a time (torch.distributed has one default group per process): building a
    second one while the first is alive is an ``EngineConflictError``.
    """

    def __init__(self, model: str | os.PathLike[str] = "qwen3-tiny", **options: Any) -> None:
        self.engine = LLMEngine(EngineConfig.from_options(model, **options))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Seq[list[int] | str] | str,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt and return one ``RequestOutput`` each, in the prompts' order.

        ``prompts``: token-id lists or texts (one text or one id list alone is one prompt).
        ``sampling_params``: one ``SamplingParams`` for all, one per prompt, or None (the defaults).
        Each output carries ``token_ids`` (generated only), ``text``, ``finish_reason`` ("length",
        "stop") and host timestamps (arrival, first scheduled, each token, finish). A prompt that cannot
        be served (prompt plus max_tokens beyond max_model_len, token ids outside the vocabulary, more KV
        blocks than the pool holds) is a ``RequestError`` naming it, before anything runs.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = sampling_params or SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        wrong = (
            [p for p in params if not isinstance(p, SamplingParams)]
            if isinstance(params, list | tuple)
            else [params]
        )
        if wrong:
            raise TypeError(
                f"sampling_params takes SamplingParams (one, or a list of one a prompt), got a "
                f"{type(wrong[0]).__name__}: SamplingParams(temperature=..., max_tokens=...)"
            )
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        ids = [f"gen-{i}" for i in range(len(prompts))]
        added = []
        done: dict[str, RequestOutput] = {}
        try:
            for rid, prompt, p in zip(ids, prompts, params, strict=True):
                self.engine.add_request(rid, prompt, p)
                added.append(rid)
            while self.engine.has_unfinished():
                for out in self.engine.step().finished:
                    done[out.request_id] = out
        except BaseException:
            # A bad prompt later in the list, a step that failed, Ctrl-C: this call's requests leave the
            # engine, which stays usable for the next call (whose ids are these again).
            for rid in added:
                self.engine.abort(rid)
            raise
        outputs = [done[rid] for rid in ids]
        for out in outputs:
            out.text = self.engine.tokenizer.decode(out.token_ids)
        return outputs

    def shutdown(self) -> None:
        """Free the model, its KV pool and CUDA Graphs and stop the tensor-parallel ranks. Calling it
        again does nothing; ``generate`` afterwards is an error."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def score(
        self, prompts: Seq[list[int]], continuations: Seq[list[int]], full: bool = False
    ) -> list[ScoreOutput]:
        """Teacher-forced log-probabilities of each continuation after its prompt, one decode step per
        token (engine/scoring.py); ``full=True`` adds every position's whole next-token distribution."""
        return score(self.engine, prompts, continuations, full)


# help(LLM) lists every option with its meaning, written once in EngineConfig's and Tuning's docstrings.
LLM.__doc__ = "\n\n".join(
    [
        inspect.cleandoc(LLM.__doc__ or ""),
        "Engine options (EngineConfig)",
        inspect.cleandoc(EngineConfig.__doc__ or ""),
        "Tuning knobs (tuning={...}: Tuning)",
        inspect.cleandoc(Tuning.__doc__ or ""),
    ]
)
