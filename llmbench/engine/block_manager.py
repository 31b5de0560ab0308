"""KV-cache space: paged blocks with prefix caching, or one contiguous slab per sequence.

Both allocators answer the scheduler through the same four calls: ``admit`` (first scheduling, with
prefix matching), ``grow`` (room for more tokens), ``free`` and ``commit`` (after a step, register the
blocks that became full so later requests can share them). A call that cannot be satisfied changes
nothing and returns False; the scheduler then preempts or waits.

Prefix caching: full blocks are identified by a hash chained over all tokens up to the block's end, and
a hit is confirmed token by token (a hash collision can never share wrong KV). A freed block keeps its
contents and hash until it is reused, least recently freed first, so recently finished prefixes survive.
"""

from __future__ import annotations

from collections import OrderedDict

from llmbench.engine.sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # hash -> block id

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def blocks_needed(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    # -- prefix matching --------------------------------------------------------------------------

    def _hash_blocks(self, seq: Sequence, upto: int) -> None:
        """Extend ``seq.block_hashes`` to cover its first ``upto`` full blocks."""
        bs = self.block_size
        for i in range(len(seq.block_hashes), upto):
            prev = seq.block_hashes[i - 1] if i else 0
            seq.block_hashes.append(hash((prev, tuple(seq.token_ids[i * bs : (i + 1) * bs]))))

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        if not self.enable_prefix_cache:
            return []
        # At least one token must be computed to produce logits, so the block holding the last token
        # is never taken from the cache.
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._hash_blocks(seq, max_blocks)
        hits = []
        for i in range(max_blocks):
            block = self.cached.get(seq.block_hashes[i])
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            if block is None or self.block_tokens[block] != tokens:
                break
            hits.append(block)
        return hits

    def num_prefix_hit_tokens(self, seq: Sequence) -> int:
        return len(self._prefix_hits(seq)) * self.block_size

    # -- allocation -------------------------------------------------------------------------------

    def admit(self, seq: Sequence, num_new_tokens: int) -> bool:
        """First scheduling: share cached prefix blocks, then make room for ``num_new_tokens`` more."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        hits = self._prefix_hits(seq)
        hit_tokens = len(hits) * self.block_size
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)  # cached but free: leave the free list
        new = self.blocks_needed(hit_tokens + num_new_tokens) - len(hits)
        if revived + new > self.num_free_blocks:
            return False
        for b in hits:
            if self.ref_counts[b] == 0:
                del self.free_blocks[b]
            self.ref_counts[b] += 1
        seq.block_table = list(hits)
        seq.num_computed_tokens = hit_tokens
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = hit_tokens
        seq.num_committed_blocks = len(hits)
        self._append_new(seq, new)
        return True

    def grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` beyond the computed ones."""
        new = blocks_for(seq.num_computed_tokens + num_new_tokens, self.block_size) - len(seq.block_table)
        if new <= 0:  # most calls: a decode step's token fits the last block
            return True
        if new > len(self.free_blocks):
            return False
        self._append_new(seq, new)
        return True

    def _append_new(self, seq: Sequence, n: int) -> None:
        for _ in range(n):
            block, _ = self.free_blocks.popitem(last=False)  # least recently freed
            h = self.block_hash[block]
            if h is not None:
                if self.cached.get(h) == block:
                    del self.cached[h]
                self.block_hash[block] = self.block_tokens[block] = None
            self.ref_counts[block] = 1
            seq.block_table.append(block)

    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so a prefix's later blocks are evicted before its earlier ones.
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks[block] = None
        seq.block_table = []
        seq.num_committed_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use keep their contents; nothing new will match them)."""
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        self.block_tokens = [None] * self.num_blocks

    def commit(self, seq: Sequence) -> None:
        """Register the sequence's newly filled blocks in the prefix cache."""
        if not self.enable_prefix_cache:
            return
        full = seq.num_computed_tokens // self.block_size
        if full <= seq.num_committed_blocks:
            return
        self._hash_blocks(seq, full)
        bs = self.block_size
        for i in range(seq.num_committed_blocks, full):
            block, h = seq.block_table[i], seq.block_hashes[i]
            if h not in self.cached:  # a twin computed in the same step keeps the first registration
                self.cached[h] = block
                self.block_hash[block] = h
                self.block_tokens[block] = tuple(seq.token_ids[i * bs : (i + 1) * bs])
        seq.num_committed_blocks = full


class SlabAllocator:
    """``paged_kv=False``: each running sequence owns one contiguous max_model_len slab of the pool.

    The slab is a run of consecutive blocks, so the attention kernels read it through the same block
    table; what changes is that a sequence reserves max_model_len tokens of KV up front.
    """

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        self.block_size = block_size
        self.slab_blocks = blocks_for(max_model_len, block_size)
        self.num_slabs = num_blocks // self.slab_blocks
        self.num_blocks = self.num_slabs * self.slab_blocks
        self.free_slabs = list(range(self.num_slabs - 1, -1, -1))
        self.enable_prefix_cache = False

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_slabs) * self.slab_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return self.slab_blocks

    def num_prefix_hit_tokens(self, seq: Sequence) -> int:
        return 0

    def admit(self, seq: Sequence, num_new_tokens: int) -> bool:
        if not self.free_slabs:
            return False
        slab = self.free_slabs.pop()
        seq.block_table = list(range(slab * self.slab_blocks, (slab + 1) * self.slab_blocks))
        return True

    def grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        return seq.num_computed_tokens + num_new_tokens <= self.slab_blocks * self.block_size

    def free(self, seq: Sequence) -> None:
        if seq.block_table:
            self.free_slabs.append(seq.block_table[0] // self.slab_blocks)
        seq.block_table = []

    def commit(self, seq: Sequence) -> None:
        return None

    def reset_prefix_cache(self) -> None:
        return None
