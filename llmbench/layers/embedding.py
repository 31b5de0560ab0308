"""Vocabulary-parallel token embedding and LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmbench.layers.parallel import SINGLE, TPGroup


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary; rows outside it contribute zeros."""

    def __init__(self, vocab_size: int, hidden: int, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        # The last rank's slice is padded so that every rank holds the same number of rows.
        self.per_rank = -(-vocab_size // tp.size)
        self.start = tp.rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if loaded.shape[0] != self.vocab_size or loaded.shape[1] != param.shape[1]:
            raise ValueError(
                f"shape {tuple(loaded.shape)} does not fit the embedding's ({self.vocab_size}, {param.shape[1]})"
            )
        part = loaded[self.start : self.start + self.per_rank]
        param.data.zero_()
        param.data[: part.shape[0]].copy_(part)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: (T,) -> (T, hidden)
        return self.tp.all_reduce(self.partial(input_ids))

    def partial(self, input_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's part of the embeddings (T, hidden): its slice's rows, zeros for the other ranks'
        tokens, so that the sum over the ranks is the embedding; into ``out`` when given."""
        if self.tp.size == 1 and out is None:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        inside = (local >= 0) & (local < self.per_rank)
        rows = F.embedding(local.clamp(0, self.per_rank - 1), self.weight)
        return torch.mul(rows, inside.unsqueeze(-1).to(self.weight.dtype), out=out)


class ParallelLMHead(VocabParallelEmbedding):
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: (N, hidden) -> logits (N, vocab)
        logits = self.tp.all_gather(F.linear(hidden, self.weight))
        return logits[:, : self.vocab_size]
