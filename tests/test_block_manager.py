"""Property tests of the KV block manager: no leaked or double-freed block, consistent reference counts,
and prefix sharing that only ever shares blocks holding the same tokens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.engine.block_manager import BlockManager, SlabAllocator
from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.sequence import Sequence

PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def check_invariants(bm: BlockManager, live: list[Sequence]) -> None:
    holders = [0] * bm.num_blocks
    for seq in live:
        assert len(set(seq.block_table)) == len(seq.block_table), "a sequence holds a block twice"
        for b in seq.block_table:
            holders[b] += 1
    assert holders == bm.ref_counts
    assert set(bm.free_blocks) == {b for b in range(bm.num_blocks) if holders[b] == 0}
    for h, b in bm.cached.items():
        assert bm.block_hash[b] == h and bm.block_tokens[b] is not None


ops = st.lists(
    st.tuples(st.sampled_from(["admit", "grow", "free"]), st.integers(0, 7), st.integers(1, 40)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, num_blocks=st.integers(1, 24), block_size=st.sampled_from([1, 2, 4, 8]), prefix=st.booleans())
def test_block_accounting_stays_consistent(ops, num_blocks, block_size, prefix):
    bm = BlockManager(num_blocks, block_size, prefix)
    live: dict[int, Sequence] = {}
    base = [1, 2, 3, 4, 5, 6, 7, 8] * 8  # shared beginnings make prefix hits common
    for op, key, n in ops:
        seq = live.get(key)
        if op == "admit" and seq is None:
            s = Sequence(str(key), base[: n % 20 + 1] + [key] * (n // 20), PARAMS, 0.0)
            if bm.admit(s, s.num_tokens - bm.num_prefix_hit_tokens(s)):
                # every token of a shared block equals the sequence's own token there
                for i, b in enumerate(s.block_table[: s.num_computed_tokens // block_size]):
                    assert bm.block_tokens[b] == tuple(s.token_ids[i * block_size : (i + 1) * block_size])
                s.num_computed_tokens = s.num_tokens
                bm.commit(s)
                live[key] = s
            else:
                assert s.block_table == [] and s.num_computed_tokens == 0
        elif op == "grow" and seq is not None:
            before = list(seq.block_table)
            if bm.grow(seq, n):
                seq.token_ids += [key] * n
                seq.num_computed_tokens += n
                bm.commit(seq)
            else:
                assert seq.block_table == before
        elif op == "free" and seq is not None:
            bm.free(seq)
            del live[key]
        check_invariants(bm, list(live.values()))
    for seq in live.values():
        bm.free(seq)
    check_invariants(bm, [])
    assert bm.num_free_blocks == num_blocks


def test_evicted_prefix_is_not_served():
    bm = BlockManager(2, 4, True)
    a = Sequence("a", [1, 2, 3, 4, 5], PARAMS, 0.0)
    assert bm.admit(a, 5)
    a.num_computed_tokens = 5
    bm.commit(a)
    bm.free(a)
    b = Sequence("b", [9, 9, 9, 9, 9, 9, 9, 9], PARAMS, 0.0)  # takes both blocks: the cached one is evicted
    assert bm.admit(b, 8)
    bm.free(b)
    c = Sequence("c", [1, 2, 3, 4, 5], PARAMS, 0.0)
    assert bm.num_prefix_hit_tokens(c) == 0


def test_full_prompt_hit_still_computes_its_last_block():
    bm = BlockManager(8, 4, True)
    a = Sequence("a", list(range(8)), PARAMS, 0.0)
    assert bm.admit(a, 8)
    a.num_computed_tokens = 8
    bm.commit(a)
    b = Sequence("b", list(range(8)), PARAMS, 0.0)
    assert bm.num_prefix_hit_tokens(b) == 4  # the block holding the last token is recomputed


def test_slab_allocator_reserves_max_model_len_per_sequence():
    slab = SlabAllocator(num_blocks=10, block_size=4, max_model_len=16)  # 4 blocks a slab: 2 slabs
    seqs = [Sequence(str(i), [1], PARAMS, 0.0) for i in range(3)]
    assert slab.admit(seqs[0], 1) and slab.admit(seqs[1], 1)
    assert not slab.admit(seqs[2], 1)
    assert seqs[0].block_table == [0, 1, 2, 3] or seqs[0].block_table == [4, 5, 6, 7]
    assert not set(seqs[0].block_table) & set(seqs[1].block_table)
    assert slab.grow(seqs[0], 16) and not slab.grow(seqs[0], 17)
    slab.free(seqs[0])
    assert slab.admit(seqs[2], 1)


def test_reset_prefix_cache_forgets_every_prefix():
    bm = BlockManager(8, 4, True)
    a = Sequence("a", list(range(9)), PARAMS, 0.0)
    assert bm.admit(a, 9)
    a.num_computed_tokens = 9
    bm.commit(a)
    assert bm.num_prefix_hit_tokens(Sequence("b", list(range(9)), PARAMS, 0.0)) == 8
    bm.reset_prefix_cache()
    assert bm.num_prefix_hit_tokens(Sequence("c", list(range(9)), PARAMS, 0.0)) == 0
    bm.free(a)
    check_invariants(bm, [])
