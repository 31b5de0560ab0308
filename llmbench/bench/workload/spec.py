"""What a workload produces: requests as token ids, ready for the engine.

Text prompts are tokenised once, up front, so every request's input length is known before the run
and no tokenisation happens while the clock runs.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol


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


class Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...
