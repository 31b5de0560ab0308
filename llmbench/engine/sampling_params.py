"""Per-request sampling settings, checked where they are made.

- temperature: >= 0; 0 (and anything below ``GREEDY_BELOW``, which float32 logits cannot tell from 0)
  is greedy: the argmax of the raw logits, every cut below ignored.
- top_k: keep the k most likely tokens (every token tied with the k-th too); -1 or 0: no cut.
- top_p: in (0, 1]; keep the smallest set of most likely tokens whose probability reaches top_p (after
  top-k), ties with its least likely token included; 1: no cut.
- min_p: in [0, 1]; keep tokens with probability >= min_p x the most likely one's; 0: no cut.
- seed: the request's own random stream (any int). Draws depend only on (seed, position of the token in
  the request): a seeded request gives the same tokens alone or batched with others. None: the engine
  derives one from its own seed and the request's order of arrival, so whole runs still repeat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled and when it stops (the module docstring says what each cut does).

    temperature: 0 is greedy (the most likely token); above 0, softmax(logits / temperature) is sampled.
    top_k: sample among the k most likely tokens only; -1 or 0: no cut.
    top_p: sample among the most likely tokens whose probabilities add up to p (0 < p <= 1; 1: no cut).
    max_tokens: new tokens to generate at most (>= 1); prompt plus max_tokens must fit max_model_len.
    ignore_eos: keep generating past an end-of-sequence token, up to max_tokens (benchmarks use it so
        that lengths follow the workload exactly).
    seed: this request's own random stream: its tokens depend only on (seed, position), alone or batched;
        None: one derived from the engine's seed and the request's order of arrival.
    min_p: keep tokens with probability >= min_p x the most likely one's (0 <= min_p <= 1; 0: no cut).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False
    seed: int | None = None
    min_p: float = 0.0  # last: the fields before it keep their positions

    def __post_init__(self) -> None:
        # Written so that NaN fails every check.
        for name in ("temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(
                f"temperature must be a finite number >= 0 (0 is greedy), got {self.temperature}"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be an integer >= 1, or -1 or 0 for no cut, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 is no cut), got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0 is no cut), got {self.min_p}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def greedy_ignores(settings: dict[str, object]) -> list[str]:
    """Which of ``settings`` (temperature, top_k, top_p, min_p, seed, as a scenario's ``sampling:`` gives
    them) a greedy draw ignores, each as ``name=value``: the cuts and the seed when the temperature is 0
    or below GREEDY_BELOW, and such a temperature itself when it is above 0."""
    temperature = settings.get("temperature", 0.0)
    if not isinstance(temperature, int | float) or temperature >= GREEDY_BELOW:
        return []
    idle = {"top_k": (0, -1), "top_p": (1, 1.0), "min_p": (0, 0.0), "seed": (None, "engine")}
    ignored = [f"temperature={temperature:g}"] if temperature > 0 else []
    return ignored + [
        f"{name}={settings[name]}" for name, off in idle.items() if settings.get(name, off[0]) not in off
    ]
