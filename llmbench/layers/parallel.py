"""The tensor-parallel group a layer belongs to, handed to it at construction (no globals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class PendingProduct:
    """A row-parallel layer's product, not yet computed: ``TPGroup.all_reduce_norm`` computes it together
    with the all-reduce and the norm after it, in one kernel (``tp_fuse_matmul``)."""

    x: torch.Tensor  # (rows, in) of this rank's shard; gate | up (rows, 2 in) when gated
    weight: torch.Tensor  # (out, in)
    bias: torch.Tensor | None  # rank 0's only
    gated: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        """The output's: (rows, out features)."""
        return (self.x.shape[0], self.weight.shape[0])


@dataclass(frozen=True)
class NormedInput:
    """A column-parallel layer's input, summed over the ranks but not yet RMS-normed: the layer norms it on
    the skinny kernel's loads from the row's sum of squares, computed already (``tp_fuse_matmul``)."""

    h: torch.Tensor  # (rows, hidden): the sum over the ranks plus the residual
    squares: torch.Tensor  # float32 (rows, parts): h's squares summed over blocks of columns
    weight: torch.Tensor  # the norm's
    eps: float


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

    def partial_out(
        self, rows: int, cols: int, dtype: torch.dtype, first: bool = False
    ) -> torch.Tensor | None:
        """Where a row-parallel layer should write its (rows, cols) partial sums: a slot of the fused
        all-reduce (``all_reduce_norm`` then reduces it in one kernel with the norm after it), or None for
        a fresh tensor. ``first``: the forward's first partial sum (the embedding's)."""
        if self.size == 1 or self.fast is None:
            return None
        return self.fast.slot(rows, cols, dtype, first)

    def defers(self, rows: int, cols: int, dtype: torch.dtype) -> bool:
        """Whether a row-parallel layer should hand back a ``PendingProduct`` for a (rows, cols) output."""
        return self.size > 1 and self.fast is not None and self.fast.takes_product(rows, cols, dtype)

    def all_reduce_norm(
        self,
        x: torch.Tensor | PendingProduct,
        residual: torch.Tensor | None,
        norm: nn.Module,
        lazy: bool = False,
    ) -> tuple[torch.Tensor | NormedInput, torch.Tensor]:
        """``norm`` (an RMSNorm with its residual add) of ``x`` summed over the group: ``(normed, sum +
        residual)``, the sum itself when ``residual`` is None. One kernel when ``x`` is a slot of
        ``partial_out``, else the all-reduce and then the norm. A ``PendingProduct`` is computed, summed
        and added to the residual in one kernel, and with ``lazy`` (for a column-parallel layer next)
        the norm is left to the next layer: ``(NormedInput, sum + residual)``."""
        if isinstance(x, PendingProduct):
            h, squares = self.fast.product_all_reduce(x, residual)
            return (NormedInput(h, squares, norm.weight, norm.eps) if lazy else norm(h)[0]), h
        if self.size > 1 and self.fast is not None and self.fast.holds(x):
            return self.fast.all_reduce_norm(x, residual, norm.weight, norm.eps)
        x = self.all_reduce(x)
        if residual is None:
            return norm(x)[0], x
        return norm(x, residual)

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
