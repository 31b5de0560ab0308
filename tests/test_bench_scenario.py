"""Scenario files: schema, readable errors with full field paths, extends, --set, profiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.bench.errors import ScenarioError
from llmbench.bench.scenario import load_scenario
from llmbench.bench.scenario import loader as loader_mod
from llmbench.bench.scenario.loader import (
    apply_overrides,
    deep_merge,
    find_scenario,
    load_chain,
    parse_overrides,
    shipped_scenarios,
)

MINIMAL = {
    "model": "qwen3-tiny",
    "workload": {"num_requests": 4, "input_len": 16, "output_len": 4},
}


def write(tmp_path: Path, data: object, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def error_of(path: Path, overrides: list[str] | None = None, profile: str = "auto") -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, overrides or [], profile)
    return str(info.value)


def test_minimal_scenario_fills_defaults_and_takes_its_name_from_the_file(tmp_path):
    r = load_scenario(write(tmp_path, MINIMAL, "my_case.yaml"))
    sc = r.scenario
    assert sc.name == "my_case"
    assert sc.workload.input_len.dist == "fixed" and sc.workload.input_len.value == 16
    assert sc.arrival.kind == "offline" and sc.arrival.points == [{"kind": "offline"}]
    assert sc.sampling.temperature == 0.0 and sc.sampling.ignore_eos
    assert sc.repeats == 1 and sc.telemetry.period_ms == 200


def test_error_names_the_full_field_path_and_what_is_allowed(tmp_path):
    data = {
        **MINIMAL,
        "workload": {**MINIMAL["workload"], "input_len": {"dist": "uniform", "min": 100, "max": 50}},
    }
    msg = error_of(write(tmp_path, data))
    assert "workload.input_len.max: must be >= min (100), got 50" in msg


@pytest.mark.parametrize(
    "setting, expected",
    [
        ("temperature=-0.5", "sampling.temperature: Input should be greater than or equal to 0"),
        ("top_k=-2", "sampling.top_k: Input should be greater than or equal to -1"),
        ("top_p=0", "sampling.top_p: Input should be greater than 0"),
        ("top_p=1.5", "sampling.top_p: Input should be greater than 0 and less than or equal to 1 (got 1.5)"),
        ("min_p=-0.1", "sampling.min_p: Input should be greater than or equal to 0"),
        (
            "min_p=2",
            "sampling.min_p: Input should be greater than or equal to 0 and less than or equal to 1 (got 2)",
        ),
        ("seed=sometimes", "sampling.seed"),
    ],
)
def test_bad_sampling_settings_name_the_field_and_the_bound(tmp_path, setting, expected):
    assert expected in error_of(write(tmp_path, MINIMAL), [f"sampling.{setting}"])


def test_sampling_takes_min_p_and_a_seed_setting(tmp_path):
    path = write(tmp_path, MINIMAL)
    sc = load_scenario(path, ["sampling.min_p=0.05", "sampling.seed=7", "sampling.top_k=-1"]).scenario
    assert (sc.sampling.min_p, sc.sampling.seed, sc.sampling.top_k) == (0.05, 7, -1)
    assert load_scenario(path, ["sampling.seed=engine"]).scenario.sampling.seed == "engine"


def test_unknown_key_is_an_error_that_lists_the_allowed_keys(tmp_path):
    data = {**MINIMAL, "workload": {**MINIMAL["workload"], "num_reqs": 3}}
    msg = error_of(write(tmp_path, data))
    assert (
        "workload.num_reqs: unknown key (did you mean 'num_requests'?); allowed here: source, num_requests"
        in msg
    )


@pytest.mark.parametrize(
    "key,where",
    [
        ("temperature", "sampling.temperature"),  # a section's key at the top level
        ("max_num_seqs", "engine.max_num_seqs"),  # an engine option
        ("cuda_graph_buckets", "engine.tuning.cuda_graph_buckets"),  # a tuning knob, two sections in
        ("workload.temperature", "sampling.temperature"),  # another section's key
        ("arrival.input_len", "workload.input_len"),
        ("tuning", "engine.tuning"),  # the tuning section at the top level
    ],
)
def test_a_key_set_in_the_wrong_section_names_the_section_that_holds_it(tmp_path, key, where):
    msg = error_of(write(tmp_path, MINIMAL), [f"{key}=3"])
    assert f"{key}: unknown key (did you mean {where!r}?); allowed here:" in msg


def test_a_key_no_section_holds_or_several_hold_gets_no_guess(tmp_path):
    # "min" is a field of several ranges (input_len, output_len): no single section to name
    for key in ("nonsense", "min"):
        msg = error_of(write(tmp_path, MINIMAL), [f"{key}=3"])
        assert f"{key}: unknown key; allowed here:" in msg


def test_unknown_top_level_key_and_unknown_engine_option(tmp_path):
    msg = error_of(write(tmp_path, {**MINIMAL, "engin": {}, "engine": {"cuda_graphs": True}}))
    assert "engin: unknown key (did you mean 'engine'?); allowed here:" in msg
    assert "engine.cuda_graphs: unknown engine option (did you mean 'cuda_graph'?); valid:" in msg
    assert "cuda_graph," in msg


def test_every_bad_engine_value_is_named_with_its_full_path_at_once(tmp_path):
    engine = {
        "dtype": "float13",
        "max_num_seqs": -5,
        "cuda_graph": "yes please",
        "block_size": 2.5,
        "skinny_fusion": "none",
        "tuning": {"skinny_matmul_rows": "one", "warp": True},
    }
    msg = error_of(write(tmp_path, {**MINIMAL, "engine": engine}))
    assert sorted(msg.splitlines()[1:]) == [
        "  engine.block_size: expected an integer in 1..65536, got 2.5",
        "  engine.cuda_graph: expected true, false or auto, got 'yes please'",
        "  engine.dtype: unsupported 'float13'; supported: auto, float32, float16, bfloat16",
        "  engine.max_num_seqs: expected an integer in 1..1048576, got -5",
        "  engine.skinny_fusion: a tuning knob: set it under tuning (tuning.skinny_fusion)",
        "  engine.tuning.skinny_matmul_rows: expected an integer in 0..256 or auto, got 'one'",
        "  engine.tuning.warp: unknown tuning knob; valid: compile_mode, cuda_graph_buckets, "
        "decode_longest_first, decode_split_tokens, decode_uniform_tiling, graph_sampling, kv_cache_scale, "
        "mixed_step_decodes, prefill_graph_tokens, prefill_graphs, prefill_narrow_tiles_up_to, programmatic_launch_rows, skinny_fusion, skinny_matmul_rows, tp_all_reduce, tp_fuse_matmul, tp_fuse_norm",
    ]


def test_engine_values_given_with_set_are_checked_with_the_file(tmp_path):
    path = write(tmp_path, {**MINIMAL, "workload": {**MINIMAL["workload"], "num_requests": 0}})
    msg = error_of(path, ["engine.max_num_seqs=abc", "engine.tuning.skinny_fusion=norm"])
    assert msg.splitlines()[1:] == [  # (in the schema's order of fields)
        "  engine.max_num_seqs: expected an integer in 1..1048576, got 'abc'",
        "  engine.tuning.skinny_fusion: unsupported 'norm'; supported: auto, all, silu, none",
        "  workload.num_requests: Input should be greater than or equal to 1 and less than or equal to 1000000 (got 0)",
    ]


def test_tuning_knobs_are_set_in_the_file_or_with_set(tmp_path):
    path = write(tmp_path, {**MINIMAL, "engine": {"tp": 1, "tuning": {"skinny_matmul_rows": 0}}})
    sc = load_scenario(path, ["engine.tuning.skinny_fusion=none"]).scenario
    assert sc.engine == {"tp": 1, "tuning": {"skinny_matmul_rows": 0, "skinny_fusion": "none"}}


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (
            {"arrival": {"kind": "poisson", "rate": -2}},
            "arrival.rate: rates are requests per second and must be > 0",
        ),
        ({"arrival": {"kind": "poisson"}}, "arrival.rate: required for kind 'poisson'"),
        (
            {"arrival": {"kind": "poisson", "rate": "fast"}},
            "arrival.rate: expected a number or a list of them (a sweep), got 'fast'",
        ),
        (
            {"arrival": {"kind": "concurrency", "concurrency": True}},
            "arrival.concurrency: expected an integer or a list of them (a sweep), got True",
        ),
        ({"arrival": {"kind": "offline", "rate": 3}}, "arrival.rate: does not apply to kind 'offline'"),
        ({"arrival": {"kind": "gamma", "rate": 2}}, "arrival.cv: required for kind 'gamma'"),
        (
            {"arrival": {"kind": "concurrency", "concurrency": [4, 0]}},
            "arrival.concurrency: concurrency is requests",
        ),
        ({"arrival": {"kind": "bursty"}}, "arrival.kind: Input should be 'offline', 'poisson', 'gamma'"),
        ({"sampling": {"temperature": "hot"}}, "sampling.temperature: Input should be a valid number"),
        (
            {"sampling": {"temperature": float("inf")}},
            "sampling.temperature: Input should be a finite number",
        ),
        ({"sampling": {"top_p": float("nan")}}, "sampling.top_p: Input should be a finite number"),
        (
            {"arrival": {"kind": "gamma", "rate": 5, "cv": float("inf")}},
            "arrival.cv: Input should be a finite",
        ),
        ({"seed": -1}, "seed: Input should be greater than or equal to 0"),
        (
            {"sampling": {"seed": "abc"}},
            "sampling.seed: Input should be a valid integer or 'engine' (got 'abc')",
        ),
        (
            {"workload": {"num_requests": 2, "input_len": "long", "output_len": 4}},
            "workload.input_len: expected a length in tokens (an integer) or a distribution",
        ),
        (
            {"arrival": {"kind": "poisson", "rate": [5, 2, 5]}},
            "arrival.rate: each rate names one point of the sweep; 5 is given twice",
        ),
        ({"arrival": {"kind": "poisson", "rate": [True]}}, "arrival.rate: expected numbers, got [True]"),
        ({"repeats": 0}, "repeats: Input should be greater than or equal to 1"),
        (
            {"workload": {"num_requests": "many", "input_len": 4, "output_len": 4}},
            "workload.num_requests: Input should be a valid integer",
        ),
        (
            {"workload": {"num_requests": 2, "input_len": {"dist": "normal", "mean": 5}, "output_len": 4}},
            "workload.input_len.std: required for dist 'normal'",
        ),
        (
            {
                "workload": {
                    "num_requests": 2,
                    "input_len": {"dist": "fixed", "value": 4, "std": 1},
                    "output_len": 4,
                }
            },
            "workload.input_len.std: does not apply to dist 'fixed'",
        ),
        (
            {"workload": {"num_requests": 2, "input_len": 4}},
            "workload.output_len: required for source 'synthetic'",
        ),
        ({"workload": {"source": "file"}}, "workload.path: required for source 'file'"),
        ({"workload": {"source": "file", "path": "nowhere.jsonl"}}, "workload.path: file not found"),
        ({"arrival": {"kind": "trace"}}, "arrival: kind 'trace' replays a trace's times"),
        ({"name": "has space"}, "name: must be letters, digits"),
    ],
)
def test_bad_values_name_their_path(tmp_path, patch, expected):
    assert expected in error_of(write(tmp_path, {**MINIMAL, **patch}))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model: [unclosed\n", "not valid YAML at line"),
        ("", "the file is empty"),
        ("# only a comment\n", "the file is empty"),
        ("- a\n- b\n", "a scenario must be a mapping of keys (name, model, workload, ...), got a list"),
        ("just a string\n", "got a str"),
    ],
)
def test_unreadable_files_say_what_is_wrong(tmp_path, text, expected):
    assert expected in error_of(write(tmp_path, text))


def test_missing_scenario_file_lists_the_shipped_ones(tmp_path):
    with pytest.raises(
        ScenarioError, match=r"Scenario file not found: .*nope.yaml.*Shipped scenarios: .*chat"
    ):
        find_scenario(tmp_path / "nope.yaml")
    with pytest.raises(ScenarioError, match=r"^Scenario file not found: chta \(did you mean 'chat'\?\)\."):
        find_scenario("chta")


def test_shipped_scenarios_are_found_by_name():
    assert find_scenario("chat").name == "chat.yaml"
    assert find_scenario("scenarios/throughput.yaml").name == "throughput.yaml"


def test_extends_merges_the_parent_under_the_child_relative_to_the_child(tmp_path):
    (tmp_path / "base").mkdir()
    write(tmp_path / "base", {**MINIMAL, "name": "parent", "seed": 7, "slo": {"ttft_ms": 100}}, "parent.yaml")
    child = write(
        tmp_path, {"extends": "base/parent.yaml", "workload": {"num_requests": 9}, "slo": {"tpot_ms": 5}}
    )
    sc = load_scenario(child).scenario
    assert sc.name == "s"  # a child is its own scenario
    assert sc.seed == 7 and sc.workload.num_requests == 9 and sc.workload.input_len.value == 16
    assert sc.slo.ttft_ms == 100 and sc.slo.tpot_ms == 5


def test_extends_cycle_and_missing_parent_are_errors(tmp_path):
    write(tmp_path, {"extends": "b.yaml", **MINIMAL}, "a.yaml")
    write(tmp_path, {"extends": "a.yaml"}, "b.yaml")
    assert "extends: cycle" in error_of(tmp_path / "a.yaml")
    assert "extends: scenario file not found" in error_of(write(tmp_path, {"extends": "zz.yaml"}, "c.yaml"))


def test_relative_workload_paths_resolve_against_the_file_that_names_them(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "p.txt").write_text("hello\n")
    (tmp_path / "sub").mkdir()
    parent = {"model": "qwen3-tiny", "workload": {"source": "file", "path": "../data/p.txt", "output_len": 3}}
    write(tmp_path / "sub", parent, "parent.yaml")
    child = write(tmp_path, {"extends": "sub/parent.yaml"})
    assert Path(load_scenario(child).scenario.workload.path) == (tmp_path / "data" / "p.txt").resolve()


def test_set_overrides_parse_yaml_values_and_nest():
    sets = [
        "workload.num_requests=64",
        "arrival.rate=[1, 2.5]",
        "engine.cuda_graph=false",
        "model=qwen3-tiny",
        "description=",
    ]
    assert apply_overrides({"workload": {"num_requests": 3, "input_len": 4}}, parse_overrides(sets)) == {
        "workload": {"num_requests": 64, "input_len": 4},
        "arrival": {"rate": [1, 2.5]},
        "engine": {"cuda_graph": False},
        "model": "qwen3-tiny",
        "description": None,
    }


def test_a_mapping_given_with_set_replaces_rather_than_merges():
    data = {"arrival": {"kind": "poisson", "rate": [4]}}
    out = apply_overrides(data, parse_overrides(["arrival={kind: concurrency, concurrency: 2}"]))
    assert out == {"arrival": {"kind": "concurrency", "concurrency": 2}}
    assert data == {"arrival": {"kind": "poisson", "rate": [4]}}


@pytest.mark.parametrize("bad", ["novalue", "=3", "a..b=1"])
def test_malformed_set_is_an_error(bad):
    with pytest.raises(ScenarioError, match="--set"):
        parse_overrides([bad])


def test_set_overrides_win_and_are_validated(tmp_path):
    path = write(tmp_path, MINIMAL)
    sc = load_scenario(path, ["arrival.kind=poisson", "arrival.rate=[1, 2]", "repeats=2"]).scenario
    assert [p["rate"] for p in sc.arrival.points] == [1.0, 2.0] and sc.repeats == 2
    msg = error_of(path, ["workload.num_requests=-1"])
    assert (
        "and --set overrides" in msg
        and "workload.num_requests: Input should be greater than or equal to 1" in msg
    )


PROFILED = {
    **MINIMAL,
    "model": "qwen3-0.6b",
    "profiles": {
        "cpu": {"when": "cpu", "overrides": {"model": "qwen3-tiny", "workload": {"num_requests": 2}}},
        "gpu": {"when": "gpu", "overrides": {"repeats": 3}},
        "small": {"overrides": {"workload": {"num_requests": 1}}},
    },
}


def test_cpu_profile_is_chosen_automatically_without_a_gpu_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: False)
    r = load_scenario(write(tmp_path, PROFILED))
    assert r.profile.name == "cpu" and "no CUDA device" in r.profile.reason
    assert r.scenario.model == "qwen3-tiny" and r.scenario.workload.num_requests == 2


def test_gpu_profile_is_chosen_with_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: True)
    r = load_scenario(write(tmp_path, PROFILED))
    assert r.profile.name == "gpu" and r.scenario.repeats == 3 and r.scenario.model == "qwen3-0.6b"


def test_engine_device_decides_the_profile_and_set_beats_the_profile(tmp_path, monkeypatch):
    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: True)
    r = load_scenario(write(tmp_path, PROFILED), ["engine.device=cpu", "workload.num_requests=5"])
    assert r.profile.name == "cpu" and "engine.device is 'cpu'" in r.profile.reason
    assert r.scenario.workload.num_requests == 5


def test_profile_by_name_none_and_unknown(tmp_path):
    path = write(tmp_path, PROFILED)
    assert load_scenario(path, profile="small").scenario.workload.num_requests == 1
    r = load_scenario(path, profile="none")
    assert r.profile.name is None and r.scenario.model == "qwen3-0.6b"
    assert "no such profile; this scenario has: cpu, gpu, small" in error_of(path, profile="fast")


def test_a_broken_profile_is_reported_even_when_another_one_applies(tmp_path, monkeypatch):
    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: False)
    data = {
        **PROFILED,
        "profiles": {**PROFILED["profiles"], "gpu": {"when": "gpu", "overrides": {"repeats": -1}}},
    }
    msg = error_of(write(tmp_path, data))
    assert "with profile 'gpu'" in msg and "repeats: Input should be greater than or equal to 1" in msg


@pytest.mark.parametrize("path", shipped_scenarios(recursive=True), ids=lambda p: p.stem)
def test_every_shipped_scenario_and_every_profile_of_it_is_valid(path):
    r = load_scenario(path)
    profiles = list(load_chain(path).get("profiles", {}))
    assert "cpu" in profiles, "every shipped scenario has a cpu profile so it runs without a GPU"
    for name in [*profiles, "none"]:
        assert load_scenario(path, profile=name).scenario.name == r.scenario.name


def test_deep_merge_replaces_non_mappings_and_leaves_inputs_alone():
    base = {"a": {"b": 1, "c": [1]}, "d": 1}
    top = {"a": {"c": [2]}, "d": {"e": 1}}
    assert deep_merge(base, top) == {"a": {"b": 1, "c": [2]}, "d": {"e": 1}}
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1}


scalars = st.one_of(
    st.integers(-1000, 1000),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(alphabet="xyz-_ ", min_size=1, max_size=6).filter(lambda t: t.strip() == t),
)


@settings(max_examples=80, deadline=None)
@given(
    st.dictionaries(st.text(alphabet="abcdefgh_", min_size=1, max_size=6), scalars, min_size=1, max_size=4)
)
def test_set_override_round_trips_any_yaml_scalar(values):
    dump = lambda v: yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()  # noqa: E731
    parsed = apply_overrides({}, parse_overrides([f"engine.opts.{k}={dump(v)}" for k, v in values.items()]))
    assert parsed == {"engine": {"opts": values}}


def test_yaml_reads_exponent_numbers_as_numbers_and_refuses_a_key_given_twice(tmp_path):
    from llmbench.bench.scenario.loader import parse_overrides, parse_yaml, read_mapping

    assert parse_yaml("a: 1e9\nb: 5e-1\nc: [2E3, 7]\nd: 1e\n") == {
        "a": 1e9,
        "b": 0.5,
        "c": [2000.0, 7],
        "d": "1e",
    }
    assert parse_overrides(["engine.kv_cache_memory=1e9"])[0].value == 1e9
    path = tmp_path / "twice.yaml"
    path.write_text("name: twice\nrepeats: 1\nrepeats: 5\n")
    with pytest.raises(
        ScenarioError, match="line 3, column 1: the key 'repeats' is given twice in one mapping"
    ):
        read_mapping(path)


def test_extends_takes_a_shipped_scenario_by_name_and_a_folder_is_not_a_file(tmp_path):
    child = tmp_path / "mine.yaml"
    child.write_text("extends: chat\nname: mine\nrepeats: 1\n")
    assert load_scenario(child).scenario.name == "mine"
    (tmp_path / "sub").mkdir()
    child.write_text("extends: sub\nname: mine\n")
    with pytest.raises(ScenarioError, match=r"mine.yaml: extends: .*/sub is not a file"):
        load_scenario(child)
    child.write_text(f"name: mine\nmodel: qwen3-tiny\nworkload: {{source: file, path: {tmp_path}}}\n")
    with pytest.raises(ScenarioError, match=r"workload.path: .* is a folder; give the file in it to read"):
        load_scenario(child)


def test_two_profiles_for_one_device_are_an_error_unless_one_is_named(tmp_path):
    path = tmp_path / "two.yaml"
    cpu = {"when": "cpu", "overrides": {"repeats": 1}}
    path.write_text(yaml.safe_dump({"name": "two", "model": "qwen3-tiny", "engine": {"device": "cpu"},
                                    "workload": {"num_requests": 2, "input_len": 8, "output_len": 4},
                                    "profiles": {"a": cpu, "b": {**cpu, "overrides": {"repeats": 2}}}}))  # fmt: skip
    with pytest.raises(ScenarioError, match=r"profiles 'a', 'b' all apply when: cpu; keep one, or pick one"):
        load_scenario(path)
    assert load_scenario(path, profile="b").scenario.repeats == 2


TRACE_ROWS = "timestamp,input_len,output_len\n100,5,2\n100.5,6,3\n102,7,4\n"


def trace_scenario(tmp_path: Path, **patch) -> Path:
    (tmp_path / "t.csv").write_text(TRACE_ROWS)
    return write(tmp_path, {"model": "qwen3-tiny", "workload": {"source": "trace", "path": "t.csv"}, **patch})


def test_a_trace_source_without_arrivals_replays_its_timestamps(tmp_path):
    # before: arrival defaulted to offline, and every row was sent at t=0
    from llmbench.bench.arrivals import arrival_offsets
    from llmbench.bench.workload import build_requests

    for path in (trace_scenario(tmp_path), trace_scenario(tmp_path, arrival={"rate": None})):
        sc = load_scenario(path).scenario
        assert sc.arrival.kind == "trace"
        requests = build_requests(sc.workload, None, 4096, sc.seed)
        offsets = arrival_offsets(sc.arrival.points[0], requests, np.random.default_rng(0))
        assert offsets == [0.0, 0.5, 2.0]
    sc = load_scenario(
        trace_scenario(tmp_path, workload={"source": "trace", "path": "t.csv", "time_scale": 2})
    )
    assert sc.scenario.arrival.kind == "trace"  # time_scale needs no arrival written either


def test_a_trace_source_under_other_arrivals_keeps_them_and_refuses_time_scale(tmp_path):
    sc = load_scenario(trace_scenario(tmp_path, arrival={"kind": "poisson", "rate": 5})).scenario
    assert sc.arrival.kind == "poisson"  # the trace's lengths, sent at Poisson times
    assert (
        load_scenario(trace_scenario(tmp_path), ["arrival={kind: offline}"]).scenario.arrival.kind
        == "offline"
    )
    scaled = {"source": "trace", "path": "t.csv", "time_scale": 0.5}
    msg = error_of(trace_scenario(tmp_path, workload=scaled, arrival={"kind": "poisson", "rate": 5}))
    assert (
        "workload.time_scale: stretches the trace's timestamps, which only arrival.kind 'trace' replays; "
        "with arrival.kind 'poisson' it would change nothing (drop it, or leave arrival.kind to its default, "
        "'trace')"
    ) in msg
    assert "workload.time_scale" in error_of(
        trace_scenario(tmp_path), ["workload.time_scale=2", "arrival.kind=sweep"]
    )


def test_a_profile_that_changes_a_trace_sources_arrivals_says_what_they_were(tmp_path, monkeypatch):
    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: False)
    profile = {"when": "cpu", "overrides": {"arrival": {"kind": "poisson", "rate": 4}}}
    r = load_scenario(trace_scenario(tmp_path, profiles={"cpu": profile}))
    assert r.profile.changes == "arrival trace -> poisson 4/s"


@pytest.mark.parametrize(
    "dist,fits",
    [
        ({"dist": "normal", "mean": 3, "std": 5}, False),  # clipped at 1: lengths average 4.15
        ({"dist": "lognormal", "mean": 256, "std": 1000, "max": 1024}, False),  # its tail cut: 177
        ({"dist": "normal", "mean": 6, "std": 2, "min": 2, "max": 12}, True),
        ({"dist": "lognormal", "mean": 512, "std": 384, "min": 16, "max": 4096}, True),  # chat's prompts
    ],
)
def test_a_declared_mean_the_clipping_would_move_is_an_error(dist, fits):
    import math

    import numpy as np

    from llmbench.bench.scenario.workload_schema import LengthDist, clipped_mean

    low, high = dist.get("min", 1), dist.get("max", math.inf)
    rng = np.random.default_rng(0)
    if dist["dist"] == "normal":
        draws = rng.normal(dist["mean"], dist["std"], 400_000)
    else:
        s2 = math.log1p((dist["std"] / dist["mean"]) ** 2)
        draws = rng.lognormal(math.log(dist["mean"]) - s2 / 2, math.sqrt(s2), 400_000)
    sampled = float(np.clip(draws, low, high).mean())
    assert clipped_mean(dist["dist"], dist["mean"], dist["std"], low, high) == pytest.approx(
        sampled, rel=0.01
    )
    if fits:
        LengthDist(**dist)
    else:
        with pytest.raises(ValueError, match="have a mean of") as info:
            LengthDist(**dist)
        said = float(str(info.value).split("have a mean of ")[1].split(",")[0])
        assert said == pytest.approx(sampled, rel=0.02)  # said to six significant digits


def test_an_engine_option_set_under_tuning_is_pointed_to_engine(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL), ["engine.tuning.cuda_graph=true"])
    assert msg.splitlines()[1:] == [
        "  engine.tuning.cuda_graph: an engine option: set it under engine (cuda_graph), not tuning"
    ]
    from llmbench import LLM
    from llmbench.engine.config import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"^tuning.cuda_graph: an engine option: set it under engine \(cuda_graph\), not tuning$",
    ):
        LLM("qwen3-tiny", tuning={"cuda_graph": True})


def test_every_profiles_mistakes_are_reported_at_once_the_files_own_once(tmp_path, monkeypatch):
    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: False)
    data = {
        **MINIMAL,
        "warmup": -1,  # the file's own mistake: shown once, with the profile that applies
        "profiles": {
            "cpu": {"when": "cpu", "overrides": {"workload": {"num_requets": 3}}},
            "gpu": {"when": "gpu", "overrides": {"workload": {"num_requets": 3}, "egnine": {}}},
        },
    }
    path = write(tmp_path, data)
    unknown = "workload.num_requets: unknown key (did you mean 'num_requests'?); allowed here:"
    lines = error_of(path).splitlines()
    assert lines[0] == f"Invalid scenario {path} (with profile 'cpu'):"
    assert lines[1].startswith(f"  {unknown}") and "warmup" in lines[2]
    assert lines[3] == f"Invalid scenario {path} (with profile 'gpu'):"
    assert lines[4].startswith(f"  {unknown}") and lines[5].startswith("  egnine: unknown key")
    assert len(lines) == 6


def test_a_gpu_option_is_refused_on_the_cpu_as_given_but_not_from_a_gpu_profile(tmp_path, monkeypatch):
    """Set is set (0.9 is what auto gives on a GPU, and still refused on the CPU); a profile for GPU machines
    may set it, and a CPU profile may unset the file's with auto."""
    from llmbench.bench.backends.engine import engine_config
    from llmbench.engine.config import ConfigError

    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: False)
    gpu_only = {"gpu": {"when": "gpu", "overrides": {"engine": {"gpu_memory_utilization": 0.9}}}}
    sc = load_scenario(write(tmp_path, {**MINIMAL, "profiles": gpu_only})).scenario
    assert engine_config(sc).device == "cpu"
    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: True)
    assert load_scenario(write(tmp_path, {**MINIMAL, "profiles": gpu_only})).scenario.engine == {
        "gpu_memory_utilization": 0.9
    }
    monkeypatch.setattr(loader_mod, "_cuda_available", lambda: False)
    everywhere = {**MINIMAL, "engine": {"device": "cpu", "gpu_memory_utilization": 0.9}}
    with pytest.raises(
        ConfigError, match=r"^gpu_memory_utilization=0.9 sizes the KV pool from a GPU's memory"
    ):
        engine_config(load_scenario(write(tmp_path, everywhere)).scenario)
    unset = {"cpu": {"when": "cpu", "overrides": {"engine": {"gpu_memory_utilization": "auto"}}}}
    assert (
        engine_config(load_scenario(write(tmp_path, {**everywhere, "profiles": unset})).scenario).device
        == "cpu"
    )
