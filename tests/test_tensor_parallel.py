"""Tensor parallelism over torch.distributed (gloo on the CPU): exact tokens, clean failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch

from llmbench import LLM, SamplingParams
from llmbench.engine.config import ConfigError
from llmbench.engine.tp import TPError

from tiny_models import hf_greedy, make_tiny

PROMPTS = [[5], [(3 * i + 1) % 384 for i in range(9)], [(7 * i + 3) % 384 for i in range(17)] + [42]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


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


@pytest.mark.parametrize("tp", [2, 4])
def test_greedy_tokens_at_tp_equal_transformers(model, tp):
    if DEVICE == "cuda" and torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs")
    folder, expected = model
    llm = LLM(str(folder), tp=tp, dtype="float32", num_kv_blocks=64, block_size=8, device=DEVICE)
    try:
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    finally:
        llm.engine.shutdown()
    assert got == expected
    assert not _workers_of(os.getpid()), "worker processes outlived shutdown"


def test_tp_that_does_not_divide_the_heads_is_a_clear_error(model):
    folder, _ = model
    with pytest.raises(ConfigError, match="tp=3 does not divide the 4 attention heads"):
        LLM(str(folder), tp=3, num_kv_blocks=64)


@pytest.mark.skipif(DEVICE != "cuda", reason="GPU count check")
def test_tp_larger_than_the_gpus_is_a_clear_error(model):
    folder, _ = model
    n = torch.cuda.device_count() * 2
    with pytest.raises(TPError, match=f"tp={n} from cuda needs {n} GPUs"):
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
    assert time.monotonic() - start < 15
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
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert all(f"TOKENS {expected[0][:4]}" in o for o in outs)


@pytest.mark.slow
def test_ctrl_c_ends_every_rank(model, tmp_path):
    folder, _ = model
    script = tmp_path / "run.py"
    script.write_text(_script(folder))
    proc = subprocess.Popen(
        [sys.executable, str(script), "loop"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert "TOKENS" in proc.stdout.readline()
    workers = _workers_of(proc.pid)
    assert workers, "no worker process found"
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    gone, alive = psutil.wait_procs(workers, timeout=15)
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


def test_shutdown_releases_cuda_graphs_before_the_process_group(model, monkeypatch):
    # NCCL's teardown waits for good on communicators that live CUDA Graphs captured (seen on two H200s).
    import llmbench.engine.llm_engine as llm_engine

    folder, _ = model
    llm = LLM(str(folder), tp=2, dtype="float32", num_kv_blocks=64, block_size=8, device="cpu")
    order = []
    monkeypatch.setattr(llm.engine.runner, "release_graphs", lambda: order.append("graphs"))
    real_close = llm_engine.close_group
    monkeypatch.setattr(llm_engine, "close_group", lambda cfg: (order.append("group"), real_close(cfg)))
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
    out, err = proc.communicate(timeout=120)  # on a GPU with graphs, a wrong teardown order hangs here
    assert proc.returncode == 0 and "TOKENS" in out
    assert "teardown" not in err
