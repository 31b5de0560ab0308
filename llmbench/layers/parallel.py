"""The tensor-parallel group a layer belongs to, handed to it at construction (no globals).

A layer needs of its group its rank and size (which shard of each weight it holds) and two collectives:
the sum over the ranks (row-parallel outputs, the vocabulary-parallel embedding) and the concatenation
along the last dimension (vocabulary-parallel logits). ``Collectives`` names those two; the communicators
of ``llmbench/distributed/`` provide them, and more (the fused operations of decode steps, which the
layers never call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class Collectives(Protocol):
    """What a layer asks of the other ranks of its group."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the ranks (in place or not: use the result)."""
        ...

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` concatenated along the last dimension, in rank order."""
        ...


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    # None: a group that only shapes shards (building a rank's model to count its weights); it cannot
    # run a forward at size > 1
    comm: Collectives | None = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the group (``x`` itself for one rank)."""
        return x if self.size == 1 else self._comm().all_reduce(x)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` concatenated along the last dimension (``x`` itself for one rank)."""
        return x if self.size == 1 else self._comm().all_gather(x)

    def split(self, total: int, what: str) -> int:
        if total % self.size:
            raise ValueError(f"{what} ({total}) is not divisible by the tensor-parallel degree {self.size}")
        return total // self.size

    def _comm(self) -> Collectives:
        if self.comm is None:
            raise RuntimeError(
                f"TPGroup(rank={self.rank}, size={self.size}) has no communicator: it shapes shards, it "
                "cannot run them"
            )
        return self.comm


SINGLE = TPGroup()
