"""The one-shot all-reduce with the decode step's seams fused in: ``tuning.tp_fuse_norm``, ``tp_fuse_matmul``.

Besides the one-shot message area, the buffer holds ``SLOTS`` slots where row-parallel layers (and the
embedding) write their partial sums directly (``partial_buffer`` hands one out as a ``PartialBuffer``),
and ``all_reduce_norm`` reduces a slot and applies the RMSNorm that follows in one Triton kernel
(kernels/allreduce_norm.py): no copy, no separate norm.

With ``fuse_matmul`` the buffer ends in ``RECEIVE_BUFFERS`` receive buffers for ``product_all_reduce``:
the row-parallel layer's product, the sum over the ranks and the residual add in one kernel, each rank
writing its partial sums into every rank's receive buffer (kernels/skinny_allreduce.py; the norm is then
done on the next product's loads).

Which buffer: the caller names it, and the rule is that no buffer serves two reductions in a row. A
rank may write a buffer again only once every peer has read what it last held there; every reduction
waits for every rank (its data, or its arrival), so a rank that has passed one reduction since knows
that its peers have finished the one before. The fused decode gives each seam a buffer of its own kind
(models/fused_decode.py: slot 2 for the embedding, then slot or receive buffer 0 after attention and
1 after the MLP), which alternate by the model's structure, whatever the number of layers and across
forwards, and under CUDA graphs too (a replay repeats the captured order). ``all_reduce_norm`` and
``product_all_reduce`` check the rule and raise where it is broken.

``[message | slot 0 | slot 1 | slot 2 | flags | receive 0 | receive 1]``, one rendezvous (symmetric.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from llmbench.distributed.communicator import PartialBuffer, Product
from llmbench.distributed.one_shot import DEFAULT_MAX_BYTES, OneShotAllReduce
from llmbench.distributed.symmetric import PeerBuffer
from llmbench.kernels.allreduce_norm import MAX_PROGRAMS, MAX_ROWS, allreduce_norm, mark_empty
from llmbench.kernels.skinny_allreduce import skinny_matmul_allreduce

SLOTS = 3
RECEIVE_BUFFERS = 2
# Products summed in their own kernel (fuse_matmul) for up to this many rows: the last programs sum row
# after row, and on two H200s o_proj then gate_up at 2 rows took 46.7 µs against 44.6 with the fused
# all-reduce apart (at 1 row 34.9 against 37.5; devtools/allreduce_probe.py --matmul).
MATMUL_MAX_ROWS = 1


class Layout(NamedTuple):
    """Where each part of the buffer starts, in values of the model dtype."""

    capacity: int  # values of one message, and of one slot or receive buffer
    flags: int  # the int32 flags of the fused all-reduce's barrier
    receive_at: int
    receive_buffers: int

    @classmethod
    def of(cls, capacity: int, world: int, dtype: torch.dtype, fuse_matmul: bool) -> Layout:
        flag_values = -(-MAX_PROGRAMS * world * 4 // dtype.itemsize)  # int32 flags counted in dtype values
        flags = capacity * (1 + SLOTS)
        return cls(capacity, flags, flags + flag_values, RECEIVE_BUFFERS if fuse_matmul else 0)

    @property
    def numel(self) -> int:
        return self.receive_at + self.capacity * self.receive_buffers

    def slot(self, s: int) -> int:
        return self.capacity * (1 + s)

    def receive(self, i: int) -> int:
        return self.receive_at + self.capacity * i


class FusedOneShot(OneShotAllReduce):
    def __init__(
        self,
        group: dist.ProcessGroup | None,
        peers: PeerBuffer,
        layout: Layout,
        fused_max_rows: int = MAX_ROWS,
    ) -> None:
        super().__init__(group, peers, layout.capacity)
        self.fuses_norm = True
        self.fuses_product = layout.receive_buffers > 0
        # larger steps take the one-shot all-reduce and the norm apart (kernels/allreduce_norm.py says why)
        self.max_fused_rows = fused_max_rows
        self.slots = [self.buffer[layout.slot(s) :][: self.capacity] for s in range(SLOTS)]
        self.slot_addrs = [peers.addresses(layout.slot(s)) for s in range(SLOTS)]
        self.flag_addrs = peers.addresses(layout.flags)
        self.receive_addrs = [peers.addresses(layout.receive(i)) for i in range(layout.receive_buffers)]
        self._last: tuple[str, int] | None = None  # the buffer of the latest reduction

    @classmethod
    def over(  # type: ignore[override]
        cls,
        group: dist.ProcessGroup | None,
        dtype: torch.dtype,
        device: torch.device,
        max_bytes: int = DEFAULT_MAX_BYTES,
        *,
        fuse_matmul: bool = False,
        fused_max_rows: int = MAX_ROWS,
    ) -> FusedOneShot:
        """Set up on every rank of ``group`` together (one rendezvous); no group: one rank, in ordinary
        memory (the fused kernels then run with no peers, on the CPU under the Triton interpreter)."""
        world = dist.get_world_size(group) if group is not None else 1
        layout = Layout.of(max_bytes // dtype.itemsize, world, dtype, fuse_matmul)

        def prepare(buffer: torch.Tensor) -> None:  # every receive buffer empty (kernels/skinny_allreduce.py)
            mark_empty(buffer[layout.receive_at :])

        peers = PeerBuffer.of(group, layout.numel, dtype, device, prepare)
        comm = cls(group, peers, layout, fused_max_rows)
        peers.barrier()  # every rank's buffer exists before anyone reads a peer's
        return comm

    def partial_buffer(self, slot: int, rows: int, cols: int, dtype: torch.dtype) -> PartialBuffer | None:
        if not 0 <= slot < SLOTS:
            raise ValueError(f"Unsupported slot {slot}. Supported: {list(range(SLOTS))}")
        if dtype != self.buffer.dtype or rows > self.max_fused_rows or rows * cols > self.capacity:
            return None
        return PartialBuffer(slot, self.slots[slot][: rows * cols].view(rows, cols))

    def all_reduce_norm(
        self, buf: PartialBuffer, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._reducing("slot", buf.slot)
        rows_cols = (buf.tensor.shape[0], buf.tensor.shape[1])
        return allreduce_norm(
            self.slot_addrs[buf.slot], self.flag_addrs, self.peers.rank, rows_cols, buf.tensor.dtype,
            residual, weight, eps,
        )  # fmt: skip

    def takes_product(self, rows: int, cols: int, dtype: torch.dtype) -> bool:
        return (
            self.fuses_product
            and dtype == self.buffer.dtype
            and rows <= MATMUL_MAX_ROWS
            and self.peers.world * rows * cols <= self.capacity
        )

    def product_all_reduce(
        self, product: Product, buffer: int, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.fuses_product:
            return super().product_all_reduce(product, buffer, residual)
        self._reducing("receive buffer", buffer)
        return skinny_matmul_allreduce(
            product.x, product.weight, product.bias, self.receive_addrs[buffer], self.peers.rank, residual,
            gated=product.gated,
        )  # fmt: skip

    def _reducing(self, kind: str, index: int) -> None:
        if (kind, index) == self._last:
            raise RuntimeError(
                f"{kind} {index} reduced twice in a row: a slower rank may still read it while it is written "
                "again; consecutive reductions must go through different buffers"
            )
        self._last = (kind, index)
