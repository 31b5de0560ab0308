"""Per-request sampling settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled and when it stops.

    temperature: 0 is greedy (the most likely token); above 0, softmax(logits / temperature) is sampled.
    top_k: sample among the k most likely tokens only; 0 (or negative): no cut.
    top_p: sample among the most likely tokens whose probabilities add up to p (0 < p <= 1; 1: no cut).
    max_tokens: new tokens to generate at most (>= 1); prompt plus max_tokens must fit max_model_len.
    ignore_eos: keep generating past an end-of-sequence token, up to max_tokens (benchmarks use it so
        that lengths follow the workload exactly).
    seed: a seed for this request's own generator, so that its tokens repeat from run to run; None: the
        engine's shared generator (seeded once at start).
    """

    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 or negative: no top-k cut
    top_p: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
