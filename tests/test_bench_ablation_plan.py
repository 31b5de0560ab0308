"""The ablation planner: which variants each design runs, against the configuration resolved here."""

from __future__ import annotations

import pytest

from llmbench.bench import workload_fits as fit
from llmbench.bench.ablation import BASELINE, Variant, parse_toggle, parse_toggles, plan
from llmbench.bench.ablation.checks import config_problem
from llmbench.bench.ablation.execute import child_command
from llmbench.bench.errors import BenchError
from llmbench.bench.scenario import load_scenario
from llmbench.bench.scenario.schema import Sampling
from llmbench.engine.config import EngineConfig
from llmbench.engine.option_checks import ATTENTION_BACKENDS
from llmbench.engine.resolve import resolve_here


@pytest.fixture
def cpu_config():
    return resolve_here(EngineConfig.from_options("qwen3-tiny", device="cpu"))


def names(variants):
    return [v.name for v in variants]


def test_flip_one_boolean_is_an_a_b_pair(cpu_config):
    vs = plan("flip", [parse_toggle("cuda_graph")], cpu_config)
    assert cpu_config.cuda_graph is False
    assert [(v.name, v.options) for v in vs] == [(BASELINE, {}), ("cuda_graph=on", {"cuda_graph": True})]


def test_flip_several_toggles_switches_them_together(cpu_config):
    vs = plan("flip", [parse_toggle("paged_kv"), parse_toggle("chunked_prefill")], cpu_config)
    assert names(vs) == [BASELINE, "paged_kv=off+chunked_prefill=off"]


def test_attention_backend_compares_every_other_backend_or_the_ones_given(cpu_config):
    vs = plan("flip", [parse_toggle("attention_backend")], cpu_config)
    others = [b for b in ATTENTION_BACKENDS if b != cpu_config.attention_backend]
    assert names(vs) == [BASELINE, *(f"attention_backend={b}" for b in others)]
    vs = plan("flip", [parse_toggle("attention_backend=torch,sdpa")], cpu_config)
    assert [v.options for v in vs] == [{}, {"attention_backend": "torch"}]  # sdpa is the baseline here


def test_tp_compares_one_and_two(cpu_config):
    assert [v.options for v in plan("flip", [parse_toggle("tp")], cpu_config)] == [{}, {"tp": 2}]


def test_one_at_a_time(cpu_config):
    vs = plan("one-at-a-time", [parse_toggle("paged_kv"), parse_toggle("torch_compile")], cpu_config)
    assert [(v.name, v.options) for v in vs] == [
        (BASELINE, {}),
        ("paged_kv=off", {"paged_kv": False}),
        ("torch_compile=on", {"torch_compile": True}),
    ]


def test_leave_one_out_starts_from_all_on(cpu_config):
    vs = plan("leave-one-out", [parse_toggle("prefix_cache"), parse_toggle("attention_backend")], cpu_config)
    assert vs[0] == (BASELINE, {"prefix_cache": True, "attention_backend": "sdpa"})
    assert vs[1] == ("prefix_cache=off", {"prefix_cache": False, "attention_backend": "sdpa"})
    assert vs[2] == ("attention_backend=torch", {"prefix_cache": True, "attention_backend": "torch"})


def test_factorial_runs_every_combination_with_the_current_one_as_baseline(cpu_config):
    vs = plan("factorial", [parse_toggle("chunked_prefill"), parse_toggle("torch_compile")], cpu_config)
    assert len(vs) == 4 and vs[0].name == BASELINE
    assert vs[0].options == {"chunked_prefill": True, "torch_compile": False}
    assert sorted(tuple(v.options.values()) for v in vs) == [
        (False, False),
        (False, True),
        (True, False),
        (True, True),
    ]


def test_bad_toggles_and_designs_are_errors(cpu_config):
    with pytest.raises(
        BenchError, match=r"Unknown toggle: 'cuda_graphs' \(did you mean 'cuda_graph'\?\)\. Toggles: paged_kv"
    ):
        parse_toggle("cuda_graphs")
    with pytest.raises(
        BenchError,
        match=r"'paged_kv,chunked_prefill': one toggle a --toggle; give each its own: --toggle paged_kv ",
    ):
        parse_toggle("paged_kv,chunked_prefill")
    with pytest.raises(BenchError, match="Supported: flip, one-at-a-time"):
        plan("random", [parse_toggle("tp")], cpu_config)
    with pytest.raises(BenchError, match="named twice"):
        plan("flip", [parse_toggle("tp"), parse_toggle("tp")], cpu_config)


def test_a_knob_is_swept_over_the_values_given(cpu_config):
    vs = plan("flip", [parse_toggle("max_num_seqs=128,256")], cpu_config)
    assert [v.options for v in vs] == [{}, {"max_num_seqs": 128}]  # 256 is the baseline's own value
    with pytest.raises(BenchError, match="max_num_seqs is a knob, not an on/off toggle: give its values"):
        parse_toggle("max_num_seqs")
    with pytest.raises(BenchError, match=r"knobs, with values \(NAME=A,B\): .*block_size"):
        parse_toggle("warp_speed=1,2")


def test_tuning_knobs_are_varied_by_their_dotted_names(cpu_config):
    vs = plan("flip", [parse_toggle("tuning.tp_fuse_norm")], cpu_config)  # an on/off knob flips
    assert [(v.name, v.options) for v in vs] == [
        (BASELINE, {}),
        ("tuning.tp_fuse_norm=on", {"tuning.tp_fuse_norm": True}),
    ]
    toggle = parse_toggle("tuning.skinny_matmul_rows=0,1")
    assert toggle.values == (0, 1)
    assert [v.options for v in plan("flip", [toggle], cpu_config)] == [{}, {"tuning.skinny_matmul_rows": 1}]
    with pytest.raises(BenchError, match="--toggle tuning.skinny_fusion is a knob, not an on/off toggle"):
        parse_toggle("tuning.skinny_fusion")


def test_toggle_values_are_checked_as_the_engine_checks_them_all_at_once():
    with pytest.raises(BenchError) as exc:
        parse_toggles(["max_num_seqs=abc,8", "tuning.skinny_matmul_rows=0,257", "cuda_graph=maybe"])
    assert str(exc.value).splitlines() == [
        "--toggle max_num_seqs=abc,8: engine.max_num_seqs: expected an integer in 1..1048576, got 'abc'",
        "--toggle tuning.skinny_matmul_rows=0,257: engine.tuning.skinny_matmul_rows: expected an integer in "
        "0..256 or auto, got 257",
        "--toggle cuda_graph=maybe: engine.cuda_graph: expected true, false or auto, got 'maybe'",
    ]
    with pytest.raises(
        BenchError, match=r"^--toggle block_size=2.5: engine.block_size: expected an integer in 1..65536"
    ):
        parse_toggle("block_size=2.5")


def test_sampling_settings_are_toggles_against_the_scenario_value(cpu_config):
    sampling = Sampling(temperature=0.6)
    vs = plan("flip", [parse_toggle("sampling.temperature=0,0.6")], cpu_config, sampling)
    assert [(v.name, v.options) for v in vs] == [
        (BASELINE, {}),
        ("sampling.temperature=0", {"sampling.temperature": 0}),
    ]
    vs = plan(
        "one-at-a-time",
        [parse_toggle("sampling.top_k=0,50"), parse_toggle("sampling.top_p=1,0.9")],
        cpu_config,
        sampling,
    )
    assert [v.options for v in vs] == [{}, {"sampling.top_k": 50}, {"sampling.top_p": 0.9}]
    vs = plan(
        "factorial", [parse_toggle("sampling.min_p=0.1,0"), parse_toggle("cuda_graph")], cpu_config, sampling
    )
    assert vs[0] == (BASELINE, {"sampling.min_p": 0, "cuda_graph": False})  # the scenario's own values
    with pytest.raises(BenchError, match="--toggle sampling.seed needs the values to compare"):
        parse_toggle("sampling.seed")
    with pytest.raises(
        BenchError,
        match=r"Unknown sampling toggle: 'sampling.topk' \(did you mean 'sampling.top_k'\?\). Supported: "
        "sampling.temperature",
    ):
        parse_toggle("sampling.topk=1,2")


def test_a_sampling_variant_sets_the_scenario_and_is_checked_before_it_runs(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "model: qwen3-tiny\nengine: {device: cpu}\nworkload: {num_requests: 2, input_len: 4, output_len: 2}\n"
        "sampling: {temperature: 0.6}\n"
    )
    resolved = load_scenario(path)
    ok = Variant("sampling.top_p=0.9", {"sampling.top_p": 0.9, "chunked_prefill": False})
    cmd = child_command(resolved, [], ok, tmp_path / "run", "s", 0)
    assert ["--set", "sampling.top_p=0.9"] == cmd[
        cmd.index("sampling.top_p=0.9") - 1 : cmd.index("sampling.top_p=0.9") + 1
    ]
    assert "engine.chunked_prefill=false" in cmd
    assert config_problem(resolved, ok) is None
    bad = Variant("sampling.top_p=1.5", {"sampling.top_p": 1.5})
    assert config_problem(resolved, bad) == (
        "sampling.top_p: Input should be greater than 0 and less than or equal to 1 (got 1.5)"
    )
    greedy = Variant("sampling.top_p=0.9", {"sampling.top_p": 0.9, "sampling.temperature": 0})
    assert config_problem(resolved, greedy) is None  # sets its temperature: a cell of a temperature design
    path.write_text(path.read_text().replace("temperature: 0.6", "temperature: 0"))
    assert "sampling.top_p=0.9 changes nothing at temperature 0" in config_problem(load_scenario(path), ok)


def test_factorial_crosses_a_valued_toggle_over_its_values(cpu_config):
    vs = plan("factorial", [parse_toggle("paged_kv"), parse_toggle("max_num_seqs=2,4,8")], cpu_config)
    assert cpu_config.max_num_seqs == 256  # not among the values: the scenario itself is the baseline
    assert vs[0] == (BASELINE, {})
    assert [v.options for v in vs[1:]] == [
        {"paged_kv": on, "max_num_seqs": n} for on in (True, False) for n in (2, 4, 8)
    ]
    assert vs[1].name == "paged_kv=on+max_num_seqs=2"
    vs = plan("factorial", [parse_toggle("paged_kv"), parse_toggle("max_num_seqs=8,256")], cpu_config)
    assert len(vs) == 4 and vs[0] == (BASELINE, {"paged_kv": True, "max_num_seqs": 256})


def test_leave_one_out_takes_a_valued_toggle_only_as_an_on_off_pair(cpu_config):
    vs = plan("leave-one-out", [parse_toggle("paged_kv"), parse_toggle("max_num_seqs=8,4")], cpu_config)
    assert vs == [
        (BASELINE, {"paged_kv": True, "max_num_seqs": 8}),
        ("paged_kv=off", {"paged_kv": False, "max_num_seqs": 8}),
        ("max_num_seqs=4", {"paged_kv": True, "max_num_seqs": 4}),
    ]
    for values in ("2,4,8", "8"):
        with pytest.raises(BenchError) as exc:
            plan(
                "leave-one-out",
                [parse_toggle("paged_kv"), parse_toggle(f"max_num_seqs={values}")],
                cpu_config,
            )
        assert str(exc.value) == (
            f"--design leave-one-out turns each toggle off from all of them on, and max_num_seqs={values} has "
            "no on and off: give two values, ON,OFF (max_num_seqs=A,B), or compare its values with --design "
            "one-at-a-time or factorial"
        )


@pytest.mark.parametrize("design", ["flip", "one-at-a-time", "factorial"])
def test_a_toggle_with_only_the_baselines_value_compares_nothing(cpu_config, design):
    assert cpu_config.block_size == 16
    message = "^block_size=16 is the baseline's own value: nothing to compare; give another value$"
    with pytest.raises(BenchError, match=message):
        plan(design, [parse_toggle("block_size=16")], cpu_config)
    with pytest.raises(BenchError, match=message):  # not hidden by another toggle that does compare
        plan(design, [parse_toggle("paged_kv"), parse_toggle("block_size=16")], cpu_config)
    sampling = Sampling(temperature=0.6)
    with pytest.raises(BenchError, match="^sampling.temperature=0.6 is the baseline's own value"):
        plan(design, [parse_toggle("sampling.temperature=0.6")], cpu_config, sampling)


def test_empty_and_repeated_toggle_values_are_errors():
    for text in ("max_num_seqs=,4", "max_num_seqs=4,", "max_num_seqs=4,,8"):
        with pytest.raises(BenchError) as exc:
            parse_toggle(text)
        assert str(exc.value) == (
            f"--toggle {text}: an empty value between the commas; give each value, e.g. max_num_seqs=A,B"
        )
    with pytest.raises(
        BenchError, match=r"^--toggle max_num_seqs=4,4,8: 4 is given twice; give each value once$"
    ):
        parse_toggle("max_num_seqs=4,4,8")
    with pytest.raises(BenchError, match=r"^--toggle block_size=16,16: 16 is given twice"):
        parse_toggle("block_size=16,16")
    with pytest.raises(BenchError, match=r"^--toggle sampling.temperature=0,0.0: 0.0 is the same value as 0"):
        parse_toggle("sampling.temperature=0,0.0")
    assert parse_toggle("tuning.skinny_matmul_rows=0,1").values == (0, 1)  # 1 == True, but not a repeat
    assert parse_toggle("cuda_graph=true,false").values == (True, False)


def tiny_scenario(tmp_path, workload: str, engine: str = "{device: cpu}"):
    path = tmp_path / "s.yaml"
    path.write_text(f"model: qwen3-tiny\nengine: {engine}\nworkload: {workload}\n")
    return load_scenario(path)


def test_a_variant_the_workload_does_not_fit_is_refused_before_it_runs(tmp_path):
    from llmbench.bench.workload import build_requests

    resolved = tiny_scenario(
        tmp_path, "{num_requests: 8, input_len: {dist: uniform, min: 4, max: 40}, output_len: 10}"
    )
    sc = resolved.scenario
    longest = fit.longest_request(resolved)
    for repeat in range(3):  # what the runs will send: lengths from the seed, whatever the repeat
        specs = build_requests(sc.workload, None, 4096, sc.seed, repeat)
        assert max(s.input_len + s.max_tokens for s in specs) == longest.input_len + 10
    total = longest.input_len + 10
    assert total < 50  # the requests drawn, not the bound of their distribution
    assert config_problem(resolved, Variant("a", {"max_model_len": total})) is None
    assert config_problem(resolved, Variant("b", {"max_model_len": total - 1})) == (
        f"the workload's longest request ({longest.input_len} prompt + 10 output tokens) does not fit "
        f"max_model_len={total - 1}: give max_model_len >= {total}, or shorten the workload"
    )
    blocks = -(-total // 16)
    assert config_problem(resolved, Variant("c", {"num_kv_blocks": blocks})) is None
    assert config_problem(resolved, Variant("d", {"num_kv_blocks": blocks - 1})) == (
        f"the workload's longest request ({longest.input_len} prompt + 10 output tokens) needs {blocks} KV "
        f"blocks of 16 tokens, more than the whole pool (num_kv_blocks={blocks - 1}): give num_kv_blocks >= "
        f"{blocks}"
    )
    slab = {"paged_kv": False, "prefix_cache": False, "max_model_len": 64, "num_kv_blocks": 3}
    assert config_problem(resolved, Variant("e", slab)) == (
        "paged_kv=False reserves max_model_len=64 tokens (4 KV blocks of 16) per sequence, more than the whole "
        "pool (num_kv_blocks=3): give num_kv_blocks >= 4 or a smaller max_model_len"
    )
    assert config_problem(resolved, Variant("f", {**slab, "num_kv_blocks": 4})) is None


def test_a_shared_prefix_request_counts_its_prefix(tmp_path):
    resolved = tiny_scenario(
        tmp_path,
        "{source: shared_prefix, num_requests: 4, num_prefixes: 2, prefix_len: 20, input_len: 5, "
        "output_len: 3}",
    )
    assert config_problem(resolved, Variant("a", {"max_model_len": 28})) is None
    assert "(25 prompt + 3 output tokens) does not fit max_model_len=27" in config_problem(
        resolved, Variant("b", {"max_model_len": 27})
    )


def test_a_prompt_file_is_left_to_the_run_to_check(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": [1, 2, 3, 4, 5, 6, 7, 8]}\n')
    resolved = tiny_scenario(tmp_path, f"{{source: file, path: {prompts}, output_len: 4}}")
    assert fit.longest_request(resolved) is None  # its lengths may need the tokenizer
    assert config_problem(resolved, Variant("a", {"max_model_len": 8})) is None
