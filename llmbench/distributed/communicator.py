"""The interface every communicator offers, its buffer handles, and the torch.distributed one.

A ``Communicator`` sums and gathers tensors over the ranks of one tensor-parallel group (the two
collectives the layers use, ``layers/parallel.py`` ``Collectives``), and may offer the fused operations
of decode steps that the fused decode (models/fused_decode.py) asks for:

- ``partial_buffer`` + ``all_reduce_norm``: a layer writes its partial sums into a buffer the
  communicator hands out (a ``PartialBuffer``: which slot, and the tensor to write), and one kernel sums
  it over the ranks, adds the residual and applies the RMSNorm after it;
- ``takes_product`` + ``product_all_reduce``: a row-parallel layer's product (a ``Product``: its input
  and weights, not yet computed) is computed, summed over the ranks and added to the residual in one
  kernel, which also sums the result's squares for the norm that the next product does on its loads.

A communicator that offers neither says so (``partial_buffer`` returns None, ``takes_product`` False),
and the caller then runs the plain sequence: a new tensor, ``all_reduce``, the norm.

``TorchCommunicator`` is torch.distributed's all-reduce and all-gather (NCCL on CUDA, gloo on the CPU);
with no group it stands for a single rank (tp=1), whose sums are its own tensors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch
import torch.distributed as dist


class PartialBuffer(NamedTuple):
    """A buffer handed to a layer for its (rows, cols) partial sums, to be reduced by ``all_reduce_norm``."""

    slot: int  # which of the communicator's buffers
    tensor: torch.Tensor  # (rows, cols): where the layer writes


class Product(NamedTuple):
    """A row-parallel layer's product, not yet computed: ``x @ weight.T (+ bias)`` on this rank."""

    x: torch.Tensor  # (rows, in) of this rank's shard; gate | up (rows, 2 in) when gated
    weight: torch.Tensor  # (out, in)
    bias: torch.Tensor | None  # rank 0's only, so that it counts once in the sum
    gated: bool  # x is the gated MLP's gate | up: the SiLU-and-multiply done on the product's loads


class Communicator(ABC):
    """Sums and gathers over the ranks of one tensor-parallel group."""

    name: str  # what results record as the all-reduce: "single", "nccl", "gloo", "symm_mem"
    rank: int
    size: int
    group: dist.ProcessGroup | None  # the torch.distributed group (None for a single rank)
    fuses_norm: bool = False  # offers partial_buffer + all_reduce_norm
    fuses_product: bool = False  # offers product_all_reduce
    max_fused_rows: int = 0  # the most rows a fused operation takes (0: none)

    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the ranks, in place or as a new tensor: use the result."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` concatenated along the last dimension, in rank order."""

    def partial_buffer(self, slot: int, rows: int, cols: int, dtype: torch.dtype) -> PartialBuffer | None:
        """Buffer ``slot`` for a layer's (rows, cols) partial sums of ``dtype``, or None where this
        communicator has none that fits (then write a new tensor and call ``all_reduce``)."""
        return None

    def all_reduce_norm(
        self, buf: PartialBuffer, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The partial sums in ``buf`` summed over the ranks, plus ``residual``, RMS-normed with ``weight``
        in one kernel: ``(normed, sum + residual)``."""
        raise TypeError(f"the {self.name} communicator hands out no buffers to reduce (partial_buffer)")

    def takes_product(self, rows: int, cols: int, dtype: torch.dtype) -> bool:
        """Whether ``product_all_reduce`` takes a product of (rows, cols) outputs of ``dtype``."""
        return False

    def product_all_reduce(
        self, product: Product, buffer: int, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``product`` computed, summed over the ranks and added to ``residual`` in one kernel, through
        receive buffer ``buffer``: ``(sum + residual, its float32 squares summed in blocks of columns)``."""
        raise TypeError(f"the {self.name} communicator computes no products (takes_product)")


class TorchCommunicator(Communicator):
    """torch.distributed's collectives over ``group``; with no group, a single rank."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        if group is None:
            self.name, self.rank, self.size = "single", 0, 1
        else:
            self.name = str(dist.get_backend(group))
            self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def single_rank() -> TorchCommunicator:
    """The communicator of tp=1: every sum is the rank's own tensor."""
    return TorchCommunicator(None)
