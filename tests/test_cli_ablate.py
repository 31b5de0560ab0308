"""``llmbench ablate``: variants in their own processes, interleaved counterbalanced repeats, failed variants
recorded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.store import load_run
from llmbench.cli.app import app

runner = CliRunner()
# Only ends a test that hangs: nothing is expected to come near it, however busy the machine.
HANG_GUARD_S = 600

TINY = {
    "name": "abl",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 4, "input_len": {"dist": "uniform", "min": 8, "max": 24}, "output_len": 4},
    "arrival": {"kind": "offline"},
    "telemetry": {"period_ms": 20},
}


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert "Traceback" not in res.output, res.output
    return res


def ablation_folder(out: Path) -> Path:
    (folder,) = list((out / "abl").iterdir())
    return folder


@pytest.mark.slow
def test_variants_run_in_their_own_processes_with_interleaved_repeats(tmp_path):
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    res = invoke(
        "ablate", path, "--toggle", "attention_backend=torch", "--repeats", "2", "--out", tmp_path / "r"
    )
    assert res.exit_code == 0, res.output
    assert "design flip · 2 variants x 2 repeat(s) = 4 runs" in res.stderr  # what it is about to run
    assert "attention_backend=torch against baseline" in res.stdout
    assert "outputs against the baseline (greedy)" in res.stdout and "8/8 identical" in res.stdout
    folder = ablation_folder(tmp_path / "r")
    record = json.loads((folder / "ablation.json").read_text())
    assert record["status"] == "complete" and record["design"] == "flip"
    assert [v["name"] for v in record["variants"]] == ["baseline", "attention_backend=torch"]
    assert all(v["status"] == "ok" and len(v["runs"]) == 2 for v in record["variants"])
    assert record["order"] == [
        ["baseline", "attention_backend=torch"],
        ["attention_backend=torch", "baseline"],
    ]
    compared = json.loads((folder / "comparison.json").read_text())["comparisons"]
    assert [(c["variant"], c["compared"], c["identical"]) for c in compared] == [
        ("attention_backend=torch", 8, 8)
    ]
    runs = [
        load_run(folder / name)
        for name in ("baseline-r0", "attention_backend-torch-r0", "attention_backend-torch-r1", "baseline-r1")
    ]
    pids = [r.meta["pid"] for r in runs]
    assert len(set(pids)) == 4  # one process per variant and repeat
    started = [r.meta["started_at"] for r in runs]
    assert started == sorted(started)  # A B, B A
    assert [r.meta["repeat_index"] for r in runs] == [0, 0, 1, 1]
    assert {r.meta["ablation"] for r in runs} == {folder.name}
    assert runs[1].meta["engine_config"]["attention_backend"] == "torch"
    assert runs[0].meta["engine_config"]["attention_backend"] == "sdpa"


def test_a_variant_that_cannot_run_here_is_an_error_before_anything_runs(tmp_path, monkeypatch):
    # As written in the docs (the default scenario): the baseline is not run first.
    from llmbench.bench.ablation import execute

    monkeypatch.setattr(execute, "_run_child", lambda *a, **k: pytest.fail("a variant was run"))
    res = invoke("ablate", "--toggle", "cuda_graph", "--out", tmp_path / "r")
    assert res.exit_code == 2
    head, _, listed = res.stderr.strip().rpartition(" Toggles this scenario can flip here: ")
    assert head.endswith(
        "error: variant cuda_graph=on cannot run here: cuda_graph=True needs a CUDA device: CUDA Graphs "
        "cannot run on the CPU. Nothing was run."
    )
    # what a new user can try instead: the toggles whose flip runs on this machine, not the one that cannot
    from llmbench.engine.config import toggle_names

    here = listed.rstrip(".").split(", ")
    assert "prefix_cache" in here and "cuda_graph" not in here and set(here) <= set(toggle_names())
    assert not (tmp_path / "r").exists()


def test_every_variant_that_cannot_run_is_named(tmp_path):
    from llmbench.engine.config import ConfigError, EngineConfig
    from llmbench.engine.resolve import resolve_here

    def why(**option) -> str:  # the engine's own reason, quoted after the variant's name
        with pytest.raises(ConfigError) as info:
            resolve_here(EngineConfig.from_options("qwen3-tiny", device="cpu", **option))
        return str(info.value)

    res = invoke("ablate", "--toggle", "cuda_graph", "--toggle", "attention_backend=flash_attn",
                 "--design", "one-at-a-time", "--set", "engine.device=cpu", "--out", tmp_path / "r")  # fmt: skip
    assert res.exit_code == 2
    assert res.stderr.split(" Toggles this scenario can flip here: ")[0].endswith(
        f"error: 2 variants cannot run here: cuda_graph=on: {why(cuda_graph=True)}; "
        f"attention_backend=flash_attn: {why(attention_backend='flash_attn')}. Nothing was run."
    )
    assert not (tmp_path / "r").exists()


def test_ablate_needs_a_toggle_and_a_known_one(tmp_path):
    res = invoke("ablate")
    assert res.exit_code == 2 and "--toggle" in res.output
    res = invoke("ablate", "--toggle", "warp_speed")
    assert res.exit_code == 2 and "Unknown toggle: 'warp_speed'. Toggles: paged_kv" in res.stderr


def test_bad_toggle_values_fail_before_anything_runs(tmp_path):
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    res = invoke("ablate", path, "--toggle", "max_num_seqs=abc", "--toggle", "tuning.skinny_matmul_rows=0,257",
                 "--out", tmp_path / "r")  # fmt: skip
    assert res.exit_code == 2
    assert (
        "--toggle max_num_seqs=abc: engine.max_num_seqs: expected an integer in 1..1048576, got 'abc'"
        in res.stderr
    )
    assert (
        "--toggle tuning.skinny_matmul_rows=0,257: engine.tuning.skinny_matmul_rows: expected an integer in "
        "0..256 or auto, got 257" in res.stderr
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("design", ["flip", "one-at-a-time"])
def test_the_plan_says_when_several_toggles_change_together(tmp_path, monkeypatch, design):
    import llmbench.bench.ablation as ablation
    from llmbench.bench.errors import BenchError

    def stop(*args, **kwargs):
        raise BenchError("stopped before running")

    monkeypatch.setattr(ablation, "run_ablation", stop)
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    res = invoke("ablate", path, "--toggle", "paged_kv", "--toggle", "prefix_cache", "--design", design,
                 "--out", tmp_path / "r")  # fmt: skip
    assert res.exit_code == 2 and "stopped before running" in res.stderr
    together = "the 2 toggles change together in one variant" in res.output
    assert together == (design == "flip")
    if design == "one-at-a-time":
        assert (
            "paged_kv=off: paged_kv=False" in res.output
            and "prefix_cache=off: prefix_cache=False" in res.output
        )


def test_factorial_crosses_a_valued_toggle_over_its_values(tmp_path, monkeypatch):
    import llmbench.bench.ablation as ablation
    from llmbench.bench.errors import BenchError

    def stop(*args, **kwargs):
        raise BenchError("stopped before running")

    monkeypatch.setattr(ablation, "run_ablation", stop)
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    res = invoke("ablate", path, "-t", "paged_kv", "-t", "max_num_seqs=2,4,8", "--design", "factorial",
                 "--out", tmp_path / "r")  # fmt: skip
    assert res.exit_code == 2 and "stopped before running" in res.stderr
    assert "  baseline: the scenario's engine options" in res.output
    for on in ("on", "off"):
        for n in (2, 4, 8):
            assert (
                f"  paged_kv={on}+max_num_seqs={n}: paged_kv={on == 'on'}, max_num_seqs={n}\n" in res.output
            )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-t", "paged_kv", "-t", "max_num_seqs=2,4,8", "--design", "leave-one-out"],
            "error: --design leave-one-out turns each toggle off from all of them on, and max_num_seqs=2,4,8 "
            "has no on and off: give two values, ON,OFF (max_num_seqs=A,B), or compare its values with "
            "--design one-at-a-time or factorial",
        ),
        (
            ["-t", "block_size=16"],
            "error: block_size=16 is the baseline's own value: nothing to compare; give another value",
        ),
        (
            ["-t", "block_size=16,16"],
            "error: --toggle block_size=16,16: 16 is given twice; give each value once",
        ),
        (
            ["-t", "max_num_seqs=4,4,8"],
            "error: --toggle max_num_seqs=4,4,8: 4 is given twice; give each value once",
        ),
        (
            ["-t", "max_num_seqs=,4"],
            "error: --toggle max_num_seqs=,4: an empty value between the commas; give each value, e.g. "
            "max_num_seqs=A,B",
        ),
        (
            ["-t", "max_model_len=10,100"],  # the longest request is at most 24 + 4 tokens
            "error: variant max_model_len=10 cannot run here: the workload's longest request (",
        ),
        (
            ["-t", "num_kv_blocks=1,100"],
            "error: variant num_kv_blocks=1 cannot run here: the workload's longest request (",
        ),
        (
            ["-t", "sampling.temperature=0,-1"],  # a value no machine takes: refused as it is read
            "error: --toggle sampling.temperature=0,-1: sampling.temperature: Input should be greater than or "
            "equal to 0 (got -1)",
        ),
        (
            ["-t", "sampling.top_p=0.5"],  # the scenario is greedy: the variant would be the baseline
            "error: not a valid value: sampling.top_p=0.5: sampling.top_p=0.5 changes nothing at temperature 0, "
            "which draws greedily (below 1e-05): toggle sampling.temperature too",
        ),
        (
            ["-t", "sampling.seed=7", "--set", "sampling.temperature=0.000001"],
            "error: not a valid value: sampling.seed=7: sampling.seed=7 changes nothing at temperature 1e-06",
        ),
        (
            ["-t", "paged_kv", "--max-repeats", "4"],
            "error: --max-repeats bounds the repeats --until-ci adds: add --until-ci PCT, or leave it out",
        ),
        (
            ["-t", "paged_kv", "--repeats", "3", "--until-ci", "5", "--max-repeats", "2"],
            "error: --max-repeats 2 is fewer than the 3 repeats every variant runs first",
        ),
    ],
)
def test_a_plan_that_compares_nothing_or_cannot_fit_the_workload_runs_nothing(
    tmp_path, monkeypatch, args, message
):
    from llmbench.bench.ablation import execute

    monkeypatch.setattr(execute, "_run_child", lambda *a, **k: pytest.fail("a variant was run"))
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    res = invoke("ablate", path, *args, "--out", tmp_path / "r")
    assert res.exit_code == 2
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith(message)
    assert "Traceback" not in res.output and not (tmp_path / "r").exists()


def test_many_variants_that_cannot_run_are_counted_not_all_listed(tmp_path, monkeypatch):
    from llmbench.bench.ablation import execute

    monkeypatch.setattr(execute, "_run_child", lambda *a, **k: pytest.fail("a variant was run"))
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    toggles = ["cuda_graph", "paged_kv", "chunked_prefill", "continuous_batching", "max_num_seqs=2,4"]
    res = invoke("ablate", path, *(a for t in toggles for a in ("-t", t)), "--design", "factorial",
                 "--out", tmp_path / "r")  # fmt: skip
    assert res.exit_code == 2
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: 16 variants cannot run here: cuda_graph=on+paged_kv=on+")
    assert line.split(" Toggles this scenario can flip here: ")[0].endswith("; and 13 more. Nothing was run.")
    assert line.count("CUDA Graphs cannot run on the CPU") == 3
    assert not (tmp_path / "r").exists()


def test_a_tuning_variant_is_set_by_its_path_and_checked_by_the_engine(tmp_path):
    from llmbench.bench.ablation import Variant
    from llmbench.bench.ablation.checks import config_problem
    from llmbench.bench.ablation.execute import child_command
    from llmbench.bench.scenario import load_scenario

    path = tmp_path / "abl.yaml"
    path.write_text(
        yaml.safe_dump({**TINY, "engine": {"device": "cpu", "tuning": {"skinny_fusion": "none"}}})
    )
    resolved = load_scenario(path)
    variant = Variant("tuning.tp_fuse_norm=on", {"tuning.tp_fuse_norm": True})
    cmd = child_command(resolved, [], variant, tmp_path / "run", "s", 0)
    assert cmd[cmd.index("--set") + 1] == "engine.tuning.tp_fuse_norm=true"
    # merged into the scenario's tuning section (skinny_fusion kept), then resolved here: on the CPU it
    # cannot apply, and says why
    assert config_problem(resolved, variant).startswith(
        "tuning.tp_fuse_norm=True does each tensor-parallel all-reduce with the RMSNorm after it in one "
        "Triton kernel over the GPUs' shared memory: it needs tp > 1, a CUDA device,"
    )
    assert config_problem(resolved, Variant("x", {"tuning.skinny_matmul_rows": 0})) is None


def test_a_baseline_the_engine_rejects_is_a_clean_error(tmp_path):
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump({**TINY, "engine": {"device": "cpu", "cuda_graph": True}}))
    res = invoke("ablate", path, "--toggle", "paged_kv", "--out", tmp_path / "r")
    assert res.exit_code == 2 and "CUDA Graphs cannot run on the CPU" in res.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_run_past_the_timeout_is_stopped_and_keeps_what_it_measured(tmp_path, monkeypatch):
    from llmbench.bench.ablation import execute
    from llmbench.bench.child_process import CHILD_GRACE_S

    path = tmp_path / "abl.yaml"
    # Far more work than fits in the limit (minutes of it): every run must be stopped.
    slow = {**TINY, "workload": {"num_requests": 2000, "input_len": 16, "output_len": 400}, "warmup": 0}
    path.write_text(yaml.safe_dump(slow))
    took: list[float] = []
    real = execute._run_child

    def timed_child(*args, **kwargs):
        start = time.monotonic()
        try:
            return real(*args, **kwargs)
        finally:
            took.append(time.monotonic() - start)

    monkeypatch.setattr(execute, "_run_child", timed_child)
    res = invoke("ablate", path, "--toggle", "prefix_cache", "--timeout", "12", "--out", tmp_path / "r")
    assert res.exit_code != 0
    assert "timed out after 12 s" in res.output
    # Each child is interrupted at the limit and killed if it outlives the grace period after it.
    assert len(took) == 2 and all(t < 12 + CHILD_GRACE_S for t in took), took
    folder = ablation_folder(tmp_path / "r")
    record = json.loads((folder / "ablation.json").read_text())
    assert [v["status"] for v in record["variants"]] == ["failed", "failed"]
    assert record["status"] == "failed"  # it ran to its end, but no variant ran
    assert all("timed out" in v["error"] for v in record["variants"])
    kept = [load_run(folder / d) for v in record["variants"] for d in v["runs"]]  # named beside it
    assert kept, "an interrupted run keeps what it measured"
    assert all(r.meta["status"] == "incomplete" for r in kept)


@pytest.mark.slow
def test_sigterm_stops_an_ablation_like_ctrl_c_and_records_it(tmp_path):
    # `timeout`, batch schedulers and `docker stop` send SIGTERM, to the parent alone.
    import os
    import signal
    import subprocess
    import sys

    path = tmp_path / "abl.yaml"
    slow = {**TINY, "workload": {"num_requests": 2000, "input_len": 16, "output_len": 400}, "warmup": 0}
    path.write_text(yaml.safe_dump(slow))
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "llmbench", "ablate", str(path), "--toggle", "prefix_cache"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path / "r")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    deadline = time.monotonic() + HANG_GUARD_S
    while not list((tmp_path / "r").glob("abl/*/.tmp-*/meta.json")):  # the first variant is measuring
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 128 + signal.SIGTERM, err  # 143, as a shell reports a SIGTERM'd process
    folder = ablation_folder(tmp_path / "r")
    record = json.loads((folder / "ablation.json").read_text())
    assert record["status"] == "interrupted"
    (kept,) = [d for v in record["variants"] for d in v["runs"]] or [None]
    assert kept is not None, "the interrupted variant keeps its partial run"
    assert load_run(folder / kept).meta["status"] == "incomplete"


class FakeChild:
    """Stands in for ``llmbench run`` children: records the order it is called in and writes a run folder
    whose output throughput is ``value(variant, repeat)``."""

    def __init__(self, value=lambda variant, repeat: 100.0) -> None:
        self.calls: list[tuple[str, int]] = []
        self.value = value

    def __call__(self, cmd, env, timeout_s=None):
        arg = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i].startswith("--")}
        variant, repeat = arg["--variant"], int(arg["--repeat-index"])
        self.calls.append((variant, repeat))
        run_dir = Path(arg["--run-dir"])
        run_dir.mkdir()
        meta = {
            "status": "complete",
            "scenario_name": "abl",
            "variant": variant,
            "ablation": arg["--ablation"],
        }
        metrics = {"output_throughput": self.value(variant, repeat)}
        point = {"label": "offline", "repeats": [{"repeat": repeat, "metrics": metrics}], "metrics": {}}
        (run_dir / "meta.json").write_text(json.dumps(meta))
        (run_dir / "summary.json").write_text(json.dumps({"points": [point], "warnings": []}))
        return 0, ""


def fake_ablation(tmp_path, monkeypatch, child: FakeChild, **kwargs):
    from llmbench.bench.ablation import Variant, execute
    from llmbench.bench.scenario import load_scenario

    monkeypatch.setattr(execute, "_run_child", child)
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    variants = [Variant("baseline", {}), Variant("attention_backend=torch", {"attention_backend": "torch"})]
    outcome = execute.run_ablation(
        load_scenario(path), [], variants, [], "flip", out_root=tmp_path / "r", **kwargs
    )
    return outcome, json.loads((outcome.folder / "ablation.json").read_text())


def test_repeats_are_counterbalanced_and_their_order_recorded(tmp_path, monkeypatch):
    child = FakeChild()
    outcome, record = fake_ablation(tmp_path, monkeypatch, child, repeats=3)
    a, b = "baseline", "attention_backend=torch"
    assert child.calls == [(a, 0), (b, 0), (b, 1), (a, 1), (a, 2), (b, 2)]  # A B, B A, A B
    assert record["order"] == [[a, b], [b, a], [a, b]]
    assert record["status"] == "complete" and record["repeats_run"] == 3
    assert (outcome.folder / "comparison.json").exists()


def test_until_ci_adds_repeats_until_the_intervals_are_narrow(tmp_path, monkeypatch):
    steady = FakeChild(lambda variant, repeat: 100.0 + 0.1 * (repeat % 2))  # +-0.05%: narrow at 2 repeats
    _, record = fake_ablation(tmp_path / "a", monkeypatch, steady, repeats=1, until_ci=2.0, max_repeats=6)
    assert record["repeats_run"] == 2
    noisy = FakeChild(lambda variant, repeat: 100.0 * (1 + 0.3 * (repeat % 2)))  # never within +-2% by 4
    _, record = fake_ablation(tmp_path / "b", monkeypatch, noisy, repeats=1, until_ci=2.0, max_repeats=4)
    assert record["repeats_run"] == 4 and len(noisy.calls) == 8
    assert record["until_ci"] == {"percent": 2.0, "max_repeats": 4}


@pytest.mark.slow
def test_sampling_settings_are_compared_with_their_cost_per_decode_step(tmp_path):
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    res = invoke("ablate", path, "--toggle", "sampling.temperature=0.6", "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    assert "sampling.temperature=0.6 against baseline" in res.stdout
    table = res.stdout[res.stdout.index("sampling.temperature=0.6 against baseline") :]
    assert "decode step mean" in table  # the cost of the setting, per step
    assert "n/a (sampling)" in table  # outputs differ by design
    variant = load_run(ablation_folder(tmp_path / "r") / "sampling.temperature-0.6-r0")
    assert variant.meta["scenario"]["sampling"]["temperature"] == 0.6


def test_a_crashed_variant_is_reported_by_its_message_not_its_native_backtrace():
    from llmbench.bench.ablation.execute import child_error

    crash = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "x.py", line 3, in <module>',
            "RuntimeError: CUDA error: operation not permitted when stream is capturing",
            "Exception raised from c10_cuda_check_implementation at CUDAException.cpp:44",
        ]
        + [f"frame #{i}: /lib/libtorch.so(+0x{i:x}) [0x7f{i:04x}]" for i in range(40)]
    )
    error = child_error(crash)
    assert "operation not permitted when stream is capturing" in error and "frame #" not in error
    assert child_error("a\n\nb\nc", lines=2) == "b\nc" and child_error("  \n") == "(no output)"


def test_a_child_run_hears_sigint_even_when_started_with_it_ignored():
    # ablate and profile stop their children with SIGINT; a child of a job started in the background by
    # a shell script inherits SIGINT ignored, and would run on until killed.
    import signal

    from llmbench.cli.common import listen_for_interrupts

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        listen_for_interrupts()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, handler := lambda *a: None)
        listen_for_interrupts()  # a handler already there is left alone
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize(
    "until_ci,max_repeats,expected",
    [(None, None, 2), (5.0, None, 10), (5.0, 4, 4)],  # without --until-ci nothing is added
)
def test_a_settled_plan_bounds_its_repeats_as_asked(tmp_path, until_ci, max_repeats, expected):
    from llmbench.bench.ablation.request import AblationRequest, settle
    from llmbench.bench.scenario.loader import load_scenario

    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    resolved = load_scenario(str(path))
    request = AblationRequest(
        ["prefix_cache", "chunked_prefill"], [], "one-at-a-time", 2, until_ci, max_repeats, False, None
    )
    planned = settle(request, resolved)
    assert [v.name for v in planned.variants] == ["baseline", "prefix_cache=off", "chunked_prefill=off"]
    assert (planned.repeats, planned.max_repeats) == (2, expected)
    head, *lines = planned.describe()
    assert head.startswith("design one-at-a-time · 3 variants x 2 repeat(s) = 6 runs")
    assert head.endswith(f"up to {3 * expected} with --until-ci") == (until_ci is not None)
    assert [line.split(":")[0].strip() for line in lines] == [v.name for v in planned.variants]


def test_max_model_len_is_not_ablated_over_sharegpt_conversations_it_would_choose(tmp_path):
    import json as _json

    data = tmp_path / "sg.json"
    turn = {"conversations": [{"from": "human", "value": "hello " * 20}, {"from": "gpt", "value": "ok"}]}
    data.write_text(_json.dumps([turn] * 4))
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump({**TINY, "workload": {"source": "sharegpt", "path": str(data)}}))
    res = invoke("ablate", path, "--toggle", "max_model_len=64,128", "--out", tmp_path / "r")
    assert res.exit_code == 2 and "the same requests" in res.stderr, res.output
    assert not (tmp_path / "r").exists()


def test_a_checkpoint_no_variant_could_load_is_refused_before_any_starts(tmp_path):
    # A truncated weights file fails every variant's start-up the same way: said once, before any variant
    # (or a run's --dry-run) pays for a start-up, and nothing is written.
    from tiny_models import make_tiny

    folder = tmp_path / "model"
    make_tiny("qwen3", folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({**TINY, "model": str(folder)}))
    for args in (("ablate", path, "--toggle", "chunked_prefill"), ("run", path, "--dry-run")):
        res = invoke(*args, "--out", tmp_path / "r") if args[0] == "ablate" else invoke(*args)
        said = " ".join(res.output.split())
        assert res.exit_code == 2, (args, res.output)
        assert f"{weights}: not a readable safetensors file" in said and said.count("not a readable") == 1, (
            said
        )
    assert not (tmp_path / "r").exists()


def test_an_out_that_cannot_be_written_is_an_input_error_like_run_and_profile(tmp_path):
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(TINY))
    (tmp_path / "afile").write_text("")
    res = invoke("ablate", path, "--toggle", "prefix_cache", "--out", tmp_path / "afile" / "x")
    assert res.exit_code == 2, res.output
    assert f"{tmp_path / 'afile'} is a file, not a folder" in res.stderr
    assert "unexpected" not in res.stderr


def test_a_child_that_finished_its_run_before_the_timeout_stopped_it_is_kept_whole(tmp_path, monkeypatch):
    from llmbench.bench.ablation.execute import ChildTimeout

    class SlowToEnd(FakeChild):  # writes a complete run, then outlives --timeout while it shuts down
        def __call__(self, cmd, env, timeout_s=None):
            super().__call__(cmd, env, timeout_s)
            return ChildTimeout(timeout_s or 0.0, "")

    class Stopped(FakeChild):  # stopped mid-run: what it wrote is incomplete
        def __call__(self, cmd, env, timeout_s=None):
            super().__call__(cmd, env, timeout_s)
            run_dir = Path(cmd[cmd.index("--run-dir") + 1])
            meta = json.loads((run_dir / "meta.json").read_text())
            (run_dir / "meta.json").write_text(json.dumps({**meta, "status": "incomplete"}))
            return ChildTimeout(timeout_s or 0.0, "")

    _, record = fake_ablation(tmp_path / "a", monkeypatch, SlowToEnd(), repeats=1, timeout_s=5)
    assert [v["status"] for v in record["variants"]] == ["ok", "ok"] and record["status"] == "complete"
    _, record = fake_ablation(tmp_path / "b", monkeypatch, Stopped(), repeats=1, timeout_s=5)
    assert [v["status"] for v in record["variants"]] == ["failed", "failed"]
    assert "timed out after 5 s" in record["variants"][0]["error"]


def test_a_failed_variant_is_summed_up_by_its_error_not_a_warning_before_it():
    from llmbench.bench.errors import error_headline

    said = "warning: the machine was busy when the run started\nerror: a float8 tensor cannot stand for a weight\n"
    assert error_headline(said) == "a float8 tensor cannot stand for a weight"
    assert error_headline("Traceback ...\nValueError: bad shape") == "ValueError: bad shape"  # no error: line
    assert error_headline("") == "unknown error"
