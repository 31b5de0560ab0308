"""Which sequences run in the next step, and how many of their tokens.

Policies (engine toggles):
- ``chunked_prefill=False``: prefill first. Whole waiting prompts are admitted while they fit the token
  budget, ``max_num_seqs`` and the KV pool; a step is all prefill, or, when nothing can be admitted,
  all decode.
- ``chunked_prefill=True``: running sequences first (a decode is one token; a prompt part-way through
  prefill takes its next chunk), then waiting prompts fill what is left of the token budget, so
  prefill chunks and decodes mix in one step.
- ``continuous_batching=False``: static batches. Admission is open only while a batch is forming; once
  it has started decoding no request joins until every member has finished.

When the KV pool runs out, the newest running sequence is preempted by recomputation: its blocks are
freed and it goes back to the front of the queue, keeping the tokens it has generated.

Each batch says what kept more work out of it (``ScheduledBatch.limit``): ``kv_blocks`` (a request found
no room in the KV pool, or a sequence was preempted), ``max_num_seqs`` (the running set was full),
``max_num_batched_tokens`` (the step's token budget ran out before every running sequence or waiting
request had its tokens), ``static_batch`` (continuous_batching=False: the batch was closed), or ``none``.
The first of these met while filling the step is recorded; a preemption overrides the others.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

import numpy as np

from llmbench.engine.block_manager import BlockManager, SlabAllocator
from llmbench.engine.sequence import Sequence, SequenceStatus

LIMIT_NONE = "none"
LIMIT_KV = "kv_blocks"
LIMIT_SEQS = "max_num_seqs"
LIMIT_TOKENS = "max_num_batched_tokens"
LIMIT_STATIC = "static_batch"
BATCH_LIMITS = (LIMIT_NONE, LIMIT_KV, LIMIT_SEQS, LIMIT_TOKENS, LIMIT_STATIC)


class BatchCounts(NamedTuple):
    """A batch's per-sequence counters as scheduled, read from its sequences in one pass: every use of them
    before the step (its stats, inputs, fill rows, sampling rows) reads these arrays rather than each
    sequence again. (B,) int64 each."""

    computed: np.ndarray  # tokens with K/V in the cache
    total: np.ndarray  # tokens of the sequence (a placeholder of asynchronous scheduling included)
    prompt: np.ndarray
    new: np.ndarray  # this step's query lengths
    pending: np.ndarray  # position of the sequence's placeholder token, -1 for none
    pending_src: np.ndarray  # the placeholder's row among the last step's sampled ids
    samples: np.ndarray  # (B,) bool: the step reaches the sequence's last token, so its logits are sampled

    @classmethod
    def of(cls, seqs: list[Sequence], num_new_tokens: list[int]) -> BatchCounts:
        n = len(seqs)
        flat = np.fromiter(
            chain.from_iterable(
                (
                    s.num_computed_tokens,
                    len(s.token_ids),
                    s.num_prompt_tokens,
                    -1 if s.pending_pos is None else s.pending_pos,
                    s.pending_src or 0,
                )
                for s in seqs
            ),
            dtype=np.int64,
            count=5 * n,
        )
        cols = flat.reshape(n, 5).T.copy()  # each counter contiguous: positions go to kernels as they are
        new = np.asarray(num_new_tokens, dtype=np.int64)
        return cls(cols[0], cols[1], cols[2], new, cols[3], cols[4], cols[0] + new == cols[1])


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]  # per sequence: this step's query length
    num_preemptions: int = 0
    prefix_hit_tokens: int = 0
    newly_scheduled: list[Sequence] = field(default_factory=list)
    limit: str = LIMIT_NONE  # what kept more work out of this step (module docstring)
    _counts: BatchCounts | None = field(default=None, repr=False)

    def limited_by(self, reason: str) -> None:
        if self.limit == LIMIT_NONE:
            self.limit = reason

    def counts(self) -> BatchCounts:
        """The sequences' counters as scheduled, read once; valid until ``Scheduler.advance`` moves them."""
        if self._counts is None:
            self._counts = BatchCounts.of(self.seqs, self.num_new_tokens)
        return self._counts

    def token_counts(self) -> tuple[int, int]:
        """(prefill tokens, decode tokens); valid until ``Scheduler.advance`` moves the counters. A decode
        is a running sequence's one next token; a sequence admitted in this step (the batch's last ones) is
        prefilled, even where a preempted one's recompute is down to one token (the prefix cache held the
        rest), so that a step of admissions alone is a prefill step under every policy."""
        c = self.counts()
        running = len(self.seqs) - len(self.newly_scheduled)
        decoding = (c.new[:running] == 1) & (c.computed[:running] >= c.prompt[:running])
        decode = int(np.count_nonzero(decoding))
        return int(c.new.sum()) - decode, decode


def step_kind(prefill_tokens: int, decode_tokens: int) -> str:
    if prefill_tokens and decode_tokens:
        return "mixed"
    return "prefill" if prefill_tokens else "decode"


class Scheduler:
    def __init__(
        self,
        kv: BlockManager | SlabAllocator,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool,
        continuous_batching: bool,
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.continuous_batching = continuous_batching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._batch_open = True  # static batching: may requests still join the current batch?

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the queues (finished or aborted) and release its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)

    # -- scheduling ------------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        if not self.running:
            self._batch_open = True
        batch = ScheduledBatch([], [])
        budget = self.max_num_batched_tokens
        if self.chunked_prefill:
            budget = self._schedule_running(batch, budget)
            self._admit_waiting(batch, budget)
        else:
            self._admit_waiting(batch, budget)
            if not batch.seqs:
                self._schedule_running(batch, budget)
        if batch.num_preemptions:
            batch.limit = LIMIT_KV
        if not batch.seqs:
            return None
        if not self.continuous_batching and batch.token_counts()[1]:
            self._batch_open = False
        return batch

    def _may_admit(self, seq: Sequence) -> bool:
        # A preempted member of a static batch rejoins it; nobody else joins a closed batch.
        return self.continuous_batching or self._batch_open or seq.num_preemptions > 0

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> int:
        while self.waiting:
            if budget <= 0:
                batch.limited_by(LIMIT_TOKENS)
                break
            if len(self.running) >= self.max_num_seqs:
                batch.limited_by(LIMIT_SEQS)
                break
            seq = self.waiting[0]
            if not self._may_admit(seq):
                batch.limited_by(LIMIT_STATIC)
                break
            remaining = seq.num_tokens - self.kv.num_prefix_hit_tokens(seq)
            n = min(remaining, budget) if self.chunked_prefill else remaining
            # Without chunking, a prompt longer than the whole budget still runs, alone in its step.
            if n > budget and batch.seqs:
                batch.limited_by(LIMIT_TOKENS)
                break
            if not self.kv.admit(seq, n):
                batch.limited_by(LIMIT_KV)
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            batch.newly_scheduled.append(seq)
            batch.prefix_hit_tokens += seq.num_computed_tokens
            budget -= n
            if n < remaining:  # a chunk of the prompt: the budget holds no more of it
                batch.limited_by(LIMIT_TOKENS)
        return budget

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        running, grow = self.running, self.kv.grow
        seqs, counts = batch.seqs, batch.num_new_tokens
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            uncomputed = len(seq.token_ids) - seq.num_computed_tokens
            n = min(uncomputed, budget)
            if n < uncomputed:
                batch.limited_by(LIMIT_TOKENS)
            while not grow(seq, n):
                victim = running[-1]
                self._preempt(victim)
                batch.num_preemptions += 1
                if victim is seq:
                    return budget
            seqs.append(seq)
            counts.append(n)
            budget -= n
            i += 1
        if i < len(running):  # the budget ran out before every running sequence had its tokens
            batch.limited_by(LIMIT_TOKENS)
        return budget

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    # -- after the step ---------------------------------------------------------------------------

    def advance(self, batch: ScheduledBatch) -> list[Sequence]:
        """Count this step's tokens as computed; return the sequences whose step ends in a sample."""
        sampling = []
        finished = SequenceStatus.FINISHED
        commit = self.kv.commit
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            if seq.status is finished:  # asynchronous scheduling: it ended while this step was on the device
                continue
            seq.num_computed_tokens += n
            commit(seq)
            if seq.num_computed_tokens == len(seq.token_ids):
                sampling.append(seq)
        return sampling
