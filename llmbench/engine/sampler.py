"""Turn the last-position logits of each sampling sequence into token ids.

Greedy rows take the argmax. Other rows are scaled by temperature, cut to top-k and top-p, and sampled
by the exponential race (argmax of p / E with E ~ Exp(1)), which needs no cumulative sum and lets a row
with its own seed draw its noise from its own generator.
"""

from __future__ import annotations

import torch

from llmbench.engine.sampling_params import SamplingParams


class Sampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._generators: dict[str, torch.Generator] = {}
        self._default = torch.Generator(device=device).manual_seed(0)

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._default
        gen = self._generators.get(request_id)
        if gen is None:
            gen = self._generators[request_id] = torch.Generator(device=self.device).manual_seed(params.seed)
        return gen

    def __call__(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> list[int]:
        return self.sample(logits, request_ids, params).tolist()

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """The sampled ids as a (N,) int64 tensor on the logits' device, without waiting for them."""
        # logits: (N, V) in the model dtype. Greedy rows take the argmax as they are: a float32 copy
        # would hold the same values (an exact upcast), so a copy of the whole vocabulary buys nothing.
        out = logits.argmax(dim=-1)
        if all(p.greedy for p in params):
            return out
        rows = [i for i, p in enumerate(params) if not p.greedy]
        idx = torch.tensor(rows, device=logits.device)
        sub = (
            logits[idx].float()
            / torch.tensor([params[i].temperature for i in rows], device=logits.device)[:, None]
        )
        sub = apply_top_k_top_p(sub, [params[i].top_k for i in rows], [params[i].top_p for i in rows])
        probs = sub.softmax(dim=-1)
        noise = torch.empty_like(probs)
        for j, i in enumerate(rows):
            noise[j].exponential_(generator=self._generator(request_ids[i], params[i]))
        out[idx] = (probs / noise).argmax(dim=-1)
        return out


def apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf."""
    # logits: (N, V)
    V = logits.shape[-1]
    k_host = [k if 0 < k < V else V for k in top_k]
    if all(k == V for k in k_host) and all(p >= 1.0 for p in top_p):  # decided on the host: no sync
        return logits
    ks = torch.tensor(k_host, device=logits.device)
    ps = torch.tensor(top_p, device=logits.device, dtype=logits.dtype)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(V, device=logits.device)[None, :]
    drop = rank >= ks[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # Keep a token while the mass before it is below top_p: the most likely token always stays.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= ps[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
