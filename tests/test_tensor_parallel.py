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
    return textwrap.dedent(
        f"""
        import sys
        from llmbench import LLM, SamplingParams
        llm = LLM({str(folder)!r}, tp=2, dtype="float32", num_kv_blocks=64, block_size=8, device="cpu")
        out = llm.generate([[5]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        print("TOKENS", out[0].token_ids, flush=True)
        if len(sys.argv) > 1:
            import time
            while True:
                llm.generate([[5]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        llm.engine.shutdown()
        """
    )


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda", reason="CPU ranks")
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
@pytest.mark.skipif(DEVICE == "cuda", reason="CPU ranks")
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
