"""A tensor-parallel engine's ranks over its lifetime: one engine per process, failure, orderly teardown.

A process has one torch.distributed default process group, so one tensor-parallel engine at a time: a
second one starts once the first is shut down or collected (``check_free`` says why it cannot before),
and a script that ends without ``shutdown()`` still tears its ranks down in the right order (``hold``).
Teardown order matters: ranks 1..tp-1 stop first, then this rank's CUDA Graphs go, and only then its
process group (NCCL's teardown waits for good on communicators that live graphs captured), all under a
guard against a teardown that blocks. Functions take the engine (``LLMEngine``) whose ranks they handle.
"""

from __future__ import annotations

import atexit
import gc
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import torch.distributed as dist

from llmbench.engine.config import ConfigError
from llmbench.engine.model_runner import ModelRunner
from llmbench.engine.resolve import ResolvedConfig
from llmbench.engine.tp import (
    LaunchedRanks,
    TPError,
    TPWorkers,
    close_group,
    init_group,
    init_launched_group,
    launched_config,
    launched_rank,
    rank_config,
    teardown_guard,
)
from llmbench.models.config import ModelConfig
from llmbench.models.errors import ModelError

if TYPE_CHECKING:
    from llmbench.engine.llm_engine import LLMEngine


class EngineConflictError(RuntimeError):
    """An engine that cannot start while another one in this process holds what it needs."""


_holder: weakref.ref | None = None  # the tensor-parallel engine holding the default process group


def check_free() -> None:
    """Raise EngineConflictError while another engine (or anything else) holds the default process group."""
    if not dist.is_initialized():
        return
    gc.collect()  # an engine dropped inside a reference cycle lets its group go when it is collected
    if not dist.is_initialized():
        return
    holder = _holder() if _holder is not None else None
    who = (
        f"another tensor-parallel engine ({holder.config.model}, tp={holder.config.tp}) is alive in this process"
        if holder is not None and holder.workers is not None
        else "torch.distributed's default process group is already set up in this process"
    )
    raise EngineConflictError(
        f"a tensor-parallel engine cannot start: {who}, and a process has only one default process group. "
        "Shut the other down first (llm.shutdown(), or build it in `with LLM(...) as llm:`), or start this "
        "engine in another process"
    )


def start_ranks(
    engine: LLMEngine, config: ResolvedConfig, model_config: ModelConfig, folder: Path | None, max_len: int
) -> ModelRunner:
    """Rank 0's model runner for ``engine``, whose ranks 1..tp-1 this starts (or, under torchrun, joins)
    and hands it as ``engine.workers``. Under torchrun a rank > 0 serves rank 0's steps and never returns."""
    check_free()
    launched = launched_rank()
    own = launched_config(config, launched) if launched is not None else rank_config(config, 0)
    if launched is not None and launched.rank > 0:
        from llmbench.engine.tp_worker import serve_launched

        serve_launched(config, model_config, folder, max_len, launched)
    hold(engine)
    try:
        if launched is not None:  # torchrun's rank 0
            group, control = init_launched_group(own, launched)
            engine.workers = LaunchedRanks(control)
        else:
            engine.workers = TPWorkers(config, model_config, folder, max_len)
            group = init_group(own, 0, engine.workers.port)
        return ModelRunner(own, model_config, folder, max_len, group)
    except ConfigError:
        raise
    except BaseException as e:
        if engine.workers is None:
            raise
        fail(engine, e)


def hold(engine: LLMEngine) -> None:
    """``engine`` now holds the process group; its ranks go down at exit even without ``shutdown()``."""
    global _holder
    _holder = weakref.ref(engine)
    atexit.register(_close_at_exit, weakref.ref(engine))


def _close_at_exit(ref: weakref.ref) -> None:
    engine = ref()
    if engine is not None:
        close(engine)


def fail(engine: LLMEngine, error: BaseException) -> NoReturn:
    """A rank failed (or Ctrl-C): stop every rank, then raise a TPError that says why (a checkpoint's
    ModelError and a KeyboardInterrupt go up as they are)."""
    assert engine.workers is not None
    if isinstance(error, KeyboardInterrupt):
        close(engine)
        raise error
    time.sleep(0.3)  # let the watchdog collect a worker's own message, if it sent one
    engine.workers.terminate()
    teardown(engine)
    if isinstance(error, ModelError):  # the checkpoint is at fault, not the ranks: say so as it is
        raise error
    raise TPError(f"tensor-parallel run stopped on every rank: {engine.workers.error or error}") from None


def close(engine: LLMEngine) -> None:
    """Stop ranks 1..tp-1, then release this rank's CUDA Graphs and only then its process group."""
    if engine.workers is None:
        return
    workers, engine.workers = engine.workers, None
    workers.shutdown()
    teardown(engine, workers)
    # The model's layers hold the process group: let it go now, while the process is whole, rather than
    # at interpreter exit (gloo's threads, destroyed there, could abort the process).
    if hasattr(engine, "runner"):
        del engine.runner


def teardown(engine: LLMEngine, workers: TPWorkers | LaunchedRanks | None = None) -> None:
    """This rank's CUDA Graphs, then the ranks' own last words, then the process group, under a guard."""
    with teardown_guard(engine.config):
        if hasattr(engine, "runner"):  # not yet there when rank 0's own start-up failed
            engine.runner.release_graphs()  # waits for this rank's stream: inside the guard
        if workers is not None:
            workers.before_teardown()
        close_group()
