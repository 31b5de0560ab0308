"""A step's flattened arrays against a token-by-token reference, for batches of prompts, chunks and decodes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.sequence import Sequence
from llmbench.engine.step_inputs import BlockTables, build_step


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
