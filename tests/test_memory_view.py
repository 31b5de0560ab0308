"""The memory view: the scheduler says what limited each batch (KV blocks, max_num_seqs, the token budget,
a closed static batch, or nothing), the engine reports it per step, and the run summary turns it into
shares of steps beside the KV pool's capacity in tokens and in sequences of the workload's mean length."""

from __future__ import annotations

import math

import pytest

from llmbench import LLM, SamplingParams
from llmbench.bench.memory import memory_summary
from llmbench.bench.records import RequestRecord, StepRecord
from llmbench.engine.block_manager import BlockManager, SlabAllocator
from llmbench.engine.sampling_params import SamplingParams as Params
from llmbench.engine.scheduler import Scheduler

PARAMS = Params(max_tokens=4, ignore_eos=True)


def scheduler(
    blocks: int = 64, seqs: int = 8, tokens: int = 64, chunked: bool = True, continuous: bool = True
):
    return Scheduler(
        BlockManager(blocks, 4, False), max_num_seqs=seqs, max_num_batched_tokens=tokens,
        chunked_prefill=chunked, continuous_batching=continuous,
    )  # fmt: skip


def seq(name: str, n: int):
    from llmbench.engine.sequence import Sequence

    return Sequence(name, list(range(1, n + 1)), PARAMS, 0.0)


def first_limit(sched: Scheduler, *lengths: int) -> str:
    for i, n in enumerate(lengths):
        sched.add(seq(f"r{i}", n))
    return sched.schedule().limit


def test_nothing_limits_a_step_that_takes_every_request() -> None:
    assert first_limit(scheduler(), 5, 7) == "none"


def test_a_full_kv_pool_limits_admission() -> None:
    assert first_limit(scheduler(blocks=3), 8, 8) == "kv_blocks"  # the second prompt needs 2 more blocks


def test_max_num_seqs_limits_admission() -> None:
    assert first_limit(scheduler(seqs=1), 3, 3) == "max_num_seqs"


@pytest.mark.parametrize("chunked", [True, False])
def test_the_token_budget_limits_a_step(chunked: bool) -> None:
    # chunked: the second prompt is cut to what is left of the budget; unchunked: it waits for a step
    assert first_limit(scheduler(tokens=10, chunked=chunked), 6, 6) == "max_num_batched_tokens"


def test_the_token_budget_limits_running_sequences() -> None:
    sched = scheduler(tokens=8)
    sched.add(seq("a", 20))
    first = sched.schedule()
    assert first.limit == "max_num_batched_tokens"  # a chunk of 8 of its 20 prompt tokens
    sched.advance(first)
    assert sched.schedule().limit == "max_num_batched_tokens"  # the running prompt's next chunk


def test_a_closed_static_batch_keeps_requests_out() -> None:
    sched = scheduler(chunked=False, continuous=False)
    sched.add(seq("a", 3))
    sched.advance(sched.schedule())
    sched.running[0].token_ids.append(5)
    sched.schedule()  # its first decode closes the batch
    sched.add(seq("b", 2))
    assert sched.schedule().limit == "static_batch"


def test_a_preemption_is_a_kv_limit_whatever_else_happened() -> None:
    sched = scheduler(blocks=3, tokens=64)
    sched.add(seq("old", 4))
    sched.add(seq("new", 4))
    for s in sched.advance(sched.schedule()):
        s.token_ids.append(9)
    batch = sched.schedule()  # both need a third block; one is free
    assert batch.num_preemptions == 1 and batch.limit == "kv_blocks"


def test_slab_allocator_runs_out_as_kv_blocks_too() -> None:
    # two slabs of max_model_len=16 tokens in 8 blocks of 4
    sched = Scheduler(SlabAllocator(8, 4, 16), max_num_seqs=8, max_num_batched_tokens=64, chunked_prefill=True,
                      continuous_batching=True)  # fmt: skip
    assert first_limit(sched, 3, 3, 3) == "kv_blocks"


def test_engine_steps_carry_their_limit() -> None:
    llm = LLM("qwen3-tiny", device="cpu", attention_backend="torch", max_num_seqs=2, num_kv_blocks=64)
    engine = llm.engine
    for i in range(3):
        engine.add_request(
            f"r{i}", [1, 2, 3, 4], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        )
    limits = []
    while engine.has_unfinished():
        limits.append(engine.step().stats.batch_limit)
    assert limits[0] == "max_num_seqs" and limits[-1] == "none"


# --- the run summary ------------------------------------------------------------------------------


def step(limit: str) -> StepRecord:
    return StepRecord(1, "decode", 2, 0, 2, None, 0, 5, 95, 0, 0, 0.0, 1.0, 100, batch_limit=limit)


def request(input_len: int, max_tokens: int) -> RequestRecord:
    return RequestRecord("r", input_len, max_tokens, 0.0, 0.0, 0.0, [1.0], [1], "length")


STARTUP = {"kv_num_blocks": 100, "kv_capacity_tokens": 1600}  # blocks of 16 tokens


def test_summary_gives_capacity_and_the_share_of_steps_each_limit_held() -> None:
    steps = [step("kv_blocks"), step("kv_blocks"), step("max_num_seqs"), step("none")]
    requests = [request(100, 50), request(20, 30)]  # mean length 100 tokens: 7 blocks each
    out = memory_summary(steps, requests, STARTUP, {"paged_kv": True}, 4096)
    assert out["kv_capacity_tokens"] == 1600
    assert out["kv_capacity_seqs"] == 100 // 7
    assert (out["limit_kv_share"], out["limit_seqs_share"], out["limit_tokens_share"]) == (0.5, 0.25, 0.0)


def test_without_paging_every_sequence_reserves_max_model_len() -> None:
    out = memory_summary([step("none")], [request(10, 10)], STARTUP, {"paged_kv": False}, 512)
    assert out["kv_capacity_seqs"] == 1600 // 512


def test_a_peer_backend_gets_nan_not_zero() -> None:
    out = memory_summary([], [request(10, 10)], {"load_time": 1.0}, None, 4096)
    assert all(math.isnan(v) for v in out.values())
