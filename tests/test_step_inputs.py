"""A step's flattened arrays against a token-by-token reference, for batches of prompts, chunks and decodes."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.engine.async_scheduling import sampling_rows, set_token_fill
from llmbench.engine.sampler import Sampler
from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.scheduler import ScheduledBatch
from llmbench.engine.sequence import Sequence
from llmbench.engine.step_inputs import BlockTables, build_step
from llmbench.engine.work import step_work


@st.composite
def batches(draw):
    """Sequences with some tokens computed and a block table covering the step's new ones (blocks drawn
    without repeats from a pool, as the block manager hands them out), and each one's new tokens."""
    bs = draw(st.sampled_from([1, 4, 16]))
    decode = draw(st.booleans())
    free = list(range(400))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rng.shuffle(free)
    seqs, counts = [], []
    for i in range(draw(st.integers(1, 6))):
        total = draw(st.integers(1, 70))
        new = 1 if decode else draw(st.integers(1, total))
        seq = Sequence(f"r{i}", rng.integers(0, 1000, size=total).tolist(), SamplingParams(), 0.0)
        seq.num_computed_tokens = total - new
        if draw(st.booleans()) and new > 1:  # a chunk: the prompt goes on past this step
            new -= draw(st.integers(1, new - 1))
        seq.block_table = [free.pop() for _ in range(-(-(seq.num_computed_tokens + new) // bs))]
        seqs.append(seq)
        counts.append(new)
    return seqs, counts, bs


def reference(seqs: list[Sequence], counts: list[int], bs: int):
    ids, pos, slots, lens, logits = [], [], [], [], []
    for seq, k in zip(seqs, counts, strict=True):
        for p in range(seq.num_computed_tokens, seq.num_computed_tokens + k):
            ids.append(seq.token_ids[p])
            pos.append(p)
            slots.append(seq.block_table[p // bs] * bs + p % bs)
        lens.append(seq.num_computed_tokens + k)
        if lens[-1] == seq.num_tokens:  # the step reaches the sequence's last token: it samples
            logits.append(len(ids) - 1)
    return ids, pos, slots, lens, logits


@settings(max_examples=150, deadline=None)
@given(batches(), st.booleans())
def test_build_step_matches_the_token_by_token_reference(batch, mirrored):
    seqs, counts, bs = batch
    step = build_step(seqs, counts, bs, BlockTables(max_blocks_per_seq=80) if mirrored else None)
    ids, pos, slots, lens, logits = reference(seqs, counts, bs)
    assert step.input_ids.tolist() == ids
    assert step.positions.tolist() == pos
    assert step.slot_mapping.tolist() == slots
    assert step.seq_lens.tolist() == lens
    assert step.logits_indices.tolist() == logits
    assert step.query_start_loc.tolist() == np.concatenate([[0], np.cumsum(counts)]).tolist()
    assert step.query_lens == counts
    for i, seq in enumerate(seqs):
        assert step.block_tables[i, : len(seq.block_table)].tolist() == seq.block_table
    for name in ("input_ids", "positions", "slot_mapping", "logits_indices"):
        assert getattr(step, name).dtype == np.int64, name
    for name in ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "logits_indices"):
        assert getattr(step, name).flags.c_contiguous, f"{name}: kernels read it as one run of memory"


@settings(max_examples=150, deadline=None)
@given(batches(), st.data())
def test_a_batchs_counts_read_once_answer_as_its_sequences_do(batch, data):
    """Token counts, work, sampling rows, sampler positions and placeholder fills from the batch's counts
    read in one pass, against each sequence read one by one."""
    seqs, counts, bs = batch
    for j, seq in enumerate(seqs):  # some hold the placeholder of a token sampled in the last step
        if data.draw(st.booleans()):
            a, b = (
                seq.num_computed_tokens,
                seq.num_computed_tokens + counts[j],
            )  # the step's positions: [a, b)
            edges = [p for p in (a - 1, a, b - 1, b) if 0 <= p < seq.num_tokens]
            pos = data.draw(st.sampled_from(edges) | st.integers(0, seq.num_tokens - 1))
            seq.pending_pos, seq.pending_src = pos, j + 3
    scheduled = ScheduledBatch(list(seqs), list(counts))
    decode = sum(
        1
        for s, n in zip(seqs, counts, strict=True)
        if n == 1 and s.num_computed_tokens >= s.num_prompt_tokens
    )
    assert scheduled.token_counts() == (sum(counts) - decode, decode)
    samples = [s for s, n in zip(seqs, counts, strict=True) if s.num_computed_tokens + n == s.num_tokens]
    assert sampling_rows(scheduled) == samples
    c = [s.num_computed_tokens for s in seqs]
    assert step_work(scheduled) == (
        len(samples),
        sum(q * k + q * (q + 1) // 2 for q, k in zip(counts, c, strict=True)),
        sum(q + k for q, k in zip(counts, c, strict=True)),
    )
    sampler = Sampler(torch.device("cpu"))
    for s in seqs:
        sampler.add(s.request_id, SamplingParams(temperature=0.5))
    arrays = build_step(seqs, counts, bs, counts=scheduled.counts())
    sampler.attach(arrays, scheduled)
    assert arrays.sample_keys[1].tolist() == [s.num_tokens for s in samples]
    set_token_fill(scheduled, arrays)
    rows, src, start = [], [], 0
    for s, n in zip(seqs, counts, strict=True):
        if s.pending_pos is not None and s.num_computed_tokens <= s.pending_pos < s.num_computed_tokens + n:
            rows.append(start + s.pending_pos - s.num_computed_tokens)
            src.append(s.pending_src)
        start += n
    if rows:
        assert arrays.fill_rows.tolist() == rows and arrays.fill_src.tolist() == src
        assert arrays.fill_rows.dtype == arrays.fill_src.dtype == np.int64
    else:
        assert arrays.fill_rows is None and arrays.fill_src is None
