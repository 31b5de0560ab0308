"""What a workload produces: requests as token ids, ready for the engine.

Text prompts are tokenised once, up front, so every request's input length is known before the run
and no tokenisation happens while the clock runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from llmbench.bench.errors import WorkloadError


class RequestSpec(NamedTuple):
    request_id: str  # stable across repeats and variants: outputs are compared by it
    prompt: list[int]
    max_tokens: int
    arrival: float | None = (
        None  # seconds after the start, for trace replay; None: the arrival process decides
    )

    @property
    def input_len(self) -> int:
        return len(self.prompt)


class Built(NamedTuple):
    """A workload's requests, and what building them left out: one warning line each, for the run's
    warnings (ShareGPT conversations that cannot be served)."""

    requests: list[RequestSpec]
    warnings: tuple[str, ...] = ()


class Encoder(Protocol):
    def encode(self, text: str, special: bool = True) -> list[int]: ...  # models/tokenizer.py's


# (prompt tokens, output tokens) -> why the backend cannot take such a request; None when it can.
Fits = Callable[[int, int], str | None]


def require_fit(fits: Fits | None, request_id: str, prompt: int, output: int) -> None:
    """A request the backend cannot take is a WorkloadError naming it (no reader but ShareGPT's skips one)."""
    if fits is not None and (problem := fits(prompt, output)) is not None:
        raise WorkloadError(f"request {request_id}: {problem}")


def byte_level_note(encoder: Encoder, where: str) -> list[str]:
    """The warning for text a preset's byte-level stand-in tokenizer encodes (none for a real tokenizer)."""
    from llmbench.models.tokenizer import ByteTokenizer

    if not isinstance(encoder, ByteTokenizer):
        return []
    return [
        f"{where}: text prompts are encoded by the preset's byte-level stand-in tokenizer, one token per UTF-8 "
        "byte (a real model's tokenizer gives about a quarter as many for English), and outputs decode as "
        "bytes: lengths are not the real model's; give a model folder with its tokenizer for those"
    ]
