"""The pieces of asynchronous scheduling that do not need the engine's state.

Step N+1 is scheduled, built and launched while step N still runs on the device; only then does the
host wait for N's sampled ids. Each sequence that samples in a step gets a placeholder token
(``PENDING``) at once, so the scheduler sees the length it will have; the next step's input for that
position is copied on the device from the ids just sampled (``StepArrays.fill_rows``; under tensor
parallelism rank 0 broadcasts them on the device), and the host writes the real id over the placeholder
when it arrives. A sequence that ends (EOS) at step N has already been scheduled into N+1: that one
wasted row is the price. Block hashes and prefix-cache registration only ever see real ids: ``advance``
(which registers computed blocks) runs after the previous step's ids are in, and prefix matching never
hashes the block holding a sequence's last token, which is where a placeholder always sits.

The loop itself is ``LLMEngine._step_async``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llmbench.engine.outputs import StepStats
from llmbench.engine.scheduler import ScheduledBatch
from llmbench.engine.sequence import Sequence, SequenceStatus
from llmbench.engine.step_inputs import StepArrays

PENDING = -1  # placeholder id of a token sampled on the device but not yet on the host


@dataclass
class InFlight:
    """A step launched on the device whose sampled ids the host has not read yet."""

    batch: ScheduledBatch
    sampling: list[Sequence]  # sequences that sample in it, in the order of ``ids``
    stats: StepStats
    ids: torch.Tensor  # (N,) int64 on the device: the next step's inputs are copied from here
    host: torch.Tensor  # (N,) the same ids, copied to (pinned) host memory
    event: torch.cuda.Event | None  # recorded after that copy; None on the CPU

    @classmethod
    def launch(
        cls,
        batch: ScheduledBatch,
        sampling: list[Sequence],
        stats: StepStats,
        ids: torch.Tensor,
        copies: HostCopies,
    ) -> InFlight:
        """Start copying ``ids`` to the host without waiting for them."""
        if ids.device.type != "cuda":
            return cls(batch, sampling, stats, ids, ids, None)
        host, event = copies.copy(ids)
        return cls(batch, sampling, stats, ids, host, event)

    def wait(self) -> list[int]:
        """The sampled ids, once they are on the host."""
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


class HostCopies:
    """Pinned host buffers and CUDA events for the steps' sampled ids, used in turn. A copy to the host is
    asynchronous only into pinned memory, and allocating that (and an event) every step costs the host
    tens of microseconds. At most two steps' ids are awaited at once (the one just launched, the one being
    read), so three in turn never hand out a buffer whose ids are still to be read."""

    TURNS = 3

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor | None] = [None] * self.TURNS
        self._events: list[torch.cuda.Event | None] = [None] * self.TURNS
        self._turn = 0

    def copy(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
        """Start copying ``ids`` (N,) to a pinned host buffer; the buffer's view, and an event recorded
        after the copy."""
        turn = self._turn
        self._turn = (turn + 1) % self.TURNS
        n = ids.shape[0]
        buf = self._buffers[turn]
        if buf is None or buf.shape[0] < n or buf.dtype != ids.dtype:
            buf = self._buffers[turn] = torch.empty(max(n, 256), dtype=ids.dtype, pin_memory=True)
        event = self._events[turn]
        if event is None:
            event = self._events[turn] = torch.cuda.Event()
        host = buf[:n]
        host.copy_(ids, non_blocking=True)
        event.record()
        return host, event


def sampling_rows(batch: ScheduledBatch) -> list[Sequence]:
    """The sequences whose step ends in a sample (``Scheduler.advance``'s answer, before it runs)."""
    samples = batch.counts().samples
    if samples.all():  # a decode step: every sequence samples
        return list(batch.seqs)
    seqs = batch.seqs
    return [seqs[i] for i in np.flatnonzero(samples).tolist()]


def set_token_fill(batch: ScheduledBatch, arrays: StepArrays) -> None:
    """Name this step's placeholder rows and where the last samples hold their tokens."""
    c = batch.counts()
    at = (c.pending >= c.computed) & (c.pending < c.computed + c.new)  # -1 (none) is never in range
    if at.any():
        arrays.fill_rows = (arrays.query_start_loc[:-1][at] + (c.pending - c.computed)[at]).astype(np.int64)
        arrays.fill_src = c.pending_src[at]


def mark_pending(sampling: list[Sequence]) -> None:
    """Give each sequence that sampled (and did not just end) its placeholder token."""
    finished = SequenceStatus.FINISHED
    for j, seq in enumerate(sampling):
        if seq.status is not finished:
            ids = seq.token_ids
            seq.pending_pos, seq.pending_src = len(ids), j
            ids.append(PENDING)
