"""Decode bytes and prefill FLOPs per GPU (bench/derived.py): the written definition, checked against the
model's shapes by hand, at tp = 1, 2 and 4, and through real engines at tp = 1 and tp = 2 (CPU, gloo)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from llmbench import LLM, SamplingParams
from llmbench.bench.derived import (
    decode_batches,
    decode_bytes,
    decode_model,
    prefill_flops,
    rank_weights_of,
    step_summary,
    step_utilisation,
)
from llmbench.bench.driver import drive
from llmbench.bench.peaks import PeakUsed
from llmbench.bench.records import StepRecord
from llmbench.bench.workload.spec import RequestSpec
from llmbench.engine.work import RankWeights, rank_weights
from llmbench.layers.attention.backends import make_backend
from llmbench.layers.parallel import TPGroup
from llmbench.models.config import ModelConfig
from llmbench.models.llama import BuildOptions, LlamaForCausalLM
from llmbench.models.presets import PRESETS

TINY = PRESETS["qwen3-tiny"].config  # 4 heads, 2 KV heads (replicated at tp=4), tied embeddings
PEAK = PeakUsed(1e9, 1e12, "float32", "measured", "2025-01-01T00:00:00", None, None)
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def step(kind: str, dur: float, *, prefill=0, decode=0, rows=0, pairs=0, context=0, used=3, free=1):
    return StepRecord(
        1, kind, 2, prefill, decode, None, 0, used, free, 0, 0, 10.0, 10.0 + dur, 0, rows, pairs, context
    )


def weights(**kw) -> RankWeights:
    base = dict(
        tp=1, layer_bytes=1_000_000, layer_matmul_params=400_000, lm_head_bytes=200_000, lm_head_params=100_000,
        embedding_bytes=200_000, embedding_row_bytes=64, tied_embeddings=False, kv_bytes_per_token=1000,
        num_layers=2, attention_heads=4, kv_heads=2, head_dim=8,
    )  # fmt: skip
    return RankWeights(**{**base, **kw})


def by_hand(cfg: ModelConfig, tp: int, itemsize: int) -> dict[str, int]:
    """One rank's parameters worked out from the model's shapes (what rank_weights reads from the rank)."""
    h, i, d, layers = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_hidden_layers
    heads = cfg.num_attention_heads // tp
    kv = cfg.num_key_value_heads // tp if cfg.num_key_value_heads >= tp else 1  # replicated below tp
    matmul = layers * ((heads + 2 * kv) * d * h + heads * d * h + 3 * h * (i // tp))
    replicated = layers * (2 * h + (2 * d if cfg.qk_norm else 0)) + h  # norms (and the final one)
    vocab_rows = -(-cfg.vocab_size // tp)
    return {
        "layer_bytes": (matmul + replicated) * itemsize,
        "layer_matmul_params": matmul,
        "lm_head_params": vocab_rows * h,
        "lm_head_bytes": vocab_rows * h * itemsize,
        "embedding_row_bytes": h * itemsize,
        "attention_heads": heads,
        "kv_heads": kv,
        "kv_bytes_per_token": 2 * layers * kv * d * itemsize,
        "replicated_bytes": replicated * itemsize,
    }


def built_on_meta(cfg: ModelConfig, tp: int, rank: int = 0) -> RankWeights:
    opts = BuildOptions(make_backend("torch", 0), cfg.max_position_embeddings, TPGroup(rank, tp))
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, opts)
    return rank_weights(model, tp, kv_bytes_per_token=0)


# -- the definition on hand-built steps ---------------------------------------------------------


def test_decode_bytes_are_layers_lm_head_embedding_rows_and_kv_read_per_gpu():
    w = weights(tp=2)
    s = step("decode", 0.002, decode=3, rows=3, context=500)
    expected = 1_000_000 + 200_000 + 3 * 64 / 2 + 500 * 1000  # the embedding: 3 rows, half on this rank
    assert decode_bytes(s, w) == pytest.approx(expected)
    u = step_utilisation([s], {"rank_weights": w}, PEAK)
    # per GPU over one GPU's peak: no further division by tp
    assert u.decode_bw[0] == pytest.approx(expected / 0.002 / 1e9)
    assert u.decode_bytes[0] == pytest.approx(expected)


def test_prefill_flops_count_matmuls_sampled_logits_rows_and_attention_pairs():
    w = weights()
    s = step("prefill", 0.5, prefill=100, rows=2, pairs=5050)
    expected = 2 * 400_000 * 100 + 2 * 100_000 * 2 + 4 * 2 * 4 * 8 * 5050
    assert prefill_flops(s, w) == pytest.approx(expected)
    u = step_utilisation([s], weights_info(w), PEAK)
    assert u.prefill_flops[0] == pytest.approx(expected / 0.5 / 1e12)
    # a chunk in the middle of a prompt samples nothing: no LM-head work
    middle = step("prefill", 0.5, prefill=100, rows=0, pairs=5050)
    assert prefill_flops(s, w) - prefill_flops(middle, w) == pytest.approx(2 * 100_000 * 2)


def weights_info(w: RankWeights) -> dict:
    return {"rank_weights": dataclasses.asdict(w)}  # as meta.json holds it: a mapping


def test_mixed_steps_get_neither_figure_and_a_peer_backend_gets_none():
    w = weights()
    steps = [step("mixed", 0.1, prefill=5, decode=2, rows=3, pairs=40, context=40)]
    u = step_utilisation(steps, {"rank_weights": w}, PEAK)
    assert all(math.isnan(a[0]) for a in u)
    # a peer backend reports a model_info without the engine's breakdown (and has no steps)
    peer = step_utilisation([step("decode", 0.01, decode=1, rows=1, context=5)], {"num_params": 5}, PEAK)
    assert math.isnan(peer.decode_bw[0]) and math.isnan(peer.decode_bytes[0])


def test_without_a_peak_the_counts_stay_and_the_utilisations_are_nan():
    s = step("decode", 0.01, decode=1, rows=1, context=5)
    u = step_utilisation([s], {"rank_weights": weights()}, None)
    assert math.isnan(u.decode_bw[0]) and u.decode_bytes[0] == pytest.approx(decode_bytes(s, weights()))
    assert math.isnan(step_summary([s], u)["decode_bw_util_mean"])


def test_step_summary_means_the_per_step_utilisations():
    w = weights()
    steps = [step("decode", 0.002, decode=1, rows=1, context=100), step("decode", 0.004, decode=1, rows=1)]
    u = step_utilisation(steps, {"rank_weights": w}, PEAK)
    s = step_summary(steps, u)
    assert s["decode_bw_util_mean"] == pytest.approx(np.mean(u.decode_bw))
    assert s["decode_step_mean"] == pytest.approx(0.003) and s["kv_usage_max"] == pytest.approx(0.75)


# -- the decode step model ------------------------------------------------------------------------

FIXED, PER_SEQ, RATE = 1.5e-3, 2e-6, 4e12  # s a step, s a sequence, K/V bytes/s


def modelled_steps(seqs, contexts, noise=20e-6, kv_per_token=100_000, seed=0):
    """Decode steps whose times follow the step model, plus Gaussian noise; their KV bytes by token."""
    rng = np.random.default_rng(seed)
    steps, kv = [], []
    for n, c in zip(seqs, contexts, strict=True):
        t = FIXED + PER_SEQ * n + c * kv_per_token / RATE + rng.normal(0, noise)
        steps.append(step("decode", t, decode=n, rows=n, context=c)._replace(num_seqs=n))
        kv.append(c * kv_per_token)
    return steps, np.array(kv, dtype=float)


def test_the_step_model_recovers_the_fixed_part_and_the_kv_rate():
    seqs = np.linspace(256, 1, 600).round().astype(int)  # a shrinking batch, as in an offline run
    contexts = seqs * np.linspace(500, 1500, 600).astype(int)  # whose contexts grow
    steps, kv = modelled_steps(seqs, contexts)
    fit = decode_model(steps, kv)
    assert fit["decode_fixed"] == pytest.approx(FIXED, rel=0.02)
    assert fit["decode_kv_rate"] == pytest.approx(RATE, rel=0.02)
    # through step_utilisation: the K/V bytes are the steps' contexts at the model's bytes per token
    u = step_utilisation(steps, {"rank_weights": weights(kv_bytes_per_token=100_000)}, None)
    assert np.allclose(u.kv_bytes, kv) and step_summary(steps, u)["decode_kv_rate"] == fit["decode_kv_rate"]


def test_one_sequence_leaves_out_the_sequences_term():
    contexts = np.arange(100, 100 + 4 * 256, 4) * 100  # one long sequence's growing context
    steps, kv = modelled_steps(np.ones(256, dtype=int), contexts, noise=2e-6)
    fit = decode_model(steps, kv)
    assert fit["decode_fixed"] == pytest.approx(FIXED + PER_SEQ, rel=0.02)
    assert fit["decode_kv_rate"] == pytest.approx(RATE, rel=0.05)


def test_the_rate_is_left_out_where_the_contexts_cannot_show_it():
    seqs = np.full(100, 8)
    few, kv = modelled_steps(seqs[:10], np.arange(10) * 1000 + 1000)
    assert all(math.isnan(v) for v in decode_model(few, kv).values())  # too few steps for a fit
    same, kv = modelled_steps(seqs, np.full(100, 4000))  # contexts that never change
    assert all(math.isnan(v) for v in decode_model(same, kv).values())
    # contexts that vary a little under noise that hides their cost: neither figure (whichever sign the
    # noise gives the slope; the intercept then swings with it)
    for seed in range(10):
        noisy, kv = modelled_steps(seqs, 4000 + np.arange(100) % 7, noise=200e-6, seed=seed)
        assert all(math.isnan(v) for v in decode_model(noisy, kv).values()), seed
    # prefill and mixed steps take no part: the same steps as mixed ones give nothing
    clear, kv = modelled_steps(seqs, np.arange(100) * 100 + 1000)
    assert not math.isnan(decode_model(clear, kv)["decode_kv_rate"])
    assert all(math.isnan(v) for v in decode_model([s._replace(kind="mixed") for s in clear], kv).values())


# -- one rank's parameters, read from the rank ---------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("tied", [True, False])
def test_rank_weights_equal_the_shard_worked_out_from_the_shapes(tp, tied):
    cfg = TINY.replace(tie_word_embeddings=tied)
    for rank in range(tp):  # every rank holds the same shapes
        w = built_on_meta(cfg, tp, rank)
        hand = by_hand(cfg, tp, itemsize=4)
        for name in ("layer_bytes", "layer_matmul_params", "lm_head_params", "lm_head_bytes"):
            assert getattr(w, name) == hand[name], name
        assert (w.embedding_row_bytes, w.attention_heads, w.kv_heads) == (
            hand["embedding_row_bytes"],
            hand["attention_heads"],
            hand["kv_heads"],
        )
        assert w.tied_embeddings is tied and w.embedding_bytes == w.lm_head_bytes


def test_the_embedding_matrix_is_not_in_the_bytes_a_decode_step_reads():
    # every parameter is in exactly one part: layers, LM head, and (untied) the embedding
    for tied in (True, False):
        cfg = TINY.replace(tie_word_embeddings=tied)
        opts = BuildOptions(make_backend("torch", 0), 64, TPGroup())
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg, opts)
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        w = rank_weights(model, 1, kv_bytes_per_token=0)
        assert w.layer_bytes + w.lm_head_bytes + (0 if tied else w.embedding_bytes) == total
        s = step("decode", 0.01, decode=4, rows=4)
        embedding_matrix = 0 if tied else w.embedding_bytes  # tied: the LM head is that matrix, read once
        assert decode_bytes(s, w) == total - embedding_matrix + 4 * w.embedding_row_bytes


# -- real engines --------------------------------------------------------------------------------


def _steps(llm: LLM, prompts: list[list[int]]) -> list[StepRecord]:
    specs = [RequestSpec(f"r{i}", p, GREEDY.max_tokens) for i, p in enumerate(prompts)]
    result = drive(llm.engine, specs, [0.0] * len(specs), lambda _: GREEDY)
    assert result.status == "complete", result.error
    return result.steps


@pytest.mark.slow
def test_tp2_per_gpu_counts_equal_tp1_definition_applied_to_one_rank_shard():
    prompts = [[(5 * i + 1) % 4096 for i in range(13)], [7] * 9]
    options = dict(device="cpu", dtype="float32", num_kv_blocks=64, block_size=8)
    one = LLM("qwen3-tiny", **options)
    steps1 = _steps(one, prompts)
    w1 = one.engine.model_info.rank_weights
    two = LLM("qwen3-tiny", tp=2, **options)
    try:
        steps2 = _steps(two, prompts)
        info2 = two.engine.model_info
    finally:
        two.engine.shutdown()
    w2 = info2.rank_weights
    for tp, w in ((1, w1), (2, w2)):  # read from the rank's own parameters, equal to the shapes' shard
        hand = by_hand(TINY, tp, itemsize=4)
        assert {k: getattr(w, k) for k in hand if k != "replicated_bytes"} == {
            k: v for k, v in hand.items() if k != "replicated_bytes"
        }
    # the same scheduler: the same steps, with the same counts of work
    assert [(s.kind, s.num_logits_rows, s.attention_pairs, s.context_tokens) for s in steps1] == [
        (s.kind, s.num_logits_rows, s.attention_pairs, s.context_tokens) for s in steps2
    ]
    kinds = {s.kind for s in steps2}
    assert kinds == {"prefill", "decode"}
    replicated = by_hand(TINY, 2, itemsize=4)["replicated_bytes"]
    for s1, s2 in zip(steps1, steps2, strict=True):
        if s1.kind == "decode":
            # everything is sharded in two (layers, LM head, embedding rows, KV heads) but the norms
            assert decode_bytes(s2, w2) == pytest.approx((decode_bytes(s1, w1) - replicated) / 2 + replicated)
        else:
            assert prefill_flops(s2, w2) == pytest.approx(prefill_flops(s1, w1) / 2)
    # the run's figure: one GPU's bytes over one GPU's peak (it was halved once by a division by tp)
    u2 = step_utilisation(steps2, info2, PEAK)
    d = next(i for i, s in enumerate(steps2) if s.kind == "decode")
    assert u2.decode_bw[d] == pytest.approx(
        decode_bytes(steps2[d], w2) / steps2[d].duration / PEAK.mem_bandwidth
    )


def test_attention_pairs_count_the_cached_prefix_and_earlier_chunks():
    # budget 8 tokens a step, blocks of 4: a 20-token prompt runs as chunks of 8, 8 and 4
    llm = LLM(
        "qwen3-tiny", device="cpu", dtype="float32", num_kv_blocks=64, block_size=4, chunked_prefill=True,
        max_num_batched_tokens=8, prefix_cache=True,
    )  # fmt: skip
    prompt = [(3 * i + 2) % 4096 for i in range(20)]
    first = _steps(llm, [prompt])
    pairs = lambda q, c: q * c + q * (q + 1) // 2  # noqa: E731  (the definition, for q new after c cached)
    assert [(s.kind, s.num_prefill_tokens, s.attention_pairs, s.num_logits_rows) for s in first[:3]] == [
        ("prefill", 8, pairs(8, 0), 0),
        ("prefill", 8, pairs(8, 8), 0),
        ("prefill", 4, pairs(4, 16), 1),
    ]
    assert [(s.attention_pairs, s.context_tokens) for s in first[3:]] == [(21, 21), (22, 22), (23, 23)]
    # the same first 16 tokens again: 4 blocks from the prefix cache, 4 tokens computed after them
    second = _steps(llm, [prompt[:16] + [9, 9, 9, 9]])
    s = second[0]
    assert s.prefix_cache_hit_tokens == 16 and s.num_prefill_tokens == 4
    assert (s.attention_pairs, s.context_tokens, s.num_logits_rows) == (pairs(4, 16), 20, 1)


def test_model_info_in_meta_json_gives_back_the_breakdown():
    w = built_on_meta(TINY, 2)
    as_json = json.loads(json.dumps({"rank_weights": dataclasses.asdict(w)}))
    assert rank_weights_of(as_json) == w
    assert rank_weights_of({"rank_weights": {"layer_bytes": 1}}) is None  # another version's fields


def test_the_host_and_device_figures_come_from_each_steps_wait() -> None:
    # Decode steps of 4 and 6 ms whose host waited 3 and 1 ms, a mixed step of 20 ms it waited 0 in: the
    # host's own time per decode step is (1 + 5) / 2 ms; it waited 4 of the 30 ms.
    steps = [
        step("decode", 0.004)._replace(device_wait=0.003),
        step("decode", 0.006)._replace(device_wait=0.001),
        step("mixed", 0.020, prefill=100, decode=1),
    ]
    out = step_summary(steps, step_utilisation(steps, weights_info(weights()), PEAK))
    assert out["decode_host_time"] == pytest.approx(0.003)
    assert out["device_wait_share"] == pytest.approx(4 / 30)
    assert math.isnan(
        step_summary([], step_utilisation([], weights_info(weights()), PEAK))["device_wait_share"]
    )


def test_a_step_records_how_long_the_host_waited_for_its_ids(monkeypatch) -> None:
    # Asynchronous scheduling on the CPU, the device made slow: the host waits in every resolved step, and
    # the wait is part of the step's time. Synchronous, the wait is part of the step too.
    import time

    import llmbench.engine.async_scheduling as scheduling

    wait = scheduling.InFlight.wait

    def slow(self):
        time.sleep(0.02)
        return wait(self)

    monkeypatch.setattr(scheduling.InFlight, "wait", slow)
    for async_ in (True, False):
        llm = LLM("qwen3-tiny", async_scheduling=async_, num_kv_blocks=32, max_model_len=64)
        engine = llm.engine
        engine.add_request("a", [1, 2, 3], GREEDY)
        stats = []
        while engine.has_unfinished():
            stats.append(engine.step().stats)
        ran = [s for s in stats if s.kind != "idle"]
        assert len(ran) >= GREEDY.max_tokens  # asynchronous: one more, the row scheduled past the end
        for s in ran:
            assert 0 <= s.device_wait <= s.duration
            if async_:
                assert s.device_wait >= 0.02


def test_decode_steps_are_binned_by_batch_size_in_powers_of_two() -> None:
    # Batches of 1, 3, 4, 7, 256 and 5000 sequences (5000: the open top bin); a prefill and a mixed step of
    # 3 sequences stay out. Each bin sums its steps' time, waits and sequences.
    def decode(seqs: int, dur: float, wait: float) -> StepRecord:
        return step("decode", dur, decode=seqs)._replace(num_seqs=seqs, device_wait=wait)

    steps = [
        decode(1, 0.001, 0.0), decode(3, 0.002, 0.001), decode(4, 0.003, 0.002), decode(7, 0.005, 0.001),
        decode(256, 0.010, 0.006), decode(5000, 0.020, 0.0),
        step("prefill", 0.5, prefill=100)._replace(num_seqs=3), step("mixed", 0.5, prefill=9, decode=2),
    ]  # fmt: skip
    bins = decode_batches(steps)
    assert [(b["min"], b["max"], b["steps"], b["seqs"]) for b in bins] == [
        (1, 1, 1, 1), (2, 3, 1, 3), (4, 7, 2, 11), (256, 511, 1, 256), (2048, None, 1, 5000),
    ]  # fmt: skip
    four = bins[2]
    assert four["time"] == pytest.approx(0.008) and four["device_wait"] == pytest.approx(0.003)
    assert decode_batches([]) == []
