"""Tensor parallelism over torch.distributed (gloo on the CPU): exact tokens, clean failures."""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from processes import interruptible

from llmbench import LLM, SamplingParams
from llmbench.engine import tp as tp_mod
from llmbench.engine.config import ConfigError
from llmbench.engine.facts import triton_usable
from llmbench.engine.tp import TPError

from tiny_models import hf_greedy, make_tiny

PROMPTS = [[5], [(3 * i + 1) % 384 for i in range(9)], [(7 * i + 3) % 384 for i in range(17)] + [42]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Only ends a subprocess that hangs: nothing is expected to come near it, however busy the machine.
HANG_GUARD_S = 900


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tp")
    hf = make_tiny("qwen3", folder)  # 4 heads, 2 KV heads: tp=4 replicates each KV head twice
    return folder, [hf_greedy(hf, p, GREEDY.max_tokens) for p in PROMPTS]


def _workers_of(pid: int) -> list[psutil.Process]:
    try:
        return [
            c for c in psutil.Process(pid).children(recursive=True) if "tp_worker" in " ".join(c.cmdline())
        ]
    except psutil.NoSuchProcess:
        return []


def _generate_in_new_process(
    folder: Path, options: dict, prompts: list[list[int]] = PROMPTS
) -> tuple[list[list[int]], str]:
    """PROMPTS through LLM(folder, **options) in a fresh interpreter: (token ids, the all-reduce used,
    with "+norm" when fused with the norms, "+matmul" when with the products too)."""
    code = textwrap.dedent(
        """
        import json, sys
        from llmbench import LLM, SamplingParams
        folder, options, prompts, greedy = json.loads(sys.argv[1])
        llm = LLM(folder, **options)
        try:
            out = [o.token_ids for o in llm.generate(prompts, SamplingParams(**greedy))]
        finally:
            llm.engine.shutdown()
        startup = llm.engine.startup
        fused = ("+norm" if startup.all_reduce_norm else "") + ("+matmul" if startup.all_reduce_matmul else "")
        print(json.dumps([out, startup.all_reduce + fused]))
        """
    )
    greedy = {
        "temperature": GREEDY.temperature,
        "max_tokens": GREEDY.max_tokens,
        "ignore_eos": GREEDY.ignore_eos,
    }
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps([str(folder), options, prompts, greedy])],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got, used = json.loads(done.stdout.strip().splitlines()[-1])
    return got, used


@pytest.mark.parametrize(
    "tp,async_,all_reduce,fuse_norm",
    [
        (2, False, "nccl", None),
        (4, False, "nccl", None),
        (2, True, "auto", None),
        (2, False, "symm_mem", None),
        (2, True, "symm_mem", None),
        (2, False, "symm_mem", False),
    ],
    ids=["tp2", "tp4", "tp2-async-auto", "tp2-symm_mem", "tp2-async-symm_mem", "tp2-symm_mem-unfused"],
)
def test_greedy_tokens_at_tp_equal_transformers(model, tp, async_, all_reduce, fuse_norm):
    if DEVICE == "cuda" and torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs")
    if all_reduce == "symm_mem" and DEVICE != "cuda":
        pytest.skip("symmetric memory (one-shot all-reduce over NVLink) needs CUDA GPUs")
    folder, expected = model
    options = dict(
        tp=tp,
        dtype="float32",
        num_kv_blocks=64,
        block_size=8,
        device=DEVICE,
        async_scheduling=async_,  # the sampled ids then reach ranks 1.. by a broadcast on the device
        # tp_fuse_norm None: with the one-shot all-reduce and Triton, each norm in its kernel
        tuning={"tp_all_reduce": all_reduce, "tp_fuse_norm": fuse_norm},
    )
    if DEVICE == "cuda" and all_reduce != "nccl":
        # the one-shot all-reduce can be set up once per process: each such case gets its own interpreter
        got, used = _generate_in_new_process(folder, options)
    else:
        llm = LLM(str(folder), **options)
        try:
            got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        finally:
            llm.engine.shutdown()
        assert not _workers_of(os.getpid()), "worker processes outlived shutdown"
        used = llm.engine.startup.all_reduce
    assert got == expected
    fused = "+norm+matmul" if fuse_norm is None and triton_usable(DEVICE) else ""
    assert used == (
        {"nccl": "nccl", "symm_mem": "symm_mem" + fused, "auto": "symm_mem" + fused}[all_reduce]
        if DEVICE == "cuda"
        else "gloo"
    )


@pytest.mark.slow
def test_each_rank_records_the_same_steps_into_a_trace_of_its_own(model, tmp_path):
    """``llmbench profile`` at tp > 1: rank 0 starts and stops every rank's torch.profiler session between
    steps; each rank writes its own file, holding one step range per step, and the profile summary has a
    row per rank (rank 1's time in the all-reduce shows as communication)."""
    from llmbench.bench.profile.summary import read_trace, summarise
    from llmbench.bench.profile.trace import analyse
    from llmbench.bench.profile.window import ProfileWindow

    folder, _ = model
    llm = LLM(
        str(folder),
        tp=2,
        dtype="float32",
        num_kv_blocks=64,
        block_size=8,
        device=DEVICE,
        async_scheduling=False,
    )  # fmt: skip  (every call then sends rank 1 exactly one step)
    window = ProfileWindow(tmp_path, steps_per_kind=4)
    try:
        engine = llm.engine
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(str(i), prompt, GREEDY)
        engine.step()  # the prefill, outside the window
        observed = window.observe(engine)
        while engine.has_unfinished() and not window.window_done:
            observed.step()
        window.end_of_run(engine)
    finally:
        llm.engine.shutdown()
    ((chunk,),) = [window.record()["chunks"]]
    files = sorted(tmp_path.glob("trace-*.json.gz"))
    assert [f.name for f in files] == [chunk["file"].format(rank=r) for r in (0, 1)]
    steps = [analyse(read_trace(f)).steps for f in files]
    assert len(steps[0]) == len(steps[1]) == len(chunk["calls"]) >= 4
    summary = summarise(tmp_path, window.record(), "tp2", DEVICE, None, None, "complete")
    ranks = {r["rank"]: r for r in summary["ranks"]}
    assert set(ranks) == {0, 1}
    assert ranks[1]["device"].get("communication", 0.0) > 0
    assert "schedule" in ranks[0]["phases"] and "schedule" not in ranks[1]["phases"]


def _skinny_tp2(attention_backend: str = "auto", **tuning) -> dict:
    """Engine options for tp=2 in float32 with every decode step of up to 8 rows through the skinny
    kernels, and the tuning knobs ``tuning``."""
    return dict(
        tp=2,
        dtype="float32",
        num_kv_blocks=64,
        block_size=8,
        device=DEVICE,
        triton_kernels=True,
        attention_backend=attention_backend,
        tuning={"skinny_matmul_rows": 8, **tuning},
    )


@pytest.mark.skipif(DEVICE != "cuda" or torch.cuda.device_count() < 2, reason="two GPUs")
@pytest.mark.parametrize("fuse_matmul", [True, False])
def test_greedy_tokens_at_tp2_with_each_product_in_the_all_reduce_kernel(model, fuse_matmul):
    # one sequence (one-row decode steps: where the fusion applies), then all three at once (three rows:
    # where it does not); with tp_fuse_matmul each o_proj and down_proj of a one-row step is computed in
    # the kernel that sums it over the ranks, and the norm after it done on the next product's loads
    folder, expected = model
    options = _skinny_tp2(skinny_fusion="silu", tp_fuse_matmul=fuse_matmul)
    for prompts, want in (([PROMPTS[1]], [expected[1]]), (PROMPTS, expected)):
        got, used = _generate_in_new_process(folder, options, prompts)
        assert got == want
        assert used == "symm_mem+norm" + ("+matmul" if fuse_matmul else "")


@pytest.mark.slow  # Triton interpreted on two ranks
def test_greedy_tokens_at_tp2_with_triton_kernels_and_the_fused_skinny_matmul(model):
    # each rank's shard through the skinny kernels (norms and SiLU fused in), all-reduced after
    if not triton_usable(DEVICE):
        pytest.skip("triton is not installed")
    folder, expected = model
    options = _skinny_tp2(attention_backend="triton", skinny_fusion="all", tp_all_reduce="nccl")
    llm = LLM(str(folder), **options)
    try:
        assert llm.engine.runner.decode_plan.norm_rows == 1  # rank 0's model: norms on the matmuls' loads
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        alone = [o.token_ids for o in llm.generate(PROMPTS[1:2], GREEDY)]  # one-row steps: the fused form
    finally:
        llm.engine.shutdown()
    assert got == expected and alone == expected[1:2]


@pytest.mark.slow
def test_seeded_sampling_draws_the_same_tokens_at_tp2_as_on_one_device(model):
    # rank 0 alone samples, with uniforms keyed by (seed, position, token): the split model changes nothing
    if DEVICE == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    folder, _ = model
    params = [
        SamplingParams(temperature=0.9, top_p=0.95, seed=11 + i, max_tokens=8, ignore_eos=True)
        for i in range(3)
    ]
    options = dict(dtype="float32", num_kv_blocks=64, block_size=8, device=DEVICE)
    want = [o.token_ids for o in LLM(str(folder), **options).generate(PROMPTS, params)]
    llm = LLM(str(folder), tp=2, async_scheduling=True, **options)
    try:
        got = [o.token_ids for o in llm.generate(PROMPTS, params)]
    finally:
        llm.engine.shutdown()
    assert got == want and len({t for ids in want for t in ids}) > 8


def test_tp_that_does_not_divide_the_heads_is_a_clear_error(model):
    folder, _ = model
    with pytest.raises(ConfigError, match="tp=3 does not divide the 4 attention heads"):
        LLM(str(folder), tp=3, num_kv_blocks=64)


@pytest.mark.skipif(DEVICE != "cuda", reason="GPU count check")
def test_tp_larger_than_the_gpus_is_a_clear_error(model):
    folder, _ = model
    n = torch.cuda.device_count() * 2
    with pytest.raises(TPError, match=f"tp={n} needs {n} GPUs; this machine has {n // 2}"):
        LLM(str(folder), tp=n, num_kv_blocks=64)


@pytest.mark.skipif(
    DEVICE == "cuda", reason="gloo notices a dead peer at once; NCCL exits after a grace period"
)
def test_a_rank_that_dies_stops_every_rank_with_a_clear_error(model):
    folder, _ = model
    llm = LLM(str(folder), tp=2, dtype="float32", num_kv_blocks=64, block_size=8)
    worker = llm.engine.workers.procs[0]
    llm.engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True))
    llm.engine.step()
    worker.kill()
    start = time.monotonic()
    with pytest.raises(TPError, match="rank 1"):
        while llm.engine.has_unfinished():
            llm.engine.step()
    # gloo notices at once; not noticing would surface only at the group's own timeout
    assert time.monotonic() - start < tp_mod._INIT_TIMEOUT.total_seconds()
    assert not _workers_of(os.getpid())


def _script(folder) -> str:
    """A tp=2 run on this machine's device: one generation, then (with an argument) generations forever."""
    return textwrap.dedent(
        f"""
        import sys
        from llmbench import LLM, SamplingParams
        llm = LLM({str(folder)!r}, tp=2, dtype="float32", num_kv_blocks=64, block_size=8, device={DEVICE!r})
        out = llm.generate([[5]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        print("TOKENS", out[0].token_ids, flush=True)
        if len(sys.argv) > 1:
            while True:
                llm.generate([[5]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        llm.engine.shutdown()
        """
    )


def _gpu_memory_used() -> list[int]:
    """Bytes in use on each GPU as the driver counts them (NVML: every process, in any PID namespace)."""
    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    return [pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles]


@pytest.mark.slow
@pytest.mark.skipif(DEVICE != "cuda" or torch.cuda.device_count() < 2, reason="two GPUs")
def test_a_gpu_rank_that_dies_ends_the_run_and_frees_the_gpus(model, tmp_path):
    # NCCL leaves rank 0 stuck in its collective: the watchdog must end the process itself.
    folder, _ = model
    script = tmp_path / "run.py"
    script.write_text(_script(folder))
    before = _gpu_memory_used()
    proc = subprocess.Popen(
        [sys.executable, str(script), "loop"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert "TOKENS" in proc.stdout.readline()
    held = _gpu_memory_used()
    assert all(h > b for h, b in zip(held[:2], before, strict=False)), "the ranks hold no GPU memory?"
    workers = _workers_of(proc.pid)
    assert len(workers) == 1
    workers[0].kill()
    start = time.monotonic()
    proc.wait(timeout=60)
    assert time.monotonic() - start < 30
    assert proc.returncode != 0
    assert "rank 1 exited unexpectedly" in proc.stderr.read()
    slack, deadline = 64 << 20, time.monotonic() + 10
    while True:
        after = _gpu_memory_used()
        if all(a <= b + slack for a, b in zip(after, before, strict=True)):
            break
        assert time.monotonic() < deadline, f"GPU memory not given back: {before} before, {after} after"
        time.sleep(0.5)


@pytest.mark.slow
def test_two_runs_on_one_host_do_not_collide(model, tmp_path):
    folder, expected = model
    script = tmp_path / "run.py"
    script.write_text(_script(folder))
    procs = [
        subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=HANG_GUARD_S)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert all(f"TOKENS {expected[0][:4]}" in o for o in outs)


@pytest.mark.slow
def test_ctrl_c_ends_every_rank(model, tmp_path):
    folder, _ = model
    script = tmp_path / "run.py"
    script.write_text(_script(folder))
    proc = subprocess.Popen(
        interruptible(str(script), "loop"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert "TOKENS" in proc.stdout.readline()
    workers = _workers_of(proc.pid)
    assert workers, "no worker process found"
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=HANG_GUARD_S)
    gone, alive = psutil.wait_procs(workers, timeout=HANG_GUARD_S)  # an orphaned rank would live on
    assert not alive, "a rank outlived Ctrl-C"


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda", reason="eight CPU ranks")
def test_greedy_tokens_at_tp8_equal_transformers(tmp_path):
    # 8 heads split one per rank; 4 KV heads, each replicated on two ranks.
    hf = make_tiny("llama", tmp_path, num_attention_heads=8, num_key_value_heads=4)
    expected = [hf_greedy(hf, p, GREEDY.max_tokens) for p in PROMPTS]
    llm = LLM(str(tmp_path), tp=8, dtype="float32", num_kv_blocks=64, block_size=8, device="cpu")
    try:
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    finally:
        llm.engine.shutdown()
    assert got == expected


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.device_count() < 2, reason="two GPUs")
def test_a_second_tensor_parallel_engine_starts_once_the_first_is_shut_down_or_collected(model):
    from llmbench.engine.tp_lifecycle import EngineConflictError

    folder, expected = model
    options = dict(tp=2, dtype="float32", num_kv_blocks=64, block_size=8, device=DEVICE)

    def tokens(llm: LLM) -> list[list[int]]:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]

    with LLM(str(folder), **options) as first:
        assert tokens(first) == expected
        with pytest.raises(
            EngineConflictError,
            match=r"^a tensor-parallel engine cannot start: another tensor-parallel engine \(.*, tp=2\) is "
            r"alive in this process, and a process has only one default process group\. Shut the other down",
        ):
            LLM(str(folder), **options)
        assert tokens(first) == expected  # the refused engine left the first one whole
    second = LLM(str(folder), **options)  # after shutdown
    assert tokens(second) == expected
    workers = list(second.engine.workers.procs)
    del second  # dropped without shutdown: collected, it stops its ranks and frees the process group
    gc.collect()
    assert all(p.poll() is not None for p in workers) and not torch.distributed.is_initialized()
    third = LLM(str(folder), **options)
    assert tokens(third) == expected
    third.shutdown()
    third.shutdown()
    assert not _workers_of(os.getpid())


def test_shutdown_releases_cuda_graphs_before_the_process_group(model, monkeypatch):
    # NCCL's teardown waits for good on communicators that live CUDA Graphs captured (seen on two H200s).
    import llmbench.engine.tp_lifecycle as tp_lifecycle

    folder, _ = model
    llm = LLM(str(folder), tp=2, dtype="float32", num_kv_blocks=64, block_size=8, device="cpu")
    order = []
    monkeypatch.setattr(llm.engine.runner, "release_graphs", lambda: order.append("graphs"))
    real_close = tp_lifecycle.close_group
    monkeypatch.setattr(tp_lifecycle, "close_group", lambda: (order.append("group"), real_close()))
    workers = list(llm.engine.workers.procs)
    llm.engine.shutdown()
    assert order == ["graphs", "group"]
    assert all(p.poll() is not None for p in workers)
    assert not torch.distributed.is_initialized()


@pytest.mark.slow
def test_a_script_that_never_calls_shutdown_still_ends_cleanly(model, tmp_path):
    folder, _ = model
    script = tmp_path / "run.py"
    script.write_text(_script(folder).replace("llm.engine.shutdown()", ""))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(
        timeout=HANG_GUARD_S
    )  # on a GPU with graphs, a wrong teardown order hangs here
    assert proc.returncode == 0 and "TOKENS" in out
    assert "teardown" not in err


def _torchrun(nproc: int, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    from llmbench.engine.tp import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    cmd += [f"--master-port={free_port()}", *args]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=cwd, env=env)


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.device_count() < 2, reason="two GPUs")
def test_ranks_started_by_torchrun_give_the_same_tokens(model, tmp_path):
    # Several hosts are run this way; here two local processes stand in for them.
    folder, expected = model
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json
            from llmbench import LLM, SamplingParams
            llm = LLM({str(folder)!r}, tp=2, dtype="float32", num_kv_blocks=64, block_size=8, device={DEVICE!r})
            # Only rank 0 gets here: the other ranks serve its steps inside LLM() and exit there.
            out = llm.generate({PROMPTS!r}, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
            print("TOKENS", json.dumps([o.token_ids for o in out]), flush=True)
            llm.engine.shutdown()
            # As `llmbench` does under torchrun: skip the interpreter's teardown, where torch's
            # distributed objects abort the process about one time in ten (CPU, gloo).
            import os
            os._exit(0)
            """
        )
    )
    done = _torchrun(2, str(script))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("TOKENS")]
    assert len(lines) == 1, done.stdout
    assert json.loads(lines[0].split(" ", 1)[1]) == expected


def _llmbench_run_under_torchrun(tmp_path: Path, tp: int, extra: str, workload: str):
    """``llmbench run`` of a tiny offline scenario (engine tp ``tp``) under torchrun with two processes."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: s\nmodel: qwen3-tiny\nengine: {{device: cpu, tp: {tp}}}\n{extra}"
        f"workload: {{{workload}}}\narrival: {{kind: offline}}\n"
    )
    return _torchrun(2, "-m", "llmbench", "run", str(scenario), "--out", str(tmp_path / "r"))


@pytest.mark.slow
def test_torchrun_world_size_and_tp_must_agree(tmp_path):
    done = _llmbench_run_under_torchrun(tmp_path, 4, "", "num_requests: 2, input_len: 8, output_len: 2")
    assert done.returncode != 0
    assert "torchrun started 2 processes (WORLD_SIZE) but tp=4" in done.stdout + done.stderr
    # torchrun reports its failed children with a traceback of its own; ours must print none.
    frames = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip().startswith("File ")]
    assert not [f for f in frames if "llmbench" in f], (done.stdout + done.stderr)[-4000:]


@pytest.mark.slow
def test_llmbench_run_under_torchrun_writes_one_run_from_rank_0(tmp_path):
    done = _llmbench_run_under_torchrun(
        tmp_path, 2, "warmup: 0\n", "num_requests: 3, input_len: 8, output_len: 4"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted(p.name for p in (tmp_path / "r" / "s").iterdir())
    assert len(runs) == 1 and not runs[0].startswith(".tmp"), runs  # rank 1 wrote nothing
    meta = json.loads((tmp_path / "r" / "s" / runs[0] / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["engine_config"]["tp"] == 2


def test_ablate_under_torchrun_is_a_clear_error(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from llmbench.cli.app import app

    for k, v in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "x",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(k, v)
    res = CliRunner().invoke(app, ["ablate", "chat", "--toggle", "cuda_graph", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "cannot follow" in res.output and "Traceback" not in res.output


def test_a_teardown_that_blocks_ends_the_process_with_a_message():
    code = textwrap.dedent(
        """
        import time
        from llmbench.engine.config import EngineConfig
        from llmbench.engine.resolve import resolve_here
        from llmbench.engine.tp import teardown_guard
        print(time.monotonic(), flush=True)
        with teardown_guard(resolve_here(EngineConfig(device="cpu")), timeout_s=0.5):
            time.sleep(30)  # stands in for an NCCL teardown that never returns
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S)
    entered = float(done.stdout.split()[0])  # the system-wide monotonic clock, read in the child
    assert done.returncode == 1 and time.monotonic() - entered < 30  # the guard, not the sleep, ended it
    assert "tensor-parallel teardown (gloo) still blocked" in done.stderr


def test_each_rank_is_placed_on_its_own_gpu():
    # (which all-reduce and fusions the ranks use is resolve's to decide: tests/test_engine_config.py)
    from llmbench.engine.config import EngineConfig
    from llmbench.engine.facts import Facts, ModelFacts
    from llmbench.engine.resolve import resolve
    from llmbench.engine.tp import LaunchedRank, launched_config, rank_config
    from llmbench.models.presets import PRESETS

    facts = Facts(model=ModelFacts.of("qwen3-tiny", PRESETS["qwen3-tiny"].config), cuda_devices=4)
    gpus = resolve(EngineConfig(model="qwen3-tiny", device="cuda:2", tp=2), facts)
    assert [rank_config(gpus, rank).device for rank in (0, 1)] == ["cuda:2", "cuda:3"]
    assert launched_config(gpus, LaunchedRank(rank=1, world_size=2, local_rank=1)).device == "cuda:1"
    cpu = resolve(EngineConfig(model="qwen3-tiny", device="cpu", tp=2), facts)
    assert rank_config(cpu, 1) == cpu


def _nodelay(conn) -> int:
    """TCP_NODELAY of a connection's socket, read through a second handle on it."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_step_messages_are_sent_without_nagles_delay(monkeypatch):
    """rank 0's step messages leave at once (TCP_NODELAY): with Nagle a small message written before the
    previous one's acknowledgement waited up to 40 ms (delayed ACK) when rank 0 ran ahead."""
    from multiprocessing.connection import Client, Listener

    from llmbench.engine.tp import no_delay

    for env, expected in (("1", 1), ("0", 0)):  # LLMBENCH_TP_NODELAY=0 keeps Nagle (for the trace)
        monkeypatch.setenv("LLMBENCH_TP_NODELAY", env)
        with Listener(("127.0.0.1", 0)) as listener:
            client: list = []
            thread = threading.Thread(target=lambda c=client, a=listener.address: c.append(Client(a)))
            thread.start()
            server = listener.accept()
            thread.join()
            no_delay(server)
            no_delay(client[0])
            assert _nodelay(server) == _nodelay(client[0]) == expected
            server.send("step")
            assert client[0].recv() == "step"  # the connection still works through its own handle
            server.close()
            client[0].close()


def test_a_worker_is_accepted_with_its_key_without_nagles_delay_and_waited_for_a_bounded_time():
    """Rank 0's side of a worker's connection (``TPWorkers``): authenticated both ways with the engine's key,
    messages sent at once, and a worker that never connects (it failed to start) an error, not a hang."""
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    from llmbench.engine.tp import accept_worker

    key = b"k" * 16
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = server.getsockname()[:2]
        clients: list = []
        thread = threading.Thread(target=lambda: clients.append(Client(address, authkey=key)))
        thread.start()
        conn = accept_worker(server, key, timeout_s=60)
        thread.join()
        conn.send(("step", 1))
        assert clients[0].recv() == ("step", 1)
        clients[0].send("ready")
        assert conn.recv() == "ready" and _nodelay(conn) == 1
        conn.close()
        clients[0].close()

        def wrong_key() -> None:
            try:
                Client(address, authkey=b"x" * 16)
            except AuthenticationError:
                pass

        thread = threading.Thread(target=wrong_key)
        thread.start()
        with pytest.raises(AuthenticationError):
            accept_worker(server, key, timeout_s=60)
        thread.join()
        with pytest.raises(TPError, match="a tensor-parallel worker did not connect within 0 s"):
            accept_worker(server, key, timeout_s=0.2)


def test_a_ctrl_c_while_a_worker_starts_prints_no_traceback(tmp_path):
    # A Ctrl-C in the terminal reaches the tensor-parallel workers too, often while they are still loading
    # torch (seconds); rank 0 handles it, a worker must neither die of it nor print the import's traceback.
    env = {**os.environ, "LLMBENCH_TP_ADDR": "127.0.0.1:1", "LLMBENCH_TP_AUTH": "00"}  # nobody listens
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmbench.engine.tp_worker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    time.sleep(0.8)  # inside torch's import
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    assert "KeyboardInterrupt" not in err, err[-3000:]
    assert "ConnectionRefusedError" in err  # it went on to reach for rank 0, which it would have served


def test_spawned_cpu_ranks_compute_with_rank_0s_threads(monkeypatch):
    # cpu_threads sets rank 0's torch threads; a spawned rank starts with torch's default (every core)
    # unless told: each rank must take as many as rank 0.
    from llmbench.engine import tp as tp_mod

    seen = {}

    class Refused(Exception):
        pass

    def popen(cmd, env):
        seen.update(env)
        raise Refused

    monkeypatch.setattr(tp_mod.subprocess, "Popen", popen)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(Refused):
            LLM("qwen3-tiny", device="cpu", tp=2)
    finally:
        torch.set_num_threads(before)
    assert seen[tp_mod.THREADS_ENV] == "1"
