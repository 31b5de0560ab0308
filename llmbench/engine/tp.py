"""Tensor-parallel ranks on one host: rank 0 is the engine's own process, ranks 1..tp-1 are spawned.

Every step rank 0 sends the step's host arrays (``StepArrays``) to each worker over a pipe; all ranks then
run the same forward, kept in lockstep by the collectives inside the model (NCCL on CUDA, gloo on the
CPU); rank 0 alone samples. The rendezvous uses a free loopback port chosen per engine, so two runs on
one host never collide.

Under torchrun (several hosts, or one), every rank is a process torchrun started: ``launched_rank``
reads its environment, rank 0 runs the engine and the others serve steps that rank 0 broadcasts over a
gloo group (``LaunchedRanks``); nothing is spawned and the rendezvous is torchrun's.

Failure handling: a watchdog thread in rank 0 notices a worker that died or reported an exception,
terminates every other worker and makes the engine raise ``TPError`` (a pending gloo collective fails
at once when its peer goes; a pending NCCL one is abandoned by exiting the process after a grace period,
so nothing hangs). Workers ignore SIGINT: Ctrl-C reaches rank 0, whose shutdown stops them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path

import torch
import torch.distributed as dist

from llmbench.distributed import Communicator, make_communicator
from llmbench.engine.resolve import ResolvedConfig
from llmbench.models.config import ModelConfig

_INIT_TIMEOUT = datetime.timedelta(seconds=60)
THREADS_ENV = "LLMBENCH_TP_THREADS"  # a spawned CPU rank's torch threads: rank 0's
_NCCL_GRACE_S = 10.0  # after a worker died, how long rank 0 may stay stuck before the process exits


class TPError(RuntimeError):
    """A tensor-parallel rank failed; every rank has been stopped."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_delay(conn) -> None:
    """Send each step the moment it is written (TCP_NODELAY on a ``multiprocessing`` connection's socket).

    With Nagle's algorithm a small message written while the previous one is still unacknowledged waits
    for that acknowledgement, which the receiver delays by up to 40 ms: rank 0 running a step ahead
    (``async_scheduling``) wrote exactly that pattern. ``LLMBENCH_TP_NODELAY=0`` keeps Nagle, for a
    trace (``llmbench profile`` at tp > 1) to show the difference."""
    if os.environ.get("LLMBENCH_TP_NODELAY", "1") == "0":
        return
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # a second handle on the same socket
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def accept_worker(server: socket.socket, authkey: bytes, timeout_s: float) -> Connection:
    """The next worker's connection to ``server`` (a listening socket), authenticated with ``authkey`` both
    ways as ``multiprocessing.connection.Listener`` does, and sending without Nagle's delay (``no_delay``).
    A worker that has not connected within ``timeout_s`` (it failed to start) is a ``TPError``."""
    server.settimeout(timeout_s)
    try:
        sock, _ = server.accept()
    except TimeoutError:
        raise TPError(f"a tensor-parallel worker did not connect within {timeout_s:.0f} s") from None
    sock.setblocking(True)
    conn = Connection(sock.detach())
    try:
        deliver_challenge(conn, authkey)
        answer_challenge(conn, authkey)
    except BaseException:
        conn.close()
        raise
    no_delay(conn)
    return conn


def first_gpu(config: ResolvedConfig) -> int:
    """Rank r runs on GPU ``first_gpu + r``: device="cuda:2" with tp=2 takes GPUs 2 and 3."""
    return torch.device(config.device).index or 0


def rank_config(config: ResolvedConfig, rank: int) -> ResolvedConfig:
    """The options as spawned rank ``rank`` sees them: its own GPU (rank 0's device + rank)."""
    if config.is_cuda:
        return dataclasses.replace(config, device=f"cuda:{first_gpu(config) + rank}")
    return config


_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclasses.dataclass(frozen=True)
class LaunchedRank:
    rank: int
    world_size: int
    local_rank: int


def launched_rank() -> LaunchedRank | None:
    """This process's place when torchrun (or a launcher setting its variables) started several ranks."""
    if not all(v in os.environ for v in _LAUNCHER_VARS) or int(os.environ["WORLD_SIZE"]) < 2:
        return None
    env = os.environ
    return LaunchedRank(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]))


def launched_config(config: ResolvedConfig, launched: LaunchedRank) -> ResolvedConfig:
    """The options as this launched rank sees them: its host's GPU ``LOCAL_RANK``."""
    if config.is_cuda:
        return dataclasses.replace(config, device=f"cuda:{launched.local_rank}")
    return config


def init_launched_group(config: ResolvedConfig, launched: LaunchedRank) -> tuple[Communicator, object]:
    """The tensor-parallel group's communicator from torchrun's rendezvous, and a gloo group for rank 0's
    messages."""
    if config.is_cuda:
        torch.cuda.set_device(torch.device(config.device))
    dist.init_process_group(
        "nccl" if config.is_cuda else "gloo",
        init_method="env://",
        rank=launched.rank,
        world_size=launched.world_size,
        timeout=_INIT_TIMEOUT,
    )
    control = dist.new_group(backend="gloo") if config.is_cuda else dist.group.WORLD
    return communicator(config), control


class LaunchedRanks:
    """Rank 0's side of ranks that torchrun started: each step's arrays broadcast over a gloo group.

    A rank that dies makes the broadcast fail, which the engine turns into ``TPError``; torchrun itself
    then ends the other ranks."""

    def __init__(self, control) -> None:
        self.control = control
        self.error: str | None = None
        self._closed = False

    def step(self, payload) -> None:
        dist.broadcast_object_list([("step", payload)], src=0, group=self.control)

    def trace(self, path: str | None) -> None:
        """Start (None) or stop a trace on every rank (``LLMEngine.start_trace``/``stop_trace``)."""
        dist.broadcast_object_list([("trace", path)], src=0, group=self.control)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            dist.broadcast_object_list([("stop", None)], src=0, group=self.control)
        except RuntimeError:  # a rank already gone: nothing left to stop
            pass

    def terminate(self) -> None:
        self._closed = True  # torchrun owns the processes

    def before_teardown(self) -> None:
        """Every rank has released its CUDA Graphs: tear the group down together (a rank that left
        early would make this rank's teardown fail or wait)."""
        try:
            dist.barrier(group=self.control)
        except RuntimeError:
            pass


def receive_broadcast(control) -> tuple[str, object]:
    """A launched rank > 0 waits for rank 0's next message."""
    box: list[object] = [None]
    dist.broadcast_object_list(box, src=0, group=control)
    return box[0]  # type: ignore[return-value]


def init_group(config: ResolvedConfig, rank: int, port: int) -> Communicator:
    """Join the tensor-parallel group of a spawned engine (rank 0 and its workers call this together)."""
    backend = "nccl" if config.is_cuda else "gloo"
    if config.is_cuda:
        torch.cuda.set_device(torch.device(config.device))
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=config.tp, timeout=_INIT_TIMEOUT
    )
    return communicator(config)


def communicator(config: ResolvedConfig) -> Communicator:
    """The default group's communicator, as ``config.tuning`` resolved it (every rank calls this together)."""
    t = config.tuning
    return make_communicator(
        t.tp_all_reduce,
        dist.group.WORLD,
        config.torch_dtype,
        torch.device(config.device),
        fuse_norm=t.tp_fuse_norm,
        fuse_matmul=t.tp_fuse_matmul,
    )


@contextlib.contextmanager
def teardown_guard(config: ResolvedConfig, timeout_s: float = 60.0):
    """Bound a tensor-parallel teardown: should it block (NCCL waiting on a rank that is gone, a graph
    still holding a communicator, a collective left half-done by Ctrl-C), say so and end the process
    after ``timeout_s`` rather than hang."""
    done = threading.Event()

    def guard() -> None:
        if not done.wait(timeout_s):
            backend = "NCCL" if config.is_cuda else "gloo"
            print(
                f"llmbench: tensor-parallel teardown ({backend}) still blocked after {timeout_s:.0f} s; exiting",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)

    threading.Thread(target=guard, daemon=True, name="llmbench-tp-teardown").start()
    try:
        yield
    finally:
        done.set()


def close_group() -> None:
    """Tear down this rank's process group. Call it after the CUDA Graphs are released
    (``ModelRunner.release_graphs``): NCCL's teardown waits for good on communicators that live graphs
    captured (pytorch/pytorch#115388)."""
    if dist.is_initialized():
        dist.destroy_process_group()


class TPWorkers:
    """Ranks 1..tp-1, their connections and the watchdog that ends them all if one fails.

    Workers are fresh interpreters (``python -m llmbench.engine.tp_worker``), not multiprocessing children, so
    the caller's ``__main__`` is never re-imported and needs no ``if __name__ == "__main__"`` guard."""

    def __init__(
        self, config: ResolvedConfig, model_config: ModelConfig, folder: Path | None, max_model_len: int
    ):
        if config.is_cuda and torch.cuda.device_count() < config.tp:
            raise TPError(
                f"tp={config.tp} needs {config.tp} GPUs; this machine has {torch.cuda.device_count()}"
            )
        self.config = config
        self.port = free_port()
        authkey = secrets.token_bytes(16)
        server = socket.create_server(("127.0.0.1", 0))
        host, port = server.getsockname()[:2]
        env = {**os.environ, "LLMBENCH_TP_ADDR": f"{host}:{port}", "LLMBENCH_TP_AUTH": authkey.hex()}
        if config.device == "cpu":  # each rank computes with as many threads as this one (cpu_threads)
            env[THREADS_ENV] = str(torch.get_num_threads())
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        try:
            for rank in range(1, config.tp):
                self.procs.append(
                    subprocess.Popen([sys.executable, "-m", "llmbench.engine.tp_worker"], env=env)
                )
                conn = accept_worker(server, authkey, _INIT_TIMEOUT.total_seconds())
                conn.send((rank, config, model_config, folder, max_model_len, self.port))
                self.conns.append(conn)
        except BaseException:
            for proc in self.procs:
                proc.kill()
            raise
        finally:
            server.close()
        self.error: str | None = None
        self._closed = False
        self._watchdog = threading.Thread(target=self._watch, daemon=True, name="llmbench-tp-watchdog")
        self._watchdog.start()

    def _watch(self) -> None:
        while not self._closed:
            for rank, (proc, conn) in enumerate(zip(self.procs, self.conns, strict=True), start=1):
                msg = None
                try:
                    if conn.poll():
                        msg = conn.recv()
                except (EOFError, OSError):
                    msg = None
                if msg is not None and msg[0] == "error":
                    self._fail(msg[1])
                    return
                if proc.poll() is not None and not self._closed:
                    self._fail(f"rank {rank} exited unexpectedly (exit code {proc.returncode})")
                    return
            time.sleep(0.1)

    def _fail(self, message: str) -> None:
        self.error = message
        self.terminate()
        if self.config.is_cuda:
            # A pending NCCL collective does not notice a dead peer; give rank 0 a moment, then leave.
            time.sleep(_NCCL_GRACE_S)
            print(f"llmbench: tensor-parallel rank failed: {message}", file=sys.stderr, flush=True)
            os._exit(1)

    def check(self) -> None:
        if self.error is not None:
            raise TPError(f"a tensor-parallel rank failed, every rank was stopped: {self.error}")

    def step(self, payload) -> None:
        self.check()
        for conn in self.conns:
            conn.send(("step", payload))

    def trace(self, path: str | None) -> None:
        """Start (None) or stop a trace on every worker (``LLMEngine.start_trace``/``stop_trace``)."""
        self.check()
        for conn in self.conns:
            conn.send(("trace", path))

    def terminate(self) -> None:
        self._closed = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in self.conns:
            try:
                conn.send(("stop", None))
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.terminate()

    def before_teardown(self) -> None:
        """Ranks 1.. have exited (they never tear the group down): nothing to wait for."""
