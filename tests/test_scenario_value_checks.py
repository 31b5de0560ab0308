"""Values of the wrong type or out of range in the scenario sections pydantic checks (all but ``engine:``)
are exit-2 errors that name the field, the value and what is allowed, as ``engine:`` values are: no boolean
or numeric string for a number, no number or string for a boolean, bounds on whatever a later computation
would overflow on. The same holds for the values ``ablate`` and ``profile`` take with ``--toggle``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.ablation import parse_toggle
from llmbench.bench.errors import BenchError
from llmbench.cli.app import app

runner = CliRunner()

BASE = {
    "name": "values",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 4, "input_len": 16, "output_len": 8},
}


def scenario(tmp_path: Path, **patch: object) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({**BASE, **patch}))
    return path


def invoke(*args: object):
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert "Traceback" not in res.output, res.output
    return res


def dry_run(path: Path, *sets: str):
    return invoke("run", path, "--dry-run", *(a for s in sets for a in ("--set", s)))


def error_lines(res) -> list[str]:
    assert res.exit_code == 2, res.output
    return [line.strip().removeprefix("error: ") for line in res.stderr.splitlines()]


WRONG_TYPES = [
    ("workload.num_requests=true", "workload.num_requests: Input should be a valid integer (got True)"),
    ("repeats=true", "repeats: Input should be a valid integer (got True)"),
    ("warmup=true", "warmup: Input should be a valid integer (got True)"),
    ("warmup='2'", "warmup: Input should be a valid integer (got '2')"),
    ("seed=true", "seed: Input should be a valid integer (got True)"),
    ("cpu_threads=true", "cpu_threads: Input should be a valid integer (got True)"),
    ("arrival={kind: offline, max_concurrency: true}", "arrival.max_concurrency: Input should be a valid integer (got True)"),
    ("arrival={kind: gamma, rate: 2, cv: true}", "arrival.cv: Input should be a valid number (got True)"),
    ("slo.ttft_ms=true", "slo.ttft_ms: Input should be a valid number (got True)"),
    ("sampling.temperature=true", "sampling.temperature: Input should be a valid number (got True)"),
    ("sampling.temperature='0.5'", "sampling.temperature: Input should be a valid number (got '0.5')"),
    ("sampling.top_k=true", "sampling.top_k: Input should be a valid integer (got True)"),
    ("sampling.top_p=true", "sampling.top_p: Input should be a valid number (got True)"),
    ("sampling.min_p=true", "sampling.min_p: Input should be a valid number (got True)"),
    ("sampling.seed=true", "sampling.seed: Input should be a valid integer or 'engine' (got True)"),
    ("sampling.seed=1.5", "sampling.seed: Input should be a valid integer or 'engine' (got 1.5)"),
    ("workload.input_len={dist: fixed, value: true}", "workload.input_len.value: Input should be a valid integer (got True)"),
    ("workload.token_ids={max: true}", "workload.token_ids.max: Input should be a valid integer (got True)"),
    ("sampling.ignore_eos=1", "sampling.ignore_eos: Input should be a valid boolean (got 1)"),
    ("sampling.ignore_eos='yes'", "sampling.ignore_eos: Input should be a valid boolean (got 'yes')"),
    ("telemetry.enabled='off'", "telemetry.enabled: Input should be a valid boolean (got 'off')"),
    ("telemetry.period_ms=true", "telemetry.period_ms: Input should be a valid number (got True)"),
    ("backend_options={transformers: {compile_level: true}}", "backend_options.transformers.compile_level: Input should be a valid integer (got True)"),
]  # fmt: skip


@pytest.mark.parametrize(("setting", "expected"), WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES])
def test_a_boolean_or_a_string_for_a_number_and_the_reverse_are_refused(tmp_path, setting, expected):
    lines = error_lines(dry_run(scenario(tmp_path), setting))
    assert expected in lines, lines


def test_every_wrong_type_is_named_at_once_without_pydantic_branch_names(tmp_path):
    res = dry_run(scenario(tmp_path), "sampling.seed=true", "warmup='2'", "telemetry.enabled='off'")
    lines = error_lines(res)
    assert "sampling.seed: Input should be a valid integer or 'engine' (got True)" in lines
    assert "warmup: Input should be a valid integer (got '2')" in lines
    assert "telemetry.enabled: Input should be a valid boolean (got 'off')" in lines
    assert not [line for line in lines if "seed.int" in line or "literal[" in line], lines


@pytest.mark.parametrize(
    "setting",
    [
        "warmup=2",  # --set values are YAML: an integer
        "sampling.temperature=1",  # an integer where a number is expected
        "slo.ttft_ms=500",
        "arrival={kind: gamma, rate: 2, cv: 3}",
        "workload.num_requests=1e1",  # a whole number written as YAML writes large counts, as engine: takes
        "sampling.ignore_eos=false",
        "telemetry.enabled=off",  # YAML's boolean
        "name=run-1.b_2",
    ],
)
def test_values_of_the_right_type_are_taken(tmp_path, setting):
    res = dry_run(scenario(tmp_path), setting)
    assert res.exit_code == 0, res.output


def test_a_whole_number_for_an_integer_is_that_integer(tmp_path):
    res = dry_run(scenario(tmp_path), "workload.num_requests=1e1", "warmup=2.0")
    assert res.exit_code == 0, res.output
    resolved = next(yaml.safe_load_all(res.stdout))
    assert resolved["workload"]["num_requests"] == 10 and resolved["warmup"] == 2
    lines = error_lines(dry_run(scenario(tmp_path), "warmup=2.5"))
    assert "warmup: Input should be a valid integer (got 2.5)" in lines


OUT_OF_RANGE = [
    ("warmup=99999999999999999999", "warmup: Input should be greater than or equal to 0 and less than or equal to 1000000 (got 99999999999999999999)"),
    ("repeats=99999999999999999999", "repeats: Input should be greater than or equal to 1 and less than or equal to 1000 (got 99999999999999999999)"),
    ("cpu_threads=99999999999999999999", "cpu_threads: Input should be greater than or equal to 1 and less than or equal to 1024 (got 99999999999999999999)"),
    ("arrival={kind: gamma, rate: 2, cv: 1e-300}", "arrival.cv: Input should be greater than or equal to 0.01 and less than or equal to 100 (got 1e-300)"),
    ("arrival={kind: gamma, rate: 2, cv: 1e300}", "arrival.cv: Input should be greater than or equal to 0.01 and less than or equal to 100 (got 1e+300)"),
    ("workload.input_len={dist: normal, mean: 8, std: 1e300}", "workload.input_len.std: Input should be greater than or equal to 0 and less than or equal to 10000000 (got 1e+300)"),
    ("workload.input_len={dist: lognormal, mean: 1, std: 1e300}", "workload.input_len.std: Input should be greater than or equal to 0 and less than or equal to 10000000 (got 1e+300)"),
    ("workload.input_len={dist: lognormal, mean: 1e-300, std: 1}", "workload.input_len.mean: Input should be greater than or equal to 1 and less than or equal to 10000000 (got 1e-300)"),
    ("sampling.top_p=1.5", "sampling.top_p: Input should be greater than 0 and less than or equal to 1 (got 1.5)"),
]  # fmt: skip


@pytest.mark.parametrize(("setting", "expected"), OUT_OF_RANGE, ids=[o[0] for o in OUT_OF_RANGE])
def test_a_value_out_of_range_names_the_whole_range(tmp_path, setting, expected):
    lines = error_lines(dry_run(scenario(tmp_path), setting))
    assert expected in lines, lines


def test_a_trace_time_scale_is_bounded(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,input_len,output_len\n0,8,4\n1,8,4\n")
    workload = {"source": "trace", "path": str(trace), "time_scale": 1e300}
    lines = error_lines(dry_run(scenario(tmp_path, workload=workload)))
    assert (
        "workload.time_scale: Input should be greater than 0 and less than or equal to 86400 (got 1e+300)"
        in lines
    ), lines


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a" * 101, "name: at most 100 characters (it names a results folder), got 101"),
        ("run\n", "name: must be letters, digits, '.', '_' or '-' (it names a results folder), got 'run\\n'"),
    ],
    ids=["too long", "a newline"],
)
def test_a_name_is_a_short_folder_name(tmp_path, name, expected):
    lines = error_lines(invoke("run", scenario(tmp_path, name=name), "--dry-run"))
    assert expected in lines, lines
    assert dry_run(scenario(tmp_path), f"name={'a' * 100}").exit_code == 0


def test_a_clipped_mean_is_written_short(tmp_path):
    lines = error_lines(dry_run(scenario(tmp_path), "workload.input_len={dist: normal, mean: 8, std: 1e7}"))
    (line,) = [line for line in lines if line.startswith("workload.input_len.mean:")]
    assert "have a mean of 3.98943e+06, not 8" in line and len(line) < 250, line


NON_FINITE_TOGGLES = [
    ("sampling.top_p=.nan", "--toggle sampling.top_p=.nan: sampling.top_p: Input should be a finite number (got nan)"),
    ("sampling.top_p=.inf", "--toggle sampling.top_p=.inf: sampling.top_p: Input should be a finite number (got inf)"),
    ("sampling.temperature=0,.nan", "--toggle sampling.temperature=0,.nan: sampling.temperature: Input should be a finite number (got nan)"),
    ("sampling.top_k=.nan", "--toggle sampling.top_k=.nan: sampling.top_k: Input should be a valid integer (got nan)"),
    ("sampling.min_p=.nan,.nan", "--toggle sampling.min_p=.nan,.nan: sampling.min_p: Input should be a finite number (got nan)"),
    ("sampling.seed=.nan", "--toggle sampling.seed=.nan: sampling.seed: Input should be a valid integer or 'engine' (got nan)"),
    ("gpu_memory_utilization=.nan", "--toggle gpu_memory_utilization=.nan: engine.gpu_memory_utilization: expected a number in (0, 1] or auto, got nan"),
]  # fmt: skip


@pytest.mark.parametrize(("toggle", "expected"), NON_FINITE_TOGGLES, ids=[t[0] for t in NON_FINITE_TOGGLES])
@pytest.mark.parametrize("command", ["ablate", "profile"])
def test_a_toggle_value_that_is_not_a_finite_number_is_refused(tmp_path, command, toggle, expected):
    res = invoke(command, scenario(tmp_path), "--toggle", toggle, "--out", tmp_path / "r")
    assert expected in error_lines(res)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("toggle", "expected"),
    [
        ("sampling.temperature=true", "sampling.temperature: Input should be a valid number (got True)"),
        ("sampling.top_k=true,5", "sampling.top_k: Input should be a valid integer (got True)"),
        ("sampling.top_p='0.5'", "sampling.top_p: Input should be a valid number (got '0.5')"),
        ("sampling.seed=1.5", "sampling.seed: Input should be a valid integer or 'engine' (got 1.5)"),
        ("sampling.top_p=0.5,2", "sampling.top_p: Input should be greater than 0 and less than or equal to 1 (got 2)"),
    ],
)  # fmt: skip
def test_sampling_toggle_values_are_checked_as_the_scenario_checks_them(toggle, expected):
    with pytest.raises(BenchError) as exc:
        parse_toggle(toggle)
    assert str(exc.value) == f"--toggle {toggle}: {expected}"


def test_sampling_toggle_values_are_read_as_set_values_are():
    assert parse_toggle("sampling.temperature=0,1e-3").values == (0, 0.001)
    assert parse_toggle("sampling.seed=engine,5").values == ("engine", 5)
