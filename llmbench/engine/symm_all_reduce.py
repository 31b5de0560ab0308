"""All-reduce of small tensors in one kernel over NVLink: PyTorch's symmetric memory, one-shot.

At batch 1 a tensor-parallel decode step all-reduces a few KB twice per layer (72 times a step for
qwen3-8b). NCCL's latency for such messages, even replayed from a CUDA graph, is paid on every one of
them. Here every rank copies its part into a buffer that all ranks of the group can read (allocated and
exchanged once, ``torch.distributed._symmetric_memory``), and one kernel per rank waits for its peers,
reads their buffers over NVLink and sums them: no NCCL, no proxy, one launch.

Only for CUDA and only for messages up to ``max_bytes``; larger ones (prefill) go through NCCL. It uses
no NVLink multicast (the ``multimem`` operations), which the GPU machines here keep switched off.
Selected with ``tp_all_reduce="symm_mem"``.
"""

from __future__ import annotations

from typing import Any

import torch

DEFAULT_MAX_BYTES = 4 << 20  # a decode step of 512 rows of 4096 bf16 values; one-shot suits small messages

# Buffers this process has rendezvoused. PyTorch numbers its symmetric-memory exchanges per process, so a
# second engine whose ranks 1.. are fresh processes would wait for keys they never write (measured: a
# 60 s store timeout on two H200s); ``tp.spawned_config`` keeps rank 0 from trying.
rendezvous_count = 0


class OneShotAllReduce:
    def __init__(
        self, group: Any, dtype: torch.dtype, device: torch.device, max_bytes: int = DEFAULT_MAX_BYTES
    ):
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name = group.group_name
        self.buffer = symm_mem.empty(max_bytes // dtype.itemsize, dtype=dtype, device=device)
        self.buffer.zero_()
        global rendezvous_count
        rendezvous_count += 1
        handle = symm_mem.rendezvous(self.buffer, self.group_name)
        if handle is None:
            raise RuntimeError("symmetric memory: the rendezvous of the all-reduce buffer failed")
        handle.barrier()  # every rank's buffer exists before anyone reads a peer's

    def fits(self, x: torch.Tensor) -> bool:
        return x.dtype == self.buffer.dtype and x.numel() <= self.buffer.numel() and x.is_contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the group, as a new tensor of ``x``'s shape."""
        part = self.buffer[: x.numel()]
        part.copy_(x.view(-1))
        return torch.ops.symm_mem.one_shot_all_reduce(part, "sum", self.group_name).view(x.shape)
