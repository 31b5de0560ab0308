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

With ``fuse_matmul`` as well, the buffer ends in two receive buffers for ``product_all_reduce``: the
row-parallel layer's product, the sum over the ranks and the residual add in one kernel, each rank
writing its partial sums into every rank's receive buffer (kernels/skinny_allreduce.py; the norm is then done on the next product's loads). The two alternate: a
receive buffer is written again only after every rank has passed another all-reduce (each of which
waits for every rank's data), by which time each rank has emptied it; the forward's first all-reduce
(the embedding's, through the slots) separates forwards, so each forward starts at buffer 0.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

DEFAULT_MAX_BYTES = 4 << 20  # a decode step of 512 rows of 4096 bf16 values; one-shot suits small messages

# Buffers this process has rendezvoused. PyTorch numbers its symmetric-memory exchanges per process, so a
# second engine whose ranks 1.. are fresh processes would wait for keys they never write (measured: a
# 60 s store timeout on two H200s); ``resolve`` (engine/resolve.py, ``Facts.symm_mem_used``) keeps
# rank 0 from trying.
rendezvous_count = 0
SLOTS = 3
RECEIVE_BUFFERS = 2
# Products summed in their own kernel (fuse_matmul) for up to this many rows: the last programs sum row
# after row, and on two H200s o_proj then gate_up at 2 rows took 46.7 µs against 44.6 with the fused
# all-reduce apart (at 1 row 34.9 against 37.5; scripts/allreduce_probe.py --matmul).
MATMUL_MAX_ROWS = 1


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
        fuse_matmul: bool = False,
    ):
        import torch.distributed._symmetric_memory as symm_mem

        from llmbench.kernels.allreduce_norm import MAX_PROGRAMS, MAX_ROWS, mark_empty

        if fuse_matmul and not fuse_norm:
            raise ValueError("fuse_matmul builds on fuse_norm")
        self.group_name = group.group_name
        self.fuse_norm = fuse_norm
        self.fuse_matmul = fuse_matmul
        # larger steps take the one-shot all-reduce and the norm apart (kernels/allreduce_norm.py says why)
        self.fused_max_rows = MAX_ROWS if fused_max_rows is None else fused_max_rows
        self.capacity = max_bytes // dtype.itemsize  # elements of one message (and of one slot)
        slots = SLOTS if fuse_norm else 0
        receive = RECEIVE_BUFFERS if fuse_matmul else 0
        # [message | slot 0 | slot 1 | slot 2 | flags | receive 0 | receive 1]; the flags are int32,
        # counted here in dtype elements
        self.world = world = dist.get_world_size(group)
        flag_elems = -(-MAX_PROGRAMS * world * 4 // dtype.itemsize) if fuse_norm else 0
        receive_at = self.capacity * (1 + slots) + flag_elems
        self.buffer = symm_mem.empty(receive_at + self.capacity * receive, dtype=dtype, device=device)
        self.buffer.zero_()
        mark_empty(self.buffer[receive_at:])  # every receive buffer empty (kernels/skinny_allreduce.py)
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
            self.receive_addrs = [addresses(receive_at + self.capacity * i) for i in range(receive)]
            self._receive_next = 0
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
        if first:
            self._receive_next = 0
        return self.slots[self._rotation.take(first)][: rows * cols].view(rows, cols)

    def takes_product(self, rows: int, cols: int, dtype: torch.dtype) -> bool:
        """Whether ``product_all_reduce`` takes a (rows, cols) product of ``dtype``."""
        return (
            self.fuse_matmul
            and dtype == self.buffer.dtype
            and rows <= MATMUL_MAX_ROWS
            and self.world * rows * cols <= self.capacity
        )

    def product_all_reduce(self, p: Any, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """A ``PendingProduct`` (layers/parallel.py) computed, summed over the group and added to the
        residual in one kernel: ``(sum + residual, its squares summed in blocks)``."""
        from llmbench.kernels.skinny_allreduce import skinny_matmul_allreduce

        j, self._receive_next = self._receive_next, self._receive_next ^ 1
        return skinny_matmul_allreduce(
            p.x, p.weight, p.bias, self.receive_addrs[j], self.rank, residual, gated=p.gated
        )

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
