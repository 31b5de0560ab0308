"""Memory that every rank of a group can address: PyTorch's symmetric memory, rendezvoused once.

``PeerBuffer.rendezvous`` allocates one buffer per rank (``torch.distributed._symmetric_memory``), maps
every rank's into every process and hands back this rank's buffer with each rank's address of it;
the one-shot communicators (one_shot.py, fused.py) lay out their messages, slots and flags in it.
``PeerBuffer.local`` is the same for a group of one rank in ordinary memory: no symmetric memory, no
peers, so the fused kernels run over it on the CPU under the Triton interpreter (tests).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

# Buffers this process has rendezvoused. PyTorch numbers its symmetric-memory exchanges per process, so a
# second engine whose ranks 1.. are fresh processes would wait for keys they never write (measured: a
# 60 s store timeout on two H200s); ``resolve`` (engine/resolve.py, ``Facts.symm_mem_used``) keeps
# rank 0 from trying.
rendezvous_count = 0


def _nothing(buffer: torch.Tensor) -> None:
    pass


class PeerBuffer:
    """This rank's buffer, and each rank's address of its own (in rank order)."""

    def __init__(
        self, buffer: torch.Tensor, rank: int, bases: list[int], barrier: Callable[[], None]
    ) -> None:
        self.buffer = buffer
        self.rank = rank
        self.world = len(bases)
        self._bases = bases
        self._barrier = barrier

    @classmethod
    def rendezvous(
        cls,
        group_name: str,
        numel: int,
        dtype: torch.dtype,
        device: torch.device,
        prepare: Callable[[torch.Tensor], None] = _nothing,
    ) -> PeerBuffer:
        """Every rank of the group calls this together: a zeroed buffer of ``numel`` values on each, set up
        by ``prepare`` before any peer can see it."""
        import torch.distributed._symmetric_memory as symm_mem

        buffer = symm_mem.empty(numel, dtype=dtype, device=device)
        buffer.zero_()
        prepare(buffer)
        global rendezvous_count
        rendezvous_count += 1
        handle = symm_mem.rendezvous(buffer, group_name)
        if handle is None:
            raise RuntimeError("symmetric memory: the rendezvous of the all-reduce buffer failed")
        return cls(buffer, handle.rank, [int(p) for p in handle.buffer_ptrs], handle.barrier)

    @classmethod
    def local(
        cls,
        numel: int,
        dtype: torch.dtype,
        device: torch.device,
        prepare: Callable[[torch.Tensor], None] = _nothing,
    ) -> PeerBuffer:
        """A group of one rank, in ordinary memory."""
        buffer = torch.zeros(numel, dtype=dtype, device=device)
        prepare(buffer)
        return cls(buffer, 0, [buffer.data_ptr()], lambda: None)

    @classmethod
    def of(
        cls,
        group: dist.ProcessGroup | None,
        numel: int,
        dtype: torch.dtype,
        device: torch.device,
        prepare: Callable[[torch.Tensor], None] = _nothing,
    ) -> PeerBuffer:
        """``rendezvous`` over ``group``, or ``local`` where there is none."""
        if group is None:
            return cls.local(numel, dtype, device, prepare)
        return cls.rendezvous(group.group_name, numel, dtype, device, prepare)

    def addresses(self, offset: int) -> torch.Tensor:
        """int64 (world,): every rank's address of element ``offset`` of its buffer."""
        size = self.buffer.element_size()
        return torch.tensor(
            [b + offset * size for b in self._bases], dtype=torch.int64, device=self.buffer.device
        )

    def barrier(self) -> None:
        """Wait until every rank gets here (after setting up its buffer, before anyone reads a peer's)."""
        self._barrier()
