"""The public API: options checked where they enter, requests the engine cannot serve rejected clearly,
timestamps and step statistics reported, presets usable."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from llmbench import LLM, SamplingParams
from llmbench.engine.config import ConfigError, EngineConfig, Tuning
from llmbench.engine.llm_engine import LLMEngine, RequestError
from llmbench.engine.resolve import ResolvedConfig
from llmbench.engine.resolve_tuning import SKINNY_MATMUL_ROWS, SKINNY_ROWS_MAX_HIDDEN
from llmbench.models.presets import PRESETS

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    return LLM("qwen3-tiny", max_model_len=256, num_kv_blocks=64)


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(
        ConfigError,
        match=r"^cuda_graphs: unknown engine option \(did you mean 'cuda_graph'\?\); valid: .*cuda_graph,",
    ):
        LLM("qwen3-tiny", cuda_graphs=True)


def test_malformed_options_are_all_named_before_anything_is_built():
    with pytest.raises(ConfigError) as exc:
        LLM("qwen3-tiny", max_num_seqs="abc", tuning={"skinny_fusion": "norm"})
    assert str(exc.value).splitlines() == [
        "max_num_seqs: expected an integer in 1..1048576, got 'abc'",
        "tuning.skinny_fusion: unsupported 'norm'; supported: auto, all, silu, none",
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_cuda_graph_on_cpu_says_it_needs_a_gpu():
    with pytest.raises(ConfigError, match="cuda_graph=True needs a CUDA device"):
        LLM("qwen3-tiny", device="cpu", cuda_graph=True)


def test_the_engine_runs_and_reports_the_resolved_options(tiny):
    config = tiny.engine.config
    assert isinstance(config, ResolvedConfig) and config.max_model_len == 256
    assert config.prefix_cache is True and config.tuning.tp_all_reduce == "none"
    t = config.tuning
    narrow = tiny.engine.model_config.hidden_size <= SKINNY_ROWS_MAX_HIDDEN
    several = t.programmatic_launch_rows > 1 and config.tp == 1 and narrow
    rows = min(t.programmatic_launch_rows, SKINNY_MATMUL_ROWS) if several else 1
    assert t.skinny_matmul_rows == (rows if config.triton_kernels else 0)


def test_tuning_is_taken_as_a_mapping_or_a_tuning():
    for tuning in ({"skinny_fusion": "none", "skinny_matmul_rows": 0}, Tuning(skinny_matmul_rows=0)):
        llm = LLM("qwen3-tiny", num_kv_blocks=16, max_model_len=64, tuning=tuning)
        assert llm.engine.config.tuning.skinny_matmul_rows == 0
        assert llm.engine.config.tuning.skinny_fusion == "none"
        llm.shutdown()


def test_unknown_model_lists_presets():
    with pytest.raises(ConfigError, match="not a preset .*qwen3-0.6b"):
        LLM("no-such-model")


def test_prompt_longer_than_max_model_len_is_rejected(tiny):
    with pytest.raises(RequestError, match="does not fit max_model_len=256"):
        tiny.generate([[1] * 256], GREEDY)
    assert not tiny.engine.has_unfinished()


def test_max_tokens_beyond_max_model_len_is_rejected_not_clamped(tiny):
    # as the CLI rejects such a workload (test_cli_run): the request, its prompt and max_tokens, the limit
    with pytest.raises(RequestError) as exc:
        tiny.generate([[1, 2, 3], [1] * 200], SamplingParams(max_tokens=60, ignore_eos=True))
    assert str(exc.value) == (
        "request 'gen-1': 200 prompt + 60 output tokens (max_tokens) exceed max_model_len=256: shorten the "
        "prompt, lower max_tokens or raise max_model_len"
    )
    assert not tiny.engine.has_unfinished()  # the first prompt, accepted, was taken back
    with pytest.raises(RequestError, match="^request 'x': 250 prompt \\+ 7 output tokens"):
        tiny.engine.add_request("x", [1] * 250, SamplingParams(max_tokens=7))
    out = tiny.generate([[1] * 250], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    assert len(out.token_ids) == 6  # exactly max_model_len tokens in all: allowed


def test_llm_is_a_context_manager_whose_shutdown_frees_the_model_once():
    with LLM("qwen3-tiny", num_kv_blocks=16, max_model_len=64) as llm:
        first = llm.generate([[1, 2, 3]], GREEDY)[0].token_ids
        model = weakref.ref(llm.engine.runner.model)
    gc.collect()
    assert model() is None, "the model outlived shutdown"
    llm.shutdown()  # a second time: nothing happens
    with pytest.raises(RuntimeError, match="^this engine was shut down: build a new one to generate again$"):
        llm.generate([[1, 2, 3]], GREEDY)
    again = LLM("qwen3-tiny", num_kv_blocks=16, max_model_len=64)
    assert again.generate([[1, 2, 3]], GREEDY)[0].token_ids == first


def test_a_built_engine_is_out_of_the_collectors_reach_until_shutdown():
    """Start-up's objects frozen (llmbench/collector.py): a full collection during steps does not walk the
    model; after shutdown they are the collector's again, so a dropped engine can be collected."""
    with LLM("qwen3-tiny", num_kv_blocks=16, max_model_len=64) as llm:
        model = llm.engine.runner.model
        assert gc.get_freeze_count() > 0
        assert not any(o is model for o in gc.get_objects()), "the model is still in a collected generation"
        llm.generate([[1, 2, 3]], GREEDY)
        del model
    assert gc.get_freeze_count() == 0
    dropped = LLM("qwen3-tiny", num_kv_blocks=16, max_model_len=64)  # never shut down
    assert gc.get_freeze_count() > 0
    del dropped
    gc.collect()
    assert gc.get_freeze_count() == 0


def test_request_larger_than_the_pool_is_rejected_not_hung(tiny):
    # 64 blocks of 16 tokens = 1024 tokens; max_model_len 256 fits, so shrink the pool instead
    llm = LLM("qwen3-tiny", max_model_len=256, num_kv_blocks=4)
    with pytest.raises(RequestError, match="needs 6 KV blocks .* the whole pool has 4"):
        llm.generate([[1] * 60], SamplingParams(max_tokens=30, ignore_eos=True))


def test_out_of_vocabulary_token_is_rejected(tiny):
    with pytest.raises(RequestError, match=r"outside \[0, 4096\)"):
        tiny.generate([[1, 5000]], GREEDY)


def test_generate_returns_tokens_text_and_timestamps(tiny):
    outs = tiny.generate(["hello", [1, 2, 3]], GREEDY)
    assert [len(o.token_ids) for o in outs] == [6, 6]
    for o in outs:
        assert o.finish_reason == "length"
        assert o.arrival_time <= o.first_scheduled_time <= o.token_times[0]
        assert o.token_times == sorted(o.token_times) and o.finish_time == o.token_times[-1]
        assert isinstance(o.text, str)


def test_eos_stops_unless_ignored():
    llm = LLM("qwen3-tiny", num_kv_blocks=128)
    free = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0]
    eos = free.token_ids[3]
    llm.engine.eos_token_ids = frozenset({eos})
    stopped = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=20))[0]
    first = free.token_ids.index(eos)
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: first + 1]


def test_step_statistics_account_for_every_token():
    engine = LLMEngine(
        EngineConfig.from_options("qwen3-tiny", max_num_batched_tokens=32, block_size=8, num_kv_blocks=128)
    )
    prompts = [[7] * 40, [3] * 5]
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, GREEDY)
    steps, events = [], []
    while engine.has_unfinished():
        out = engine.step()
        steps.append(out.stats)
        events += out.tokens
    assert sum(s.num_prefill_tokens for s in steps) == 45
    assert sum(s.num_decode_tokens for s in steps) == 2 * (GREEDY.max_tokens - 1)
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in steps) <= 32
    assert {s.kind for s in steps} >= {"prefill", "decode"}
    assert len(events) == 2 * GREEDY.max_tokens
    assert steps[-1].kv_blocks_used == 0 and steps[-1].kv_blocks_free == engine.kv.num_blocks
    assert all(s.end_time >= s.start_time for s in steps)


@pytest.mark.parametrize("name", ["qwen3-tiny"])
def test_preset_greedy_tokens_vary_with_context(name):
    outs = LLM(name, num_kv_blocks=128).generate(
        [[1, 2, 3], [4, 5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    )
    for o in outs:
        assert len(set(o.token_ids)) >= 8, o.token_ids
    assert outs[0].token_ids != outs[1].token_ids


def test_presets_have_the_published_shapes():
    # Parameter counts of the real checkpoints (embedding included), within rounding.
    expected = {"qwen3-0.6b": 0.596e9, "qwen3-8b": 8.19e9, "llama3.2-1b": 1.236e9, "llama3.1-8b": 8.03e9}
    for name, n in expected.items():
        assert abs(PRESETS[name].config.num_params() - n) / n < 0.01, name


def test_a_call_whose_step_fails_leaves_the_engine_usable_for_the_next(tiny, monkeypatch):
    real = tiny.engine.step
    monkeypatch.setattr(tiny.engine, "step", lambda: (_ for _ in ()).throw(RuntimeError("a step broke")))
    with pytest.raises(RuntimeError, match="a step broke"):
        tiny.generate([[1, 2, 3], [4, 5]], GREEDY)
    monkeypatch.setattr(tiny.engine, "step", real)
    outs = tiny.generate([[1, 2, 3], [4, 5]], GREEDY)  # the same request ids again
    assert [len(o.token_ids) for o in outs] == [6, 6] and not tiny.engine.has_unfinished()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_tokens": 2.5}, "max_tokens must be an integer >= 1, got 2.5"),
        ({"max_tokens": float("nan")}, "max_tokens must be an integer >= 1, got nan"),
        ({"max_tokens": True}, "max_tokens must be an integer >= 1, got True"),
        ({"max_tokens": "5"}, "max_tokens must be an integer >= 1, got '5'"),
        ({"ignore_eos": "no"}, "ignore_eos must be True or False, got 'no'"),
        ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
    ],
)
def test_sampling_values_of_the_wrong_type_are_refused_where_they_are_made(options, message):
    with pytest.raises(ValueError) as exc:
        SamplingParams(**options)
    assert str(exc.value) == message


def test_prompts_and_settings_of_the_wrong_type_are_clear_errors(tiny):
    with pytest.raises(RequestError, match=r"token ids are integers, got 2\.9"):
        tiny.generate([[1, 2.9]], GREEDY)
    with pytest.raises(TypeError, match="sampling_params takes SamplingParams .* got a dict"):
        tiny.generate([[1, 2]], {"temperature": 0})
    assert tiny.generate([torch.tensor([1, 2, 3])], GREEDY)[0].prompt_token_ids == [1, 2, 3]  # ints still


def test_a_step_after_shutdown_says_the_engine_was_shut_down():
    llm = LLM("qwen3-tiny", max_model_len=64, num_kv_blocks=8)
    llm.shutdown()
    with pytest.raises(RuntimeError, match="this engine was shut down"):
        llm.engine.step()


def test_the_errors_the_api_raises_are_importable_from_the_package():
    import llmbench
    from llmbench import ConfigError, ModelError
    from llmbench.engine.config import ConfigError as Config
    from llmbench.models.errors import ModelError as Model

    assert (ConfigError, ModelError) == (Config, Model) and {"ConfigError", "ModelError"} <= set(
        llmbench.__all__
    )
    with pytest.raises(ConfigError, match="block_size"):
        LLM("qwen3-tiny", device="cpu", block_size=0)
    from llmbench import RequestError
    from llmbench.engine.llm_engine import RequestError as Request

    assert RequestError is Request and "RequestError" in llmbench.__all__ and "LLM" in dir(llmbench)
    with LLM("qwen3-tiny", device="cpu", num_kv_blocks=16) as llm:
        for prompt in (None, 3.5):  # neither text nor ids: the request is named, no internal TypeError
            with pytest.raises(RequestError, match="a prompt is text .a string. or a list of token ids, got"):
                llm.generate([prompt])


def test_a_folder_may_be_a_path_and_score_takes_ids_only(tmp_path):
    from pathlib import Path

    from llmbench.engine.llm_engine import RequestError

    from tiny_models import make_tiny

    folder = tmp_path / "m"
    make_tiny("qwen3", folder)
    with LLM(Path(folder), device="cpu") as llm:
        assert llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2))[0].token_ids
        with pytest.raises(RequestError, match=r"prompt 0 is 'Hello': score takes token ids"):
            llm.score(["Hello"], [" world"])
