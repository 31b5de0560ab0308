"""All-reduce of small tensors in one kernel over NVLink: PyTorch's symmetric memory, one-shot.

At batch 1 a tensor-parallel decode step all-reduces a few KB twice per layer (72 times a step for
qwen3-8b). NCCL's latency for such messages, even replayed from a CUDA graph, is paid on every one of
them. Here every rank copies its part into a buffer that all ranks of the group can read (allocated and
exchanged once, symmetric.py), and one kernel per rank waits for its peers, reads their buffers over
NVLink and sums them: no NCCL, no proxy, one launch.

Only for CUDA and only for messages up to ``max_bytes``; larger ones (prefill) go through NCCL. It uses
no NVLink multicast (the ``multimem`` operations), which the GPU machines here keep switched off.
Selected with ``tuning.tp_all_reduce="symm_mem"``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from llmbench.distributed.communicator import TorchCommunicator
from llmbench.distributed.symmetric import PeerBuffer

DEFAULT_MAX_BYTES = 4 << 20  # a decode step of 512 rows of 4096 bf16 values; one-shot suits small messages


class OneShotAllReduce(TorchCommunicator):
    """The one-shot all-reduce for messages that fit its buffer, torch.distributed's for the others.

    The buffer starts with the message area (``capacity`` values); fused.py lays out more after it."""

    def __init__(self, group: dist.ProcessGroup | None, peers: PeerBuffer, capacity: int) -> None:
        super().__init__(group)
        self.name = "symm_mem"
        self.peers = peers
        self.buffer = peers.buffer
        self.capacity = capacity  # values of one message
        self._group_name = group.group_name if group is not None else ""

    @classmethod
    def over(
        cls,
        group: dist.ProcessGroup | None,
        dtype: torch.dtype,
        device: torch.device,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> OneShotAllReduce:
        """Set up on every rank of ``group`` together (one rendezvous); no group: one rank, in ordinary
        memory."""
        capacity = max_bytes // dtype.itemsize
        peers = PeerBuffer.of(group, capacity, dtype, device)
        comm = cls(group, peers, capacity)
        peers.barrier()  # every rank's buffer exists before anyone reads a peer's
        return comm

    def fits(self, x: torch.Tensor) -> bool:
        return x.dtype == self.buffer.dtype and x.numel() <= self.capacity and x.is_contiguous()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the group: one-shot as a new tensor where it fits, else in place."""
        if self.size == 1 or not self.fits(x):
            return super().all_reduce(x)
        return self._one_shot(x)

    def _one_shot(self, x: torch.Tensor) -> torch.Tensor:
        part = self.buffer[: x.numel()]
        part.copy_(x.view(-1))
        return torch.ops.symm_mem.one_shot_all_reduce(part, "sum", self._group_name).view(x.shape)
