"""All-reduce of small tensors in one kernel over NVLink: PyTorch's symmetric memory, one-shot.

At batch 1 a tensor-parallel decode step all-reduces a few KB twice per layer (72 times a step for
qwen3-8b). NCCL's latency for such messages, even replayed from a CUDA graph, is paid on every one of
them. Here every rank copies its part into a buffer that all ranks of the group can read (allocated and
exchanged once, ``torch.distributed._symmetric_memory``), and one kernel per rank waits for its peers,
reads their buffers over NVLink and sums them: no NCCL, no proxy, one launch.

Only for CUDA and only for messages up to ``max_bytes``; larger ones (prefill) go through NCCL. It uses
no NVLink multicast (the ``multimem`` operations), which the GPU machines here keep switched off.
Selected with ``tp_all_reduce="symm_mem"``.

With ``fuse_norm`` the buffer also holds three slots where row-parallel layers write their partial sums
directly (``slot``), and ``all_reduce_norm`` reduces a slot and applies the RMSNorm that follows in one
Triton kernel (kernels/allreduce_norm.py): no copy, no separate norm. A slot is written again only after
every rank has passed at least one more barrier, so no rank overwrites what a peer may still be reading:
the first partial sum of a forward (the embedding's) takes slot 2, the others alternate 0, 1, 0, ...,
and every one of them is reduced, through a barrier, before the next is written.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

DEFAULT_MAX_BYTES = 4 << 20  # a decode step of 512 rows of 4096 bf16 values; one-shot suits small messages

# Buffers this process has rendezvoused. PyTorch numbers its symmetric-memory exchanges per process, so a
# second engine whose ranks 1.. are fresh processes would wait for keys they never write (measured: a
# 60 s store timeout on two H200s); ``tp.spawned_config`` keeps rank 0 from trying.
rendezvous_count = 0
SLOTS = 3


class SlotRotation:
    """Which of the three slots each partial sum of a forward is written to: 2 for the first, then 0, 1,
    0, 1, ... Every partial sum is reduced (a barrier of all ranks) before the next is written, so a
    slot written two or more partial sums after its last use has been read by every peer; a forward has
    at least three (embedding, then two per layer), so that holds across forwards too."""

    def __init__(self) -> None:
        self._next = 0

    def take(self, first: bool) -> int:
        if first:
            self._next = 0
            return 2
        slot, self._next = self._next, self._next ^ 1
        return slot


class OneShotAllReduce:
    def __init__(
        self,
        group: Any,
        dtype: torch.dtype,
        device: torch.device,
        max_bytes: int = DEFAULT_MAX_BYTES,
        fuse_norm: bool = False,
        fused_max_rows: int | None = None,
    ):
        import torch.distributed._symmetric_memory as symm_mem

        from llmbench.kernels.allreduce_norm import MAX_PROGRAMS, MAX_ROWS

        self.group_name = group.group_name
        self.fuse_norm = fuse_norm
        # larger steps take the one-shot all-reduce and the norm apart (kernels/allreduce_norm.py says why)
        self.fused_max_rows = MAX_ROWS if fused_max_rows is None else fused_max_rows
        self.capacity = max_bytes // dtype.itemsize  # elements of one message (and of one slot)
        slots = SLOTS if fuse_norm else 0
        # [message | slot 0 | slot 1 | slot 2 | flags]; the flags are int32, counted here in dtype elements
        world = dist.get_world_size(group)
        flag_elems = -(-MAX_PROGRAMS * world * 4 // dtype.itemsize) if fuse_norm else 0
        self.buffer = symm_mem.empty(self.capacity * (1 + slots) + flag_elems, dtype=dtype, device=device)
        self.buffer.zero_()
        global rendezvous_count
        rendezvous_count += 1
        handle = symm_mem.rendezvous(self.buffer, self.group_name)
        if handle is None:
            raise RuntimeError("symmetric memory: the rendezvous of the all-reduce buffer failed")
        self.rank = handle.rank
        if fuse_norm:
            size = dtype.itemsize
            bases = [int(p) for p in handle.buffer_ptrs]  # every rank's buffer, mapped into this process

            def addresses(offset: int) -> torch.Tensor:
                return torch.tensor([b + offset * size for b in bases], dtype=torch.int64, device=device)

            self.slots = [self.buffer[self.capacity * (1 + s) :][: self.capacity] for s in range(slots)]
            self.slot_addrs = [addresses(self.capacity * (1 + s)) for s in range(slots)]
            self.flag_addrs = addresses(self.capacity * (1 + slots))
            self._rotation = SlotRotation()
        handle.barrier()  # every rank's buffer exists before anyone reads a peer's

    def fits(self, x: torch.Tensor) -> bool:
        return x.dtype == self.buffer.dtype and x.numel() <= self.capacity and x.is_contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the group, as a new tensor of ``x``'s shape."""
        part = self.buffer[: x.numel()]
        part.copy_(x.view(-1))
        return torch.ops.symm_mem.one_shot_all_reduce(part, "sum", self.group_name).view(x.shape)

    def slot(self, rows: int, cols: int, dtype: torch.dtype, first: bool) -> torch.Tensor | None:
        """The next slot as a (rows, cols) tensor for a layer's partial sums, or None where none fits.
        ``first``: the forward's first partial sum (which restarts the rotation)."""
        if not self.fuse_norm or dtype != self.buffer.dtype:
            return None
        if rows > self.fused_max_rows or rows * cols > self.capacity:
            return None
        return self.slots[self._rotation.take(first)][: rows * cols].view(rows, cols)

    def holds(self, x: torch.Tensor) -> bool:
        return self._slot_of(x) is not None

    def _slot_of(self, x: torch.Tensor) -> int | None:
        if not self.fuse_norm:
            return None
        return next((i for i, slot in enumerate(self.slots) if slot.data_ptr() == x.data_ptr()), None)

    def all_reduce_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` (a slot) summed over the group, then the residual add and RMSNorm: ``(normed, sum +
        residual)``."""
        from llmbench.kernels.allreduce_norm import allreduce_norm

        s = self._slot_of(x)
        if s is None:
            raise ValueError("all_reduce_norm reduces a slot that slot() handed out")
        return allreduce_norm(
            self.slot_addrs[s], self.flag_addrs, self.rank, tuple(x.shape), x.dtype, residual, weight, eps
        )
