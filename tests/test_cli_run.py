"""``llmbench run`` end to end through Typer's CliRunner on qwen3-tiny: results, dry runs, clean errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from llmbench.bench import driver as driver_mod
from llmbench.bench.scenario.loader import shipped_scenarios
from llmbench.bench.store import find_runs, load_run
from llmbench.cli.app import app
from llmbench.cli.progress import RichRunEvents

runner = CliRunner()

TINY = {
    "name": "tiny",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 6, "input_len": {"dist": "uniform", "min": 8, "max": 32}, "output_len": 4},
    "arrival": {"kind": "poisson", "rate": 50},
    "warmup": 1,
    "slo": {"ttft_ms": 5000},
    "telemetry": {"period_ms": 20},
}


def scenario(tmp_path: Path, **patch) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, **patch}))
    return path


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def only_run(root: Path):
    runs, problems = find_runs([root])
    assert len(runs) == 1 and not problems, (runs, problems)
    return runs[0]


def test_run_writes_a_complete_result_folder(tmp_path):
    res = invoke("run", scenario(tmp_path), "--out", tmp_path / "results")
    assert res.exit_code == 0, res.output
    assert "TTFT p50 (ms)" in res.stdout and "results:" in res.stdout
    assert "profile: none" in res.stderr
    run = only_run(tmp_path / "results")
    assert run.path.parent == tmp_path / "results" / "tiny" and run.path.name.endswith("-default")
    meta = run.meta
    assert meta["status"] == "complete" and meta["variant"] == "default" and meta["seed"] == 0
    assert meta["scenario"]["workload"]["num_requests"] == 6 and meta["engine_config"]["device"] == "cpu"
    # what ran, every choice made: nothing left "auto" (only the KV pool's size is the start-up's to measure)
    config = meta["engine_config"]
    assert config["max_model_len"] == 4096 and config["attention_backend"] == "sdpa"
    assert config["tuning"]["skinny_fusion"] == "none" and config["tuning"]["tp_all_reduce"] == "none"
    assert "auto" not in json.dumps(config) and meta["engine_options"] == {"device": "cpu"}
    assert {"python", "torch", "triton", "transformers", "llmbench"} <= set(meta["versions"])
    assert "commit" in meta["git"] and meta["command_line"] and meta["model_info"]["name"] == "qwen3-tiny"
    from llmbench.bench.hardware import source_digest

    assert meta["git"]["source"] == source_digest()  # the code that ran, whatever git says
    assert meta["startup"]["kv_num_blocks"] > 0
    reqs = run.table("requests")
    assert len(reqs) == 6 and set(reqs["finish_reason"]) == {"length"}
    assert all(len(t) == 4 for t in reqs["token_ids"]) and reqs["input_len"].between(8, 32).all()
    point = run.summary["points"][0]
    assert point["label"] == "rate=50"
    # The summary's figures are the ones the request table gives.
    assert point["metrics"]["ttft_p50"]["value"] == pytest.approx(np.percentile(reqs["ttft"], 50))
    assert point["metrics"]["num_completed"]["value"] == 6
    assert point["metrics"]["ttft_p50"]["ci"] is None  # one repeat: no run-to-run variance, no interval
    steps = run.table("steps")
    assert len(steps) > 0 and (steps["duration"] > 0).all()
    tele = run.table("telemetry")
    assert len(tele) > 0 and tele["gpu_util"].isna().all() and (tele["rss"] > 0).all()
    assert "gpu_telemetry" in run.summary["unavailable"]


def test_repeats_and_sweeps(tmp_path):
    path = scenario(tmp_path, arrival={"kind": "poisson", "rate": [40, 80]}, warmup=0)
    res = invoke("run", path, "--out", tmp_path / "r", "--repeats", "2", "--quiet")
    assert res.exit_code == 0, res.output
    run = only_run(tmp_path / "r")
    assert [p["label"] for p in run.summary["points"]] == ["rate=40", "rate=80"]
    assert all(len(p["repeats"]) == 2 for p in run.summary["points"])
    assert run.summary["points"][0]["metrics"]["output_throughput"]["ci"] == "repeats"
    reqs = run.table("requests")
    r0 = reqs[(reqs["point"] == "rate=40") & (reqs["repeat"] == 0)].set_index("request_id")
    r1 = reqs[(reqs["point"] == "rate=40") & (reqs["repeat"] == 1)].set_index("request_id")
    assert (r0["input_len"] == r1["input_len"]).all()  # same lengths, fresh prompt tokens each repeat


def test_fixed_concurrency_and_set_overrides(tmp_path):
    path = scenario(tmp_path)
    res = invoke("run", path, "--out", tmp_path / "r", "-q", "--set", "arrival={kind: concurrency, concurrency: 2}",
                 "--set", "workload.output_len=3", "--variant", "c2")  # fmt: skip
    assert res.exit_code == 0, res.output
    run = only_run(tmp_path / "r")
    assert run.meta["variant"] == "c2" and run.summary["points"][0]["label"] == "concurrency=2"
    assert all(len(t) == 3 for t in run.table("requests")["token_ids"])
    assert run.meta["overrides"] == ["arrival={kind: concurrency, concurrency: 2}", "workload.output_len=3"]


@pytest.mark.parametrize("path", shipped_scenarios(recursive=True), ids=lambda p: p.stem)
def test_every_shipped_scenario_passes_dry_run(path):
    res = invoke("run", path, "--dry-run")
    assert res.exit_code == 0, res.output
    docs = list(yaml.safe_load_all(res.stdout))
    assert docs[0]["name"] and docs[0]["workload"] and docs[1]["device"] in ("cpu", "cuda")
    if not torch.cuda.is_available():  # every shipped scenario has (or inherits) a cpu profile
        assert "# profile: cpu — the run lands on the CPU (torch sees no CUDA device)" in res.stdout


def test_dry_run_defaults_to_chat_and_shows_the_profile(tmp_path):
    res = invoke("run", "--dry-run")
    assert res.exit_code == 0 and "name: chat" in res.stdout and "# profile:" in res.stdout
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "patch,message",
    [
        ({"workload": {**TINY["workload"], "input_len": 5000}}, "does not fit max_model_len"),
        ({"workload": {**TINY["workload"], "token_ids": {"min": 0, "max": 10**6}}}, "is past the model's vocabulary"),
        ({"workload": {"source": "file", "path": "no-such-prompts.jsonl", "num_requests": 2, "output_len": 4}}, "no-such-prompts.jsonl"),
    ],
    ids=["too long", "ids past the vocabulary", "missing prompt file"],
)  # fmt: skip
def test_dry_run_refuses_what_run_refuses_before_any_cost(tmp_path, patch, message):
    # a scenario --dry-run prints is one run would start: every check run makes before it starts a backend
    path = scenario(tmp_path, **patch)
    for args in (("--dry-run",), ("--out", tmp_path / "r")):
        res = invoke("run", path, *args)
        assert res.exit_code == 2 and message in " ".join(res.output.split()), (args, res.output)
    assert not (tmp_path / "r").exists()


BAD = [
    ("broken.yaml", "model: [oops\n", "not valid YAML at line"),
    ("empty.yaml", "", "the file is empty"),
    ("list.yaml", "- 1\n- 2\n", "must be a mapping"),
    ("unknown.yaml", yaml.safe_dump({**TINY, "warmups": 3}), "warmups: unknown key (did you mean 'warmup'?); allowed here:"),
    ("type.yaml", yaml.safe_dump({**TINY, "repeats": "twice"}), "repeats: Input should be a valid integer"),
    ("rate.yaml", yaml.safe_dump({**TINY, "arrival": {"kind": "poisson", "rate": -1}}), "arrival.rate: rates are requests per second and must be > 0"),
    ("path.yaml", yaml.safe_dump({**TINY, "workload": {"source": "file", "path": "gone.jsonl"}}), "workload.path: file not found"),
    ("range.yaml", yaml.safe_dump({**TINY, "workload": {**TINY["workload"], "input_len": {"dist": "uniform", "min": 9, "max": 3}}}), "workload.input_len.max: must be >= min (9), got 3"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_scenarios_exit_2_with_a_clear_message(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    res = invoke("run", path, "--out", tmp_path / "r")
    assert res.exit_code == 2
    assert "error:" in res.stderr and expected in res.stderr
    assert not (tmp_path / "r").exists()


def test_missing_scenario_file(tmp_path):
    res = invoke("run", tmp_path / "absent.yaml")
    assert res.exit_code == 2 and "Scenario file not found" in res.stderr and "chat" in res.stderr


def test_malformed_set_and_unknown_profile(tmp_path):
    res = invoke("run", scenario(tmp_path), "--set", "repeats")
    assert res.exit_code == 2 and "--set expects KEY.PATH=VALUE" in res.stderr
    res = invoke("run", scenario(tmp_path), "--profile", "turbo")
    assert res.exit_code == 2 and "no such profile" in res.stderr


def test_engine_config_error_is_a_clean_cli_error(tmp_path):
    res = invoke("run", scenario(tmp_path), "--out", tmp_path / "r", "--set", "engine.cuda_graph=true")
    assert res.exit_code == 2
    assert (
        "engine options: cuda_graph=True needs a CUDA device: CUDA Graphs cannot run on the CPU" in res.stderr
    )
    assert not (tmp_path / "r").exists()


def test_bad_engine_values_fail_before_a_results_folder_is_made(tmp_path):
    res = invoke("run", scenario(tmp_path), "--out", tmp_path / "r",
                 "--set", "engine.max_num_seqs=abc", "--set", "engine.block_size=2.5")  # fmt: skip
    assert res.exit_code == 2
    assert "engine.max_num_seqs: expected an integer in 1..1048576, got 'abc'" in res.stderr
    assert "engine.block_size: expected an integer in 1..65536, got 2.5" in res.stderr
    assert not (tmp_path / "r").exists()


def test_output_beyond_max_model_len_is_rejected_as_the_api_rejects_it(tmp_path):
    # (the Python API: tests/test_api.py test_max_tokens_beyond_max_model_len_is_rejected_not_clamped)
    res = invoke("run", scenario(tmp_path), "--out", tmp_path / "r",
                 "--set", "engine.max_model_len=64", "--set", "workload.output_len=60")  # fmt: skip
    assert res.exit_code == 2
    assert (
        "(29 prompt + 60 output tokens) does not fit max_model_len=64: give max_model_len >= 89" in res.stderr
    )
    assert find_runs([tmp_path / "r"])[0] == []


def test_workload_that_does_not_fit_the_model_is_a_clean_error(tmp_path):
    res = invoke("run", scenario(tmp_path), "--out", tmp_path / "r", "--set", "workload.input_len=5000")
    assert res.exit_code == 2 and "does not fit max_model_len=4096: give max_model_len >= 5004" in res.stderr
    assert find_runs([tmp_path / "r"])[0] == []  # nothing measured, nothing kept


def test_interrupted_run_keeps_a_readable_incomplete_result(tmp_path, monkeypatch):
    monkeypatch.setattr(driver_mod, "PROGRESS_PERIOD_S", 0.0)
    calls = []

    def interrupt(self, label, repeat, progress):
        calls.append(progress)
        if len(calls) == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(RichRunEvents, "progress", interrupt)  # Ctrl-C lands while the driver runs
    path = scenario(tmp_path, workload={**TINY["workload"], "num_requests": 12, "output_len": 30}, warmup=0)
    res = invoke("run", path, "--out", tmp_path / "r")
    assert res.exit_code == 130
    assert "partial results, marked incomplete" in res.stderr
    folders = [p for p in (tmp_path / "r" / "tiny").iterdir()]
    assert len(folders) == 1 and not folders[0].name.startswith(".tmp")
    run = load_run(folders[0])
    assert run.meta["status"] == "incomplete" and run.meta["stop_reason"] == "interrupted"
    assert run.summary["status"] == "incomplete"
    reqs = run.table("requests")
    assert len(reqs) > 0 and "abort" in set(reqs["finish_reason"])
    json.dumps(run.summary)  # plain JSON, readable by anything


def test_a_repeat_an_interrupt_stopped_is_kept_but_left_out_of_the_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(driver_mod, "PROGRESS_PERIOD_S", 0.0)

    def interrupt(self, label, repeat, progress):
        if repeat == 1 and progress.done >= 2:  # the second repeat, part-way
            raise KeyboardInterrupt

    monkeypatch.setattr(RichRunEvents, "progress", interrupt)
    path = scenario(tmp_path, workload={**TINY["workload"], "num_requests": 12, "output_len": 30}, warmup=0)
    res = invoke("run", path, "--out", tmp_path / "r", "--set", "repeats=2", "--one-process")
    assert res.exit_code == 130, res.output
    (folder,) = (tmp_path / "r" / "tiny").iterdir()
    point = load_run(folder).summary["points"][0]
    assert [e["status"] for e in point["repeats"]] == ["complete", "interrupted"]
    assert point["repeats"][1]["metrics"]["num_completed"] < 12  # kept as it was
    done = point["metrics"]["num_completed"]
    assert done["value"] == 12 and done["n"] == 1  # the figures: the whole repeat's


def test_a_token_id_outside_the_vocabulary_is_an_error_before_the_engine_starts(tmp_path, monkeypatch):
    from llmbench.engine.llm_engine import LLMEngine

    def never(*args, **kwargs):
        raise AssertionError("the engine was started")

    monkeypatch.setattr(LLMEngine, "__init__", never)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_token_ids": [1, 2, 3]}\n\n{"prompt_token_ids": [4, 99999]}\n')
    path = scenario(tmp_path, workload={"source": "file", "path": str(prompts), "output_len": 3})
    res = invoke("run", path, "--out", tmp_path / "r")
    assert res.exit_code == 2
    assert res.stderr.endswith(
        f"error: {prompts}:3: token id 99999 is outside the model's vocabulary of 4096 ids (0 to 4095)\n"
    )
    assert not (tmp_path / "r").exists()


def test_a_kv_pool_too_small_for_the_workload_is_refused_before_the_run_starts(tmp_path):
    # A pool given as num_kv_blocks is the user's to choose (a small one forces preemption), but the
    # workload's longest request (32 prompt + 4 output tokens: 3 blocks of 16) must fit it whole.
    path = scenario(tmp_path, workload={"num_requests": 4, "input_len": 32, "output_len": 4})
    res = invoke("run", path, "--out", tmp_path / "r", "--set", "engine.num_kv_blocks=2")
    assert res.exit_code == 2, res.output
    assert "needs 3 KV blocks of 16 tokens, more than the whole pool (num_kv_blocks=2)" in res.stderr
    assert not (tmp_path / "r").exists()
    assert invoke("run", path, "--out", tmp_path / "r", "--set", "engine.num_kv_blocks=3").exit_code == 0


def test_a_run_that_fails_names_the_error_without_its_class_path():
    from llmbench.bench.runner import _last_line

    trace = (
        "Traceback ...\n  File x\nllmbench.engine.llm_engine.RequestError: request 'a' needs 3 KV blocks\n"
    )
    assert _last_line(trace) == "request 'a' needs 3 KV blocks"
    assert _last_line("RuntimeError: the engine broke") == "RuntimeError: the engine broke"  # not ours: kept


def test_engine_failure_mid_run_keeps_what_was_measured(tmp_path, monkeypatch):
    from llmbench.engine.llm_engine import LLMEngine

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        '{"prompt_token_ids": [1, 2, 3]}\n{"prompt_token_ids": [4, 5]}\n{"prompt_token_ids": [7, 7, 7]}\n'
    )
    real = LLMEngine.add_request

    def add_request(self, request_id, prompt, *args, **kwargs):  # the third prompt breaks the engine
        if list(prompt) == [7, 7, 7]:
            raise RuntimeError("the engine broke on this request")
        return real(self, request_id, prompt, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "add_request", add_request)
    path = scenario(
        tmp_path,
        workload={"source": "file", "path": str(prompts), "output_len": 3},
        arrival={"kind": "concurrency", "concurrency": 1},
        warmup=0,
    )
    res = invoke("run", path, "--out", tmp_path / "r")
    assert res.exit_code == 1
    assert "the run failed; what was measured is kept in" in res.stderr and "the engine broke" in res.stderr
    runs, problems = find_runs([tmp_path / "r"])
    assert len(runs) == 1
    run = runs[0]
    assert (
        run.meta["status"] == "incomplete"
        and run.meta["stop_reason"] == "failed"
        and "the engine broke" in run.meta["error"]
    )
    assert sorted(run.table("requests")["request_id"]) == ["0", "1"]


@pytest.mark.parametrize("torchrun", [False, True])
def test_a_signal_while_the_command_leaves_prints_no_traceback(tmp_path, torchrun):
    # torchrun sends SIGTERM to the other ranks once one has failed; one that arrives while a rank is
    # leaving (its error already written) must not become a traceback or change the exit status.
    script = tmp_path / "leave.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, sys, time
            import llmbench.cli.app as cli
            from llmbench.cli.entry import main

            def failed():
                print("error: what went wrong", file=sys.stderr)
                raise SystemExit(2)

            class Flushed:  # the signal comes as main() flushes its output on the way out
                def __init__(self, stream): self.stream = stream
                def write(self, text): return self.stream.write(text)
                def flush(self):
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.2)
                    self.stream.flush()

            cli.app = failed
            sys.stdout = Flushed(sys.stdout)
            main()  # outside torchrun the interpreter flushes sys.stdout as it exits
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    if torchrun:
        env["TORCHELASTIC_RUN_ID"] = "test"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "error: what went wrong" in done.stderr


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_interrupt_while_the_command_line_loads_prints_no_traceback(tmp_path, signame):
    # The command line's modules take a moment to load; an interrupt then is an interrupt like any other.
    script = tmp_path / "early.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import importlib.abc, os, signal, sys, time

            class Loading(importlib.abc.MetaPathFinder):  # the signal comes as the app's module loads
                def find_spec(self, name, path, target=None):
                    if name == "llmbench.cli.app":
                        os.kill(os.getpid(), signal.{signame})
                        time.sleep(0.5)
                    return None

            sys.meta_path.insert(0, Loading())
            sys.argv = ["llmbench", "models"]
            from llmbench.cli.entry import main
            main()
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + getattr(signal, signame), done.stderr  # 130 or 143
    assert done.stderr.strip() == "error: interrupted", done.stderr


def test_the_note_under_a_run_table_says_where_its_intervals_are():
    from llmbench.cli.views import ci_note, summary_table

    metric = {"value": 1.0, "ci_low": 0.9, "ci_high": 1.1, "ci": "repeats", "n": 2}
    one = {"points": [{"label": "rate=1", "metrics": {"tpot_p50": metric}}]}
    two = {"points": [{"label": f"rate={r}", "metrics": {"tpot_p50": metric}} for r in (1, 2)]}
    headers = [[c.header for c in summary_table(s).columns] for s in (one, two)]
    assert headers == [["metric", "value", "95% CI"], ["metric", "rate=1", "rate=2"]]
    assert ci_note(one).startswith("95% CI: Student-t interval of the mean over 2 repeats")
    # the repeats shared one process (--one-process): the note says what their spread cannot hold
    assert "all in one process (--one-process)" in ci_note(one) and "process of its own" in ci_note(one)
    assert "within one process" in ci_note(two)
    own = {**one, "repeat_processes": "own"}  # each repeat in a process of its own: the note says so
    assert "each in a process of its own" in ci_note(own) and "one process" not in ci_note(own)
    assert "each in a process of its own" in ci_note({**two, "repeat_processes": "own"})
    assert "from 2 repeats it can be far too narrow" in ci_note(one)
    three = {"points": [{"label": "rate=1", "metrics": {"tpot_p50": {**metric, "n": 3}}}]}
    assert "too narrow" not in ci_note(three)
    assert "report RUN_FOLDER --intervals" in ci_note(two) and not ci_note(two).startswith("95% CI:")


@pytest.mark.parametrize("variant", ["a/b", "", "..", "x\\y"])
def test_a_variant_name_that_is_a_path_is_refused(tmp_path, variant):
    res = invoke("run", scenario(tmp_path), "--out", tmp_path / "r", "--variant", variant)
    assert res.exit_code == 2 and "a variant names a configuration in the results" in res.stderr
    assert not (tmp_path / "r").exists()


def test_prompts_past_the_step_budget_without_chunked_prefill_are_a_run_warning(tmp_path):
    path = scenario(tmp_path, workload={"num_requests": 2, "input_len": 32, "output_len": 2}, warmup=0)
    sets = ["--set", "engine.chunked_prefill=false", "--set", "engine.max_num_batched_tokens=16"]
    res = invoke("run", path, "--out", tmp_path / "r", *sets)
    assert res.exit_code == 0, res.output
    text = "chunked_prefill=False with prompts of up to 32 tokens: one longer than max_num_batched_tokens=16"
    assert text in res.stderr and any(text in w for w in only_run(tmp_path / "r").summary["warnings"])
    res = invoke("run", path, "--out", tmp_path / "s", "--set", "engine.max_num_batched_tokens=16")
    assert "chunked_prefill=False" not in res.stderr  # chunked: the budget holds


def test_an_overview_too_wide_for_the_terminal_is_cut_into_tables_that_fit():
    from llmbench.bench.report.views import View
    from llmbench.cli.views import split_columns

    headers = ["metric", *(f"variant {i} · offline" for i in range(6))]
    rows = [["TPOT p50 (ms)", *(f"{i}.000 (+{i}.0%)" for i in range(6))]]
    view = View("s", headers, rows, [False, *[True] * 6], ("a note",))
    parts = split_columns(view, 80)
    assert len(parts) > 1 and [p.title for p in parts][-1] == f"s ({len(parts)}/{len(parts)})"
    assert all(p.headers[0] == "metric" and p.rows[0][0] == "TPOT p50 (ms)" for p in parts)  # labels in each
    assert [h for p in parts for h in p.headers[1:]] == headers[1:]  # every column once, in order
    assert all(
        sum(max(len(h), len(c)) + 3 for h, c in zip(p.headers, p.rows[0], strict=True)) <= 80 for p in parts
    )
    assert split_columns(view, 400) == [view]
    mixed = view._replace(numeric=[False, True, False, *[True] * 4])  # a verdict column: kept whole
    assert split_columns(mixed, 80) == [mixed]


def test_a_changes_table_too_wide_is_cut_between_metrics_never_inside_one(tmp_path):
    from types import SimpleNamespace

    from llmbench.bench.report.frame import Group
    from llmbench.bench.report.views import changes
    from llmbench.cli.views import split_columns

    metrics = ["output_throughput", "tpot_p50", "ttft_p50", "e2e_p99"]

    def group(name: str, scale: float) -> Group:
        repeats = [{"repeat": r, "metrics": {m: scale * (1 + 0.01 * r) for m in metrics}} for r in range(3)]
        run = SimpleNamespace(summary={}, meta={}, path=tmp_path / name)
        return Group("s", "a", name, runs=[run], label=name, points={"offline": repeats})

    base, other = group("baseline", 1.0), group("tuning.some_toggle=off", 0.9)
    (view,) = changes("s", base, [other], metrics=metrics)
    parts = split_columns(view, 100)
    assert len(parts) > 1
    for p in parts:  # the variant and its repeats in each; each metric's value, change and verdict together
        assert p.headers[:2] == ["variant", "repeats"] and (len(p.headers) - 2) % 3 == 0
        assert all(h == "change [95% CI]" for h in p.headers[3::3]) and all(
            h == "verdict" for h in p.headers[4::3]
        )
    assert [h for p in parts for h in p.headers[2:]] == view.headers[2:]


def test_a_repeat_cut_by_max_duration_says_how_many_requests_completed(tmp_path):
    # One request at a time, each far longer than the limit: none completes, and the run must say no
    # latency was measured rather than leave a throughput figure standing alone, and exit 1.
    path = scenario(
        tmp_path,
        workload={"num_requests": 4, "input_len": 8, "output_len": 4000},
        sampling={"ignore_eos": True},
        engine={"device": "cpu", "max_model_len": 4096},
        arrival={"kind": "offline"},
        warmup=0,
        max_duration_s=0.5,
    )
    res = invoke("run", path, "--out", tmp_path / "r")
    assert res.exit_code == 1, res.output
    run = only_run(tmp_path / "r")  # kept
    (said,) = [w for w in run.summary["warnings"] if "max_duration_s" in w]
    assert "0 of 4 requests completed" in said and "no latency was measured" in said, said
    metrics = run.summary["points"][0]["metrics"]
    assert metrics["num_completed"]["value"] == 0 and metrics["num_aborted"]["value"] == 4  # all were sent
    assert any([c.strip() for c in line.split("│")] == ["aborted", "4"] for line in res.stdout.splitlines())


def test_a_rate_under_a_cap_keeps_at_most_that_many_in_flight_and_reports_the_client_queue(tmp_path):
    # vLLM's --request-rate with --max-concurrency: 12 requests due within ~60 ms, at most 2 in the engine.
    path = scenario(
        tmp_path,
        workload={"num_requests": 12, "input_len": 8, "output_len": 6},
        arrival={"kind": "poisson", "rate": 200, "max_concurrency": 2},
        warmup=0,
    )
    res = invoke("run", path, "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    run = only_run(tmp_path / "r")
    (point,) = run.summary["points"]
    assert point["label"] == "rate=200 max_concurrency=2"
    frame = run.table("requests")
    spans = sorted([(t, 1) for t in frame["submitted"]] + [(times[-1], -1) for times in frame["token_times"]])
    assert np.cumsum([d for _, d in spans]).max() == 2
    assert (frame["arrival"] == frame["submitted"]).all()  # latencies count from the hand-over
    assert frame["client_queue"].max() > 0.01  # held behind the cap
    assert point["metrics"]["client_queue_p99"]["value"] > 0.01
    bad = scenario(tmp_path, arrival={"kind": "concurrency", "concurrency": 2, "max_concurrency": 2})
    res = invoke("run", bad, "--out", tmp_path / "r2")
    assert res.exit_code == 2 and "arrival.max_concurrency" in res.stderr, res.stderr


def test_the_startup_line_says_a_tensor_parallel_pool_is_one_ranks():
    from llmbench.cli.common import startup_line

    startup = {"engine_init_time": 1.0, "kv_num_blocks": 10, "kv_capacity_tokens": 160, "kv_cache_dtype": "bf16",
               "kv_bytes_per_token": 512}  # fmt: skip
    assert "per rank" not in startup_line("engine", startup)
    assert startup_line("engine", {**startup, "all_reduce": "gloo"}).endswith(
        "512 bytes each, per rank (the ranks sum their parts over gloo)) — kept apart from the measurements"
    )


def test_sampling_settings_a_greedy_draw_ignores_are_a_run_warning(tmp_path):
    path = scenario(tmp_path, workload={"num_requests": 2, "input_len": 8, "output_len": 2}, warmup=0)
    res = invoke(
        "run", path, "--out", tmp_path / "r", "--set", "sampling.top_p=0.5", "--set", "sampling.seed=9"
    )
    assert res.exit_code == 0, res.output
    text = "sampling.top_p=0.5, sampling.seed=9 change nothing: a temperature below 1e-05 draws greedily"
    assert text in res.stderr and any(text in w for w in only_run(tmp_path / "r").summary["warnings"])
    res = invoke("run", path, "--out", tmp_path / "s", "--set", "sampling.temperature=0.000001")
    assert "sampling.temperature=1e-06 changes nothing" in res.stderr
    res = invoke(
        "run",
        path,
        "--out",
        tmp_path / "t",
        "--set",
        "sampling.temperature=0.7",
        "--set",
        "sampling.top_p=0.5",
    )
    assert "changes nothing" not in res.stderr and "change nothing" not in res.stderr  # sampled: they apply


def test_options_of_a_backend_that_does_not_serve_the_run_are_a_run_warning(tmp_path):
    path = scenario(tmp_path, workload={"num_requests": 2, "input_len": 8, "output_len": 2}, warmup=0)
    res = invoke(
        "run", path, "--out", tmp_path / "r", "--set", "backend_options={transformers: {num_blocks: 5}}"
    )
    assert res.exit_code == 0, res.output
    text = "backend_options.transformers set, but backend 'engine' serves the run: it changes nothing here"
    assert text in " ".join(res.stderr.split())
    assert any(text in w for w in only_run(tmp_path / "r").summary["warnings"])


def test_a_telemetry_period_with_telemetry_off_is_a_run_warning(tmp_path):
    path = scenario(tmp_path, workload={"num_requests": 2, "input_len": 8, "output_len": 2}, warmup=0)
    sets = ["--set", "telemetry.enabled=false", "--set", "telemetry.period_ms=500"]
    res = invoke("run", path, "--out", tmp_path / "r", *sets)
    assert res.exit_code == 0, res.output
    assert "telemetry.period_ms=500 set, but telemetry.enabled is false" in " ".join(res.stderr.split())
    res = invoke("run", path, "--out", tmp_path / "s", "--set", "telemetry={enabled: false}")
    assert res.exit_code == 0 and "telemetry.period_ms" not in res.stderr  # no period given: nothing to say
