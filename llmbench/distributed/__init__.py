"""What crosses tensor-parallel ranks: communicators behind one typed interface.

``Communicator`` (communicator.py) is the interface: the sum and the gather over a group, and the fused
operations of decode steps with their buffer handles. Implementations:

- ``TorchCommunicator``: torch.distributed (NCCL on CUDA, gloo on the CPU); without a group, one rank;
- ``OneShotAllReduce`` (one_shot.py): small messages summed by one kernel over symmetric memory;
- ``FusedOneShot`` (fused.py): that, plus the all-reduce fused with the RMSNorm after it and, optionally,
  with the row-parallel product before it.

The communication kernels live with the other kernels (kernels/allreduce_norm.py,
kernels/skinny_allreduce.py): the skinny matmul's kernel ends in the fused all-reduce's summing code, so
they are one family. Process launch and rendezvous are the engine's (engine/tp.py); this package starts
nothing, it is handed a process group. Layers see a communicator only as ``Collectives``
(layers/parallel.py); the fused operations are for the fused decode (models/fused_decode.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from llmbench.distributed.communicator import (
    Communicator,
    PartialBuffer,
    Product,
    TorchCommunicator,
    single_rank,
)

ALL_REDUCES = ("nccl", "gloo", "symm_mem")  # the first two: torch.distributed's, on GPUs and on the CPU

__all__ = [
    "ALL_REDUCES",
    "Communicator",
    "PartialBuffer",
    "Product",
    "TorchCommunicator",
    "make_communicator",
    "single_rank",
]


def make_communicator(
    all_reduce: str,
    group: dist.ProcessGroup,
    dtype: torch.dtype,
    device: torch.device,
    *,
    fuse_norm: bool,
    fuse_matmul: bool,
) -> Communicator:
    """The communicator of ``group`` for the resolved ``tuning.tp_all_reduce`` and fusions; every rank
    of the group calls this together (the one-shot ones rendezvous)."""
    if all_reduce not in ALL_REDUCES:
        raise ValueError(f"Unsupported all-reduce: {all_reduce!r}. Supported: {list(ALL_REDUCES)}")
    if fuse_matmul and not fuse_norm:
        raise ValueError("fuse_matmul builds on fuse_norm")
    if all_reduce in ("nccl", "gloo"):
        if fuse_norm:
            raise ValueError("the fused all-reduce needs the one-shot all-reduce ('symm_mem')")
        return TorchCommunicator(group)
    if fuse_norm:
        from llmbench.distributed.fused import FusedOneShot

        return FusedOneShot.over(group, dtype, device, fuse_matmul=fuse_matmul)
    from llmbench.distributed.one_shot import OneShotAllReduce

    return OneShotAllReduce.over(group, dtype, device)
