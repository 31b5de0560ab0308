"""Asynchronous scheduling (step N+1 launched before step N's ids are read) changes nothing a request
sees: the same tokens, finish reasons and stop behaviour as the synchronous loop, placeholders never
leak, and aborts mid-flight are clean."""

from __future__ import annotations

import itertools
import time

from llmbench import LLM, SamplingParams
from llmbench.engine.async_scheduling import PENDING

PROMPTS = [[5], [(3 * i + 1) % 384 for i in range(9)], [(7 * i + 3) % 384 for i in range(17)], [42] * 30]


def _llm(async_: bool, **options) -> LLM:
    options = {"max_model_len": 128, "num_kv_blocks": 64, "block_size": 8, "max_num_seqs": 3, **options}
    return LLM("qwen3-tiny", async_scheduling=async_, **options)


def _outputs(llm: LLM, params) -> list[tuple[list[int], str]]:
    return [(o.token_ids, o.finish_reason) for o in llm.generate(PROMPTS, params)]


def test_eos_stops_at_the_same_token_and_the_extra_row_is_dropped():
    sync = _llm(False)
    free = sync.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    # Make a token that prompt 1 generates mid-way an end-of-sequence token for both engines.
    eos = free[1].token_ids[4]
    expected = None
    for async_ in (False, True):
        llm = _llm(async_)
        llm.engine.eos_token_ids = frozenset({eos})
        got = _outputs(llm, SamplingParams(temperature=0.0, max_tokens=20))
        assert all(PENDING not in ids for ids, _ in got)
        assert got[1][1] == "stop" and got[1][0][-1] == eos
        expected = expected or got
        assert got == expected
        assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks  # every block given back


def test_seeded_sampling_is_the_same_token_for_token():
    params = [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=i, max_tokens=16) for i in range(4)]
    assert _outputs(_llm(False), params) == _outputs(_llm(True), params)


def test_an_abort_while_the_next_id_is_on_the_way_leaves_no_placeholder():
    llm = _llm(True)
    engine = llm.engine
    engine.add_request("a", PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    for _ in range(4):
        engine.step()
    assert engine._seqs["a"].pending_pos is not None  # a step is in flight with a placeholder
    out = engine.abort("a")
    assert out.finish_reason == "abort" and PENDING not in out.token_ids
    assert len(out.token_ids) == len(out.token_times)
    while engine.has_unfinished():
        engine.step()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_steps_report_delivery_times_that_do_not_overlap():
    llm = _llm(True)
    engine = llm.engine
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    stats, tokens = [], 0
    while engine.has_unfinished():
        out = engine.step()
        tokens += len(out.tokens)
        if out.stats.kind != "idle":
            stats.append(out.stats)
    assert tokens == 10 * len(PROMPTS)
    assert all(s.duration > 0 for s in stats)
    assert all(a.end_time <= b.start_time for a, b in itertools.pairwise(stats))  # back to back
    assert [s.step for s in stats] == sorted(s.step for s in stats)


def test_a_benchmark_run_with_async_scheduling_measures_the_same_tokens(tmp_path):
    import yaml

    from llmbench.bench.runner import RunRequest, execute_run
    from llmbench.bench.scenario import load_scenario
    from llmbench.bench.store import load_run

    base = {
        "name": "a",
        "model": "qwen3-tiny",
        "engine": {"device": "cpu"},
        "workload": {
            "num_requests": 6,
            "input_len": {"dist": "uniform", "min": 4, "max": 40},
            "output_len": 9,
        },
        "arrival": {"kind": "poisson", "rate": 200},
        "warmup": 0,
    }
    tokens = []
    for async_ in (False, True):
        path = tmp_path / f"{async_}.yaml"
        path.write_text(yaml.safe_dump({**base, "engine": {"device": "cpu", "async_scheduling": async_}}))
        run = load_run(execute_run(RunRequest(load_scenario(path), tmp_path / "r")).run_dir)
        m = run.summary["points"][0]["metrics"]
        assert m["num_completed"]["value"] == 6 and m["ttft_p50"]["value"] > 0 and m["tpot_p50"]["value"] > 0
        requests = run.table("requests").sort_values("request_id")
        tokens.append([list(t) for t in requests["token_ids"]])
        assert run.meta["engine_config"]["async_scheduling"] is async_
    assert tokens[0] == tokens[1]


def test_what_happens_in_a_steps_time_is_counted_in_that_step(monkeypatch):
    """A stall after one step's tokens arrive (its delivery, the driver's own work between calls) lies in
    the next step's time: the counters that explain it (a compile here, a collection in practice) must be
    that step's too."""
    from llmbench.engine import step_counters
    from llmbench.engine.llm_engine import LLMEngine

    real, calls = LLMEngine._deliver, {"n": 0}

    def deliver(self, seq, tok, now, out):
        calls["n"] += 1
        if calls["n"] == 12:  # after the clock of the step delivered stopped
            step_counters.note_triton_compile()
            time.sleep(0.3)
        return real(self, seq, tok, now, out)

    monkeypatch.setattr(LLMEngine, "_deliver", deliver)
    engine = _llm(True, max_num_seqs=1).engine
    engine.add_request("a", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    steps = []
    while engine.has_unfinished():
        steps.append(engine.step().stats)
    slow = max(steps, key=lambda s: s.end_time - s.start_time)
    assert slow.end_time - slow.start_time >= 0.3
    assert [s.step for s in steps if s.triton_compiles] == [slow.step]
