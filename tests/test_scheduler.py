"""Property tests of the scheduler with the block manager, without a model: whatever the arrival order,
pool size, budgets and policy, every request finishes with exactly max_tokens (EOS ignored), budgets
and limits are respected each step, each policy holds (without chunked prefill a prompt is never split
and no step mixes prefill with decodes; with static batching nobody new joins a batch that has decoded),
and no KV block leaks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.engine.block_manager import BlockManager, SlabAllocator
from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.scheduler import Scheduler, step_kind
from llmbench.engine.sequence import Sequence

requests = st.lists(
    st.tuples(
        st.integers(1, 40), st.integers(1, 12), st.integers(0, 6)
    ),  # prompt len, max_tokens, arrival step
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    reqs=requests,
    block_size=st.sampled_from([1, 4, 8]),
    extra_blocks=st.integers(0, 30),
    budget=st.integers(1, 64),
    max_num_seqs=st.integers(1, 6),
    chunked=st.booleans(),
    continuous=st.booleans(),
    paged=st.booleans(),
    prefix=st.booleans(),
)
def test_every_request_finishes_with_max_tokens(
    reqs, block_size, extra_blocks, budget, max_num_seqs, chunked, continuous, paged, prefix
):
    max_model_len = 64
    longest = max(p + m for p, m, _ in reqs)
    need = -(-longest // block_size)
    if paged:
        kv = BlockManager(need + extra_blocks, block_size, prefix)
    else:
        kv = SlabAllocator(
            -(-max_model_len // block_size) * (1 + extra_blocks // 10), block_size, max_model_len
        )
    sched = Scheduler(
        kv,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        chunked_prefill=chunked,
        continuous_batching=continuous,
    )
    pending = sorted(enumerate(reqs), key=lambda r: r[1][2])
    seqs: dict[str, Sequence] = {}
    done: dict[str, Sequence] = {}
    scheduled_before: set[str] = set()  # requests that have run in some step
    batch_decoded = False  # static batching: the current batch has had a decode step
    for step in range(5000):
        while pending and pending[0][1][2] <= step:
            i, (plen, mt, _) = pending.pop(0)
            prompt = [1 + (j % 3) for j in range(plen)]  # repetitive: prefix hits happen
            seqs[str(i)] = s = Sequence(str(i), prompt, SamplingParams(max_tokens=mt, ignore_eos=True), 0.0)
            sched.add(s)
        if not pending and not sched.has_unfinished():
            break
        if not sched.running:  # the batch has emptied: a new one may form
            batch_decoded = False
        batch = sched.schedule()
        if batch is None:
            assert not sched.running, "running sequences but nothing scheduled"
            continue
        assert len(sched.running) <= max_num_seqs
        total = sum(batch.num_new_tokens)
        assert total <= budget or len(batch.seqs) == 1 and not chunked
        assert len({id(s) for s in batch.seqs}) == len(batch.seqs)
        for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            assert 1 <= n <= s.num_uncomputed_tokens
            assert len(s.block_table) * block_size >= s.num_computed_tokens + n
        newly = batch.newly_scheduled
        prefill_tokens, decode_tokens = batch.token_counts()
        if not chunked:
            whole = {s.request_id: s.num_uncomputed_tokens for s in newly}
            took = {
                s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True) if s in newly
            }
            assert took == whole, "chunked_prefill=False scheduled part of a prompt"
            # No mixed step: a step admits whole prompts and nothing else, or is all decode, and its kind
            # says which (also where a preempted sequence's recompute, the prefix cache serving it down to
            # its last token, takes one token: block_size=1, prefix cache, prompts of 1-2 tokens).
            if newly:
                assert len(newly) == len(batch.seqs), "chunked_prefill=False put prompts beside decodes"
            kind = step_kind(prefill_tokens, decode_tokens)
            assert kind == ("prefill" if newly else "decode"), (kind, batch.num_new_tokens)
        # Admissions are prefill work, whatever their length; the running sequences' one-token steps past
        # their prompts are the decodes.
        running = [(s, n) for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True) if s not in newly]
        assert decode_tokens == sum(
            n == 1 and s.num_computed_tokens >= s.num_prompt_tokens for s, n in running
        )
        if not continuous:
            joined = [s.request_id for s in newly if s.request_id not in scheduled_before]
            assert not (batch_decoded and joined), f"{joined} joined a static batch that had decoded"
            batch_decoded = batch_decoded or decode_tokens > 0
        scheduled_before |= {s.request_id for s in newly}
        for s in sched.advance(batch):
            s.token_ids.append(7)
            if s.num_output_tokens == s.params.max_tokens:
                sched.remove(s)
                done[s.request_id] = s
    assert len(done) == len(reqs), "requests did not finish"
    for s in done.values():
        assert s.num_output_tokens == s.params.max_tokens
    assert kv.num_free_blocks == kv.num_blocks, "KV blocks leaked"


def test_static_batching_admits_nobody_while_a_batch_decodes():
    kv = BlockManager(64, 4, False)
    sched = Scheduler(
        kv, max_num_seqs=8, max_num_batched_tokens=64, chunked_prefill=False, continuous_batching=False
    )
    a = Sequence("a", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), 0.0)
    sched.add(a)
    batch = sched.schedule()
    assert batch.seqs == [a]
    sched.advance(batch)
    a.token_ids.append(5)
    sched.schedule()  # decode: the batch closes
    b = Sequence("b", [4], SamplingParams(max_tokens=1, ignore_eos=True), 0.0)
    sched.add(b)
    batch = sched.schedule()
    assert batch.seqs == [a], "a request joined a static batch that had started decoding"


def test_continuous_batching_admits_between_decodes():
    kv = BlockManager(64, 4, False)
    sched = Scheduler(
        kv, max_num_seqs=8, max_num_batched_tokens=64, chunked_prefill=True, continuous_batching=True
    )
    a = Sequence("a", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), 0.0)
    sched.add(a)
    sched.advance(sched.schedule())
    a.token_ids.append(5)
    b = Sequence("b", [4, 4], SamplingParams(max_tokens=1, ignore_eos=True), 0.0)
    sched.add(b)
    batch = sched.schedule()
    assert batch.seqs == [a, b] and step_kind(*batch.token_counts()) == "mixed"


def test_preemption_takes_the_newest_and_requeues_it_first():
    kv = BlockManager(3, 2, False)
    sched = Scheduler(
        kv, max_num_seqs=8, max_num_batched_tokens=64, chunked_prefill=True, continuous_batching=True
    )
    old = Sequence("old", [1, 2], SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
    new = Sequence("new", [3, 4], SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
    sched.add(old)
    sched.add(new)
    for s in sched.advance(sched.schedule()):
        s.token_ids.append(9)
    batch = sched.schedule()  # both need a 2nd block; only one is free
    assert batch.num_preemptions == 1 and batch.seqs == [old]
    assert sched.waiting[0] is new and new.num_computed_tokens == 0 and new.num_preemptions == 1
