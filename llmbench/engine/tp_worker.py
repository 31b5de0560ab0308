"""Entry point of tensor-parallel ranks 1..tp-1: ``python -m llmbench.engine.tp_worker``.

Started by ``TPWorkers`` (engine/tp.py) with the rendezvous address and key in the environment; kept
out of the package's imports so that running it as ``__main__`` imports it once.
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":
    # A Ctrl-C in the terminal reaches this worker too; rank 0 handles it and stops the workers. Ignored
    # before torch loads (seconds), so that it cannot print the import's traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

import traceback
from collections.abc import Callable
from multiprocessing.connection import Client
from typing import NoReturn

import torch
import torch.distributed as dist

from llmbench import collector
from llmbench.engine.ranges import step_range
from llmbench.engine.tp import (
    THREADS_ENV,
    close_group,
    init_group,
    init_launched_group,
    launched_config,
    no_delay,
    rank_config,
    receive_broadcast,
    teardown_guard,
)
from llmbench.engine.tracer import rank_path
from llmbench.lifeline import die_with_parent


def serve(runner, receive: Callable[[], tuple[str, object]]) -> None:
    """Run every step rank 0 sends until it says stop; then drop the CUDA Graphs (they hold NCCL).

    ``("trace", None)`` starts this rank's torch.profiler recording and ``("trace", path)`` ends it,
    writing the file (``path`` with ``{rank}`` replaced; "" drops it); either way the ranks then meet at a
    barrier, so that no step starts before every rank records, and rank 0 knows every file is there
    (``LLMEngine.start_trace``/``stop_trace``). Each step this rank
    serves is one ``llmbench.step`` range in its trace."""
    collector.freeze_startup()  # a rank ends with its process: nothing to give back
    while True:
        kind, payload = receive()
        if kind == "stop":
            break
        if kind == "trace":
            if payload is None:
                runner.tracer.start()
            else:
                runner.tracer.stop(rank_path(payload, runner.tp.rank) if payload else None)
            runner.barrier()
            continue
        with step_range():
            runner.execute(payload)
            if runner.config.async_scheduling:  # rank 0's samples feed the next step's inputs
                runner.share_sampled(None, len(payload.logits_indices))
    runner.release_graphs()


def serve_launched(config, model_config, folder, max_model_len, launched) -> NoReturn:
    """A rank > 0 that torchrun started: build its shard, serve rank 0's broadcast steps, then leave.

    Called from ``LLMEngine.__init__`` on those ranks, so a script run under torchrun needs no rank
    checks of its own: only rank 0 gets past constructing the engine."""
    from llmbench.engine.model_runner import ModelRunner

    try:
        config = launched_config(config, launched)
        comm, control = init_launched_group(config, launched)
        runner = ModelRunner(config, model_config, folder, max_model_len, comm)
        serve(runner, lambda: receive_broadcast(control))
        with teardown_guard(config):
            dist.barrier(group=control)  # every rank has released its graphs: tear down together
            close_group()
    except BaseException:
        print(f"llmbench: rank {launched.rank}: {traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


def worker_main() -> None:  # pragma: no cover  (a child process; exercised by the tensor-parallel tests)
    """Ranks 1..tp-1: receive the engine's settings from rank 0, build the shard, run every step sent."""
    die_with_parent(signal.SIGKILL, os.getppid())  # whatever state this worker is in when rank 0 dies
    host, port = os.environ["LLMBENCH_TP_ADDR"].rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ["LLMBENCH_TP_AUTH"]))
    no_delay(conn)
    rank, config, model_config, folder, max_model_len, dist_port = conn.recv()
    from llmbench.engine.model_runner import ModelRunner

    if threads := os.environ.get(THREADS_ENV):  # a CPU rank takes rank 0's thread count
        torch.set_num_threads(int(threads))

    try:
        config = rank_config(config, rank)
        comm = init_group(config, rank, dist_port)
        runner = ModelRunner(config, model_config, folder, max_model_len, comm)
        conn.send(("ready", runner.num_blocks))
        serve(runner, conn.recv)
    except EOFError:  # rank 0 went away
        pass
    except BaseException:
        try:
            conn.send(("error", f"rank {rank}: {traceback.format_exc()}"))
        except OSError:
            pass
        os._exit(1)
    # Leave without tearing the process group down (NCCL's teardown can wait on the other ranks); ending
    # the process releases its communicators and GPU memory all the same.
    os._exit(0)


if __name__ == "__main__":
    worker_main()
