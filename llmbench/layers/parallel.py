"""The tensor-parallel group a layer belongs to, handed to it at construction (no globals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed ProcessGroup when size > 1
    # A faster path for small messages (engine/symm_all_reduce.py, tp_all_reduce="symm_mem"), else NCCL/gloo.
    fast: Any = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the group: in place through torch.distributed, or a new tensor through ``fast``."""
        if self.size == 1:
            return x
        if self.fast is not None and self.fast.fits(x):
            return self.fast(x)
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along the last dimension (vocabulary-parallel logits)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def split(self, total: int, what: str) -> int:
        if total % self.size:
            raise ValueError(f"{what} ({total}) is not divisible by the tensor-parallel degree {self.size}")
        return total // self.size


SINGLE = TPGroup()
