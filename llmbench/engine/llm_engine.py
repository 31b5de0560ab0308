"""The engine loop: requests in, one step at a time, token ids with host timestamps out.

Each ``step()``: schedule -> prepare inputs -> forward -> sample -> postprocess. The engine knows nothing
of scenarios, tables or files of results; the bench layer drives it through ``add_request``/``step``.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Iterable

import torch

from llmbench import collector
from llmbench.engine import step_counters, tp_lifecycle
from llmbench.engine.async_scheduling import HostCopies, InFlight, mark_pending, sampling_rows, set_token_fill
from llmbench.engine.block_manager import BlockManager, SlabAllocator
from llmbench.engine.config import ConfigError, EngineConfig
from llmbench.engine.facts import ModelFacts, read_facts
from llmbench.engine.model_runner import Executed, ModelRunner
from llmbench.engine.outputs import ModelInfo, RequestOutput, StepOutput, StepStats, TokenEvent
from llmbench.engine.ranges import phase, step_range
from llmbench.engine.resolve import find_model, resolve
from llmbench.engine.sampler import Sampler
from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.scheduler import ScheduledBatch, Scheduler, step_kind
from llmbench.engine.sequence import Sequence, SequenceStatus
from llmbench.engine.step_inputs import BlockTables, StepArrays, build_step
from llmbench.engine.tp import LaunchedRanks, TPWorkers
from llmbench.engine.work import step_work
from llmbench.models.checkpoint_check import check_checkpoint, check_tied_head
from llmbench.models.tokenizer import serving_tokenizer


class RequestError(ValueError):
    """A request the engine cannot serve (too long, bad token ids, duplicate id...)."""


def _token_ids(request_id: str, prompt: Iterable[object]) -> list[int]:
    """A prompt of token ids as plain ints; a float (2.9 would silently become 2) or a bool is refused."""
    if not isinstance(prompt, Iterable):
        raise RequestError(
            f"request {request_id!r}: a prompt is text (a string) or a list of token ids, got {prompt!r}"
        )
    ids = []
    for t in prompt:
        try:
            if isinstance(t, bool):
                raise TypeError
            ids.append(operator.index(t))
        except TypeError:
            raise RequestError(f"request {request_id!r}: token ids are integers, got {t!r}") from None
    return ids


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.workers: TPWorkers | LaunchedRanks | None = None
        self._closed = False
        model_config, folder = find_model(config.model)
        self.config = config = resolve(config, read_facts(ModelFacts.of(config.model, model_config)))
        self.model_config = model_config
        self.max_model_len = max_len = config.max_model_len
        if folder is not None:  # a checkpoint that cannot load: refused before any rank or weight
            check_checkpoint(folder, model_config)
            check_tied_head(folder, model_config)
        self.tokenizer = serving_tokenizer(folder, model_config.vocab_size, config.model)
        if config.tp == 1:
            self.runner = ModelRunner(config, model_config, folder, max_len)
        else:
            self.runner = tp_lifecycle.start_ranks(self, config, model_config, folder, max_len)
        self.startup = self.runner.startup
        bs = config.block_size
        if config.paged_kv:
            self.kv: BlockManager | SlabAllocator = BlockManager(
                self.runner.num_blocks, bs, config.prefix_cache
            )
        else:
            self.kv = SlabAllocator(self.runner.num_blocks, bs, max_len)
            if self.kv.num_slabs == 0:
                raise ConfigError(
                    f"paged_kv=False reserves max_model_len={max_len} tokens per sequence, more than the KV pool "
                    f"holds ({self.runner.num_blocks * bs} tokens)"
                )
        self.scheduler = Scheduler(
            self.kv,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            chunked_prefill=config.chunked_prefill,
            continuous_batching=config.continuous_batching,
        )
        self.sampler = Sampler(self.runner.device, config.triton_kernels, config.seed)
        self.sampler.warm_up(model_config.vocab_size, config.torch_dtype)  # not inside a measured step
        self.eos_token_ids = frozenset(model_config.eos_token_ids) | ({self.tokenizer.eos_token_id} - {None})
        self._seqs: dict[str, Sequence] = {}
        self._step = 0
        self.tables = BlockTables(-(-max_len // bs))  # rows of the running sequences' block tables
        self._inflight: InFlight | None = None  # asynchronous scheduling: the step still on the device
        self._host_copies = HostCopies()  # where its ids come to the host
        self._last_resolved = 0.0
        self._counters = step_counters.StepCounters(self.runner.device, self.runner.recompiles)
        self._since = self._counters.read()  # asynchronous scheduling: the counters at the last delivery
        self.model_info = ModelInfo.of(config, model_config, self.runner, folder)
        collector.freeze_startup()  # no full collection walks the model and its modules during steps

    # -- requests ---------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: list[int] | str,
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        if self._closed:
            raise RuntimeError("this engine was shut down: build a new one to generate again")
        if request_id in self._seqs:
            raise RequestError(f"request id {request_id!r} is already in the engine")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else _token_ids(request_id, prompt)
        if not ids:
            raise RequestError(f"request {request_id!r} has an empty prompt")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"request {request_id!r} has token ids outside [0, {vocab}): {bad[:5]}")
        if len(ids) >= self.max_model_len:
            raise RequestError(
                f"request {request_id!r}: prompt of {len(ids)} tokens does not fit max_model_len={self.max_model_len} "
                "(it needs room for at least one new token)"
            )
        longest = len(ids) + params.max_tokens
        if longest > self.max_model_len:
            raise RequestError(
                f"request {request_id!r}: {len(ids)} prompt + {params.max_tokens} output tokens (max_tokens) "
                f"exceed max_model_len={self.max_model_len}: shorten the prompt, lower max_tokens or raise "
                "max_model_len"
            )
        if self.kv.blocks_needed(longest) > self.kv.num_blocks:
            raise RequestError(
                f"request {request_id!r} needs {self.kv.blocks_needed(longest)} KV blocks "
                f"({longest} tokens) but the whole pool has {self.kv.num_blocks}"
            )
        arrival = time.perf_counter() if arrival_time is None else arrival_time
        seq = Sequence(request_id, ids, params, arrival, self.eos_token_ids)
        self._seqs[request_id] = seq
        self.sampler.add(request_id, params)
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self._seqs.get(request_id)
        if seq is None:
            return None
        return self._finish(seq, "abort", time.perf_counter())

    def reset_prefix_cache(self) -> None:
        """Make later requests miss every prefix cached so far (between repeats of a benchmark)."""
        self.kv.reset_prefix_cache()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None

    @property
    def num_unfinished(self) -> int:
        return len(self._seqs)

    # -- the loop ---------------------------------------------------------------------------------

    def step(self) -> StepOutput:
        """One iteration of the loop. Its stats also say what happened in the step's time (compilations,
        allocator growth, garbage collection: engine/step_counters.py), so that a slow step is explained by
        what slowed it: under asynchronous scheduling from the delivery of the step before to its own (the
        span its duration covers), else during the call."""
        if self._closed:
            raise RuntimeError("this engine was shut down: build a new one to generate again")
        with step_range():
            return self._step_async() if self.config.async_scheduling else self._step_sync()

    def _step_sync(self) -> StepOutput:
        start = time.perf_counter()
        since = self._counters.read()
        with phase("schedule"):
            batch = self.scheduler.schedule()
        self._step += 1
        if batch is None:
            stats = self._stats(start)
            self._counters.fill(stats, since)
            return StepOutput(stats)
        stats = self._begin(batch, start)
        with phase("build_inputs"):
            arrays = build_step(
                batch.seqs, batch.num_new_tokens, self.config.block_size, self.tables, batch.counts()
            )
            self.sampler.attach(arrays, batch)
        executed = self._execute(arrays)
        stats.graph_bucket, stats.graph_padding = executed.graph_bucket, executed.graph_padding
        with phase("bookkeeping"):
            sampling = self.scheduler.advance(batch)
        with phase("sample"):
            ids = self._sample(executed)
        waited = time.perf_counter()
        with phase("copy_to_host"):
            tokens = ids.tolist()
        now = time.perf_counter()  # tokens are on the host now
        stats.end_time = now
        stats.device_wait = now - waited
        out = StepOutput(stats)
        with phase("bookkeeping"):
            for seq, tok in zip(sampling, tokens, strict=True):
                seq.token_ids.append(tok)
                self._deliver(seq, tok, now, out)
            self._counters.fill(stats, since)  # the whole call: its deliveries are in no step's time
            return self._end(out)

    def _execute(self, arrays: StepArrays) -> Executed:
        """The step on every rank (rank 0 sends it to the others first; it alone samples, so it alone
        asks its CUDA Graph for the draw)."""
        draw = self.sampler.draws_in_graph
        if self.workers is None:
            return self.runner.execute(arrays, draw)
        try:
            with phase("tp_send"):
                self.workers.step(arrays)
            return self.runner.execute(arrays, draw)
        except BaseException as e:
            tp_lifecycle.fail(self, e)

    def _sample(self, executed: Executed) -> torch.Tensor:
        """The step's ids on the device: drawn by its CUDA Graph, or now from its logits."""
        if executed.ids is not None:
            return executed.ids
        return self.sampler.sample(executed.logits, executed.sample_rows)

    # -- traces (engine/tracer.py): every rank records the same steps into a file of its own -----------

    def start_trace(self) -> None:
        """Start recording a torch.profiler trace on every rank (call it between steps)."""
        if self.workers is not None:
            self.workers.trace(None)
        self.runner.tracer.start()
        if self.workers is not None:  # a rank's first start can take seconds: not inside the first step
            self.runner.barrier()

    def stop_trace(self, path: str | None) -> None:
        """Stop recording; each rank writes its trace to ``path`` with ``{rank}`` replaced by its rank
        (None: drop them). Returns once every rank's file is written."""
        from llmbench.engine.tracer import rank_path

        if self.workers is not None:
            self.workers.trace(path or "")
        self.runner.tracer.stop(rank_path(path, 0) if path else None)
        if self.workers is not None:
            self.runner.barrier()

    def _begin(self, batch: ScheduledBatch, start: float) -> StepStats:
        for seq in batch.newly_scheduled:
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = start
        return self._stats(start, batch)  # before advance() moves the counters

    def _deliver(self, seq: Sequence, tok: int, now: float, out: StepOutput) -> None:
        """A sampled token has reached the host: record it, and finish its sequence if it ends here."""
        seq.token_times.append(now)
        out.tokens.append(TokenEvent(seq.request_id, tok, now))
        if tok in seq.stop_ids:
            out.finished.append(self._finish(seq, "stop", now))
        elif len(seq.token_ids) >= seq.max_len:  # max_tokens (add_request keeps it within max_model_len)
            out.finished.append(self._finish(seq, "length", now))

    def _end(self, out: StepOutput) -> StepOutput:
        out.stats.kv_blocks_used = self.kv.num_used_blocks
        out.stats.kv_blocks_free = self.kv.num_free_blocks
        if self.config.torch_compile:
            self.startup.recompiles = self.runner.recompiles()
        return out

    # -- asynchronous scheduling (engine/async_scheduling.py says how it works) ------------------
    # ``step()`` returns the outputs of the step it waited for; its first call, with nothing to wait
    # for yet, returns an idle step.

    def _step_async(self) -> StepOutput:
        start = time.perf_counter()
        prev = self._inflight
        if prev is None:  # the step launched now is timed from here, its counters read from here too
            self._since = self._counters.read()
        with phase("schedule"):
            batch = self.scheduler.schedule()
        launched: InFlight | None = None
        if batch is not None:
            self._step += 1
            stats = self._begin(batch, start)
            with phase("build_inputs"):
                arrays = build_step(
                    batch.seqs, batch.num_new_tokens, self.config.block_size, self.tables, batch.counts()
                )
                set_token_fill(batch, arrays)
                sampling = sampling_rows(batch)
                self.sampler.attach(arrays, batch, sampling)
            executed = self._execute(arrays)
            stats.graph_bucket, stats.graph_padding = executed.graph_bucket, executed.graph_padding
            with phase("sample"):
                ids = self._sample(executed)
                try:
                    self.runner.share_sampled(ids, len(sampling))  # the other ranks receive them likewise
                except BaseException as e:
                    tp_lifecycle.fail(self, e)
            with phase("copy_to_host"):
                launched = InFlight.launch(batch, sampling, stats, ids, self._host_copies)
        out = self._resolve(prev) if prev is not None else StepOutput(self._stats(start))  # idle: no counts
        with phase("bookkeeping"):
            if launched is not None:
                self.scheduler.advance(launched.batch)  # after ``prev``'s ids are in: blocks hash real ids
                mark_pending(launched.sampling)  # one that ended in ``prev`` gets no placeholder
            self._inflight = launched
            return self._end(out)

    def _resolve(self, prev: InFlight) -> StepOutput:
        """Wait for ``prev``'s sampled ids and deliver them."""
        waited = time.perf_counter()
        with phase("copy_to_host"):
            tokens = prev.wait()
        now = time.perf_counter()  # tokens are on the host now
        stats = prev.stats
        self._since = self._counters.fill(stats, self._since)  # from the last delivery, as its time is
        stats.device_wait = now - waited
        stats.start_time = max(stats.start_time, self._last_resolved)  # overlapped: from the last delivery
        stats.end_time = self._last_resolved = now
        out = StepOutput(stats)
        with phase("bookkeeping"):
            for seq, tok in zip(prev.sampling, tokens, strict=True):
                pos = seq.pending_pos
                if pos is None:  # finished (or aborted) meanwhile; its placeholder is gone
                    continue
                seq.token_ids[pos] = tok
                seq.pending_pos = seq.pending_src = None
                self._deliver(seq, tok, now, out)
        return out

    def _finish(self, seq: Sequence, reason: str, now: float) -> RequestOutput:
        if seq.pending_pos is not None:  # aborted while its next id was on the way: drop the placeholder
            del seq.token_ids[seq.pending_pos :]
            seq.pending_pos = seq.pending_src = None
        self.scheduler.remove(seq)
        self.tables.forget(seq.request_id)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = now
        self.sampler.forget(seq.request_id, seq.params)
        del self._seqs[seq.request_id]
        return seq.to_output()

    def _stats(self, start: float, batch: ScheduledBatch | None = None) -> StepStats:
        prefill, decode = batch.token_counts() if batch else (0, 0)
        work = step_work(batch)._asdict() if batch else {}  # logits rows, attention pairs, context
        return StepStats(
            step=self._step,
            kind=step_kind(prefill, decode) if batch else "idle",
            num_seqs=len(batch.seqs) if batch else 0,
            num_prefill_tokens=prefill,
            num_decode_tokens=decode,
            graph_bucket=None,
            graph_padding=0,
            kv_blocks_used=self.kv.num_used_blocks,
            kv_blocks_free=self.kv.num_free_blocks,
            prefix_cache_hit_tokens=batch.prefix_hit_tokens if batch else 0,
            num_preemptions=batch.num_preemptions if batch else 0,
            start_time=start,
            end_time=start,
            **work,
            batch_limit=batch.limit if batch else "none",
        )

    def shutdown(self) -> None:
        """Abort what is unfinished, stop the tensor-parallel ranks and free the model, its KV pool and
        its CUDA Graphs. Calling it again does nothing; the engine takes no requests afterwards."""
        if self._closed:
            return
        self._closed = True
        for seq in list(self._seqs.values()):
            self._finish(seq, "abort", time.perf_counter())
        self._inflight = None
        tp_lifecycle.close(self)
        if hasattr(self, "runner"):
            self.runner.release_graphs()
            del self.runner
        self._counters = None  # it reads the runner's recompile count: it must not keep the model alive
        collector.thaw()

    def __del__(self) -> None:
        # Dropped without shutdown(): give what start-up froze back to the collector (llmbench/collector.py),
        # stop the ranks and free the process group now, so that another tensor-parallel engine can start
        # in this process.
        if not getattr(self, "_closed", True):
            collector.thaw()
        if getattr(self, "workers", None) is not None:
            try:
                tp_lifecycle.close(self)
            except Exception:  # nothing to report to at collection time; the process stays usable
                pass
