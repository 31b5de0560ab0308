"""Hugging Face transformers as a peer backend: the same model, device, dtype and weights as the engine.

Throughput scenarios (offline, rate, concurrency > 1) go through transformers' continuous batching
(``transformers_cb.py``); single-stream ones (one request in flight) through ``generate`` with a static
cache (``transformers_generate.py``). ``backend_options.transformers.mode`` overrides the choice.

On the CPU, where transformers would size its paged cache from all free RAM (seconds of warm-up for a
tiny model), the cache is sized for the workload instead (``num_blocks`` overrides). Metrics built on the
engine's bookkeeping (steps, KV blocks, prefix-cache hits, preemptions) are unavailable, with the reason.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch

from llmbench.bench.backends.base import (
    OnProgress,
    check_drive_args,
    peer_unavailable,
    untaken_engine_options,
)
from llmbench.bench.backends.hf_model import folder_model, preset_model
from llmbench.bench.driver import DriveResult
from llmbench.bench.errors import BenchError
from llmbench.bench.scenario.schema import Scenario
from llmbench.bench.workload.spec import RequestSpec

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ENGINE_OPTIONS_TAKEN = ("device", "dtype", "seed", "max_model_len", "kv_cache_memory")  # from ``engine:``
CPU_KV_BUDGET = 1 << 30  # bytes: the CPU cache, sized for the workload, stays within this (as the engine's)
CPU_MAX_BATCH_TOKENS = 2048  # CB's per-step token budget on the CPU unless set (its warm-up scales with it)
DEFAULT_PAGE_SIZE = 256  # transformers' own default page (block) size
# Continuous batching's own knobs. (generate's CUDA Graphs come with torch_compile: its default compile
# mode, reduce-overhead, replays graphs.)
_CB_ONLY = (
    "num_blocks",
    "page_size",
    "max_batch_tokens",
    "max_requests_per_batch",
    "cuda_graph",
    "compile_level",
)


def _option_error(field: str, message: str) -> BenchError:
    return BenchError(f"backend_options.transformers.{field}: {message}")


def _cb_config_class() -> Any:
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        return None
    return ContinuousBatchingConfig


class TransformersBackend:
    name = "transformers"

    def __init__(self, scenario: Scenario) -> None:
        import transformers

        from llmbench.models.registry import UnknownModelError, resolve_model

        self.scenario = scenario
        self.options = opts = scenario.backend_options.transformers
        device = opts.device or str(scenario.engine.get("device", "auto"))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if not (device == "cpu" or device.startswith("cuda")):
            raise _option_error(
                "device", f"Unsupported device: {device!r}. Supported: auto, cpu, cuda, cuda:N"
            )
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise _option_error("device", f"{device!r} was asked for, but torch sees no CUDA device")
        dtype = opts.dtype or str(scenario.engine.get("dtype", "auto"))
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        if dtype not in _DTYPES:
            raise _option_error(
                "dtype", f"Unsupported dtype: {dtype!r}. Supported: auto, {', '.join(_DTYPES)}"
            )
        self.device, self.dtype = device, dtype
        self.tp = 1
        self.cuda_indices = [int(device.split(":")[1]) if ":" in device else 0] if device != "cpu" else None
        self.seed = int(scenario.engine.get("seed", 0))
        try:
            self.model_config, self.folder = resolve_model(scenario.model)
        except UnknownModelError as exc:
            raise BenchError(str(exc)) from None
        self.vocab_size = self.model_config.vocab_size
        limit = scenario.engine.get("max_model_len")
        self.max_model_len = int(limit) if limit else self.model_config.max_position_embeddings
        self.mode = self._mode()
        self._check_mode_options()
        if opts.cuda_graph and device == "cpu":
            raise _option_error("cuda_graph", "True needs a CUDA device: CUDA Graphs cannot run on the CPU")
        self.transformers_version = transformers.__version__
        self.cb_options: dict[str, Any] = self._cb_options() if self.mode == "continuous_batching" else {}
        self.model: Any = None
        self.manager: Any = None
        self.generation_config: Any = None
        self.tokenizer: Any = None
        self.model_info: dict[str, Any] | None = None
        self.startup: dict[str, Any] = {}
        self.warnings: list[str] = untaken_engine_options(scenario, self.name, ENGINE_OPTIONS_TAKEN)
        if scenario.sampling.temperature > 0:
            self.warnings.append(
                "transformers takes no per-request sampling seed: its sampled outputs are not reproducible "
                "and not comparable with the engine's request by request"
            )
        self.token_times_source = ""
        self.attn_used: str | None = None  # what transformers ran (CB may page it: paged|sdpa)
        self.unavailable = peer_unavailable(self.name)

    # -- options ----------------------------------------------------------------------------------

    def _mode(self) -> str:
        points = self.scenario.arrival.points
        single = all(p.get("concurrency") == 1 for p in points)
        mode = self.options.mode
        if mode == "auto":
            return "generate" if single else "continuous_batching"
        if mode == "generate" and any(p["kind"] == "concurrency" and p["concurrency"] > 1 for p in points):
            raise _option_error(
                "mode",
                "'generate' serves one request at a time; arrival.concurrency > 1 needs continuous_batching",
            )
        return mode

    def _check_mode_options(self) -> None:
        """Options of the other serving path are errors, not silently ignored."""
        given = self.options.model_fields_set
        if self.mode == "generate":
            for name in _CB_ONLY:
                if name in given:
                    raise _option_error(
                        name, "applies to mode continuous_batching; this scenario runs generate"
                    )
        elif "cache_implementation" in given:
            raise _option_error(
                "cache_implementation", "applies to mode generate; continuous batching pages its own cache"
            )

    def _cb_options(self) -> dict[str, Any]:
        """ContinuousBatchingConfig keywords, checked against the fields this transformers has."""
        import transformers

        cls = _cb_config_class()
        if cls is None or not hasattr(transformers.GenerationMixin, "init_continuous_batching"):
            raise _option_error(
                "mode",
                f"continuous batching needs a transformers with ContinuousBatchingConfig (this is "
                f"{transformers.__version__}); use mode: generate, or upgrade transformers",
            )
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        opts = self.options
        page_field = "page_size" if "page_size" in fields else "block_size"
        page = opts.page_size or DEFAULT_PAGE_SIZE
        wanted: dict[str, Any] = {
            "auto_switch_to_flash": False,  # run the attention asked for, not whatever flash is installed
            "allow_block_sharing": opts.allow_block_sharing,
            page_field: page,
            "num_blocks": opts.num_blocks,
            "max_batch_tokens": opts.max_batch_tokens,
            "max_requests_per_batch": opts.max_requests_per_batch,
            "use_cuda_graph": opts.cuda_graph,
            "default_compile_level": opts.compile_level if opts.torch_compile else 0,
        }
        if self.device == "cpu":
            wanted["num_blocks"] = opts.num_blocks or self._cpu_blocks(page)
            wanted["max_batch_tokens"] = opts.max_batch_tokens or CPU_MAX_BATCH_TOKENS
        given = {
            "page_size": opts.page_size, "num_blocks": opts.num_blocks,
            "max_batch_tokens": opts.max_batch_tokens,
            "max_requests_per_batch": opts.max_requests_per_batch, "use_cuda_graph": opts.cuda_graph,
            "default_compile_level": opts.torch_compile or None,
        }  # fmt: skip
        out = {}
        for key, value in wanted.items():
            if key in fields:
                out[key] = value
            elif given.get(key) is not None:
                raise _option_error(key, f"this transformers ({transformers.__version__}) has no {key}")
        return out

    def _cpu_blocks(self, page: int) -> int:
        """Pages for the most tokens the workload can hold at once (every request of a point in flight),
        within the engine's CPU KV budget (``engine.kv_cache_memory``, default at most 1 GiB)."""
        w = self.scenario.workload
        longest_in = w.input_len.upper_bound if w.input_len is not None else None
        if w.prefix_len is not None and longest_in is not None:
            longest_in += w.prefix_len.upper_bound or 0
        longest_out = w.output_len.upper_bound if w.output_len is not None else None
        longest = min((longest_in or self.max_model_len) + (longest_out or 0), self.max_model_len)
        per_request = math.ceil(longest / page)
        in_flight = max(p.get("concurrency") or (w.num_requests or 256) for p in self.scenario.arrival.points)
        cfg = self.model_config
        page_bytes = 2 * cfg.num_hidden_layers * page * cfg.num_key_value_heads * cfg.head_dim
        page_bytes *= _DTYPES[self.dtype].itemsize
        budget = int(self.scenario.engine.get("kv_cache_memory") or CPU_KV_BUDGET)
        return max(per_request + 1, min(in_flight * per_request + 1, budget // page_bytes))

    def describe(self) -> dict[str, Any]:
        opts = self.options
        return {
            "device": self.device,
            "dtype": self.dtype,
            "seed": self.seed,
            "mode": self.mode,
            "attn_implementation": opts.attn_implementation,
            "torch_compile": opts.torch_compile,
            "cache_implementation": opts.cache_implementation if self.mode == "generate" else "paged",
            "continuous_batching_config": self.cb_options or None,
            "attn_implementation_used": self.attn_used,
            "transformers": self.transformers_version,
            "token_times_source": self.token_times_source,
        }

    # -- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        from llmbench.models.tokenizer import load_tokenizer

        t0 = time.perf_counter()
        dtype = _DTYPES[self.dtype]
        attn = self.options.attn_implementation
        if self.folder is None:
            self.model = preset_model(self.model_config, self.seed, self.device, dtype, attn)
        else:
            self.model = folder_model(self.folder, self.device, dtype, attn)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        load_time = time.perf_counter() - t0
        self.tokenizer = load_tokenizer(self.folder, self.vocab_size)
        params = sum(p.numel() for p in self.model.parameters())
        self.model_info = {
            "name": self.scenario.model,
            "architecture": self.model_config.architecture,
            "num_params": params,
            "dtype": self.dtype,
            "weight_bytes": sum(p.numel() * p.element_size() for p in self.model.parameters()),
            "vocab_size": self.vocab_size,
            "max_model_len": self.max_model_len,
            "folder": None if self.folder is None else str(self.folder.resolve()),
        }
        self.eos = self._eos()
        self.generation_config = self._generation_config()
        capture = 0.0
        if self.mode == "continuous_batching":
            capture = self._start_manager()
        self.attn_used = getattr(self.model.config, "_attn_implementation", None)
        if self.mode == "generate":
            self.token_times_source = "streamer: host time of each token handed to generate()'s streamer"
        self.startup = {"load_time": load_time, "compile_time": 0.0, "graph_capture_time": capture}
        if self.options.torch_compile:
            self.startup["compile_note"] = "torch.compile runs during the warm-up requests, not at start-up"

    def _eos(self) -> set[int]:
        if self.scenario.sampling.ignore_eos:
            return set()
        eos = set(self.model_config.eos_token_ids)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            eos.add(self.tokenizer.eos_token_id)
        return eos

    def _generation_config(self) -> Any:
        from transformers import GenerationConfig

        s = self.scenario.sampling
        kwargs: dict[str, Any] = {"do_sample": s.temperature > 0, "pad_token_id": 0}
        if s.temperature > 0:
            # top_k 0 (and the engine's -1) and min_p 0: off, as in the engine
            kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=max(s.top_k, 0))
            if s.min_p > 0:
                kwargs["min_p"] = s.min_p
        if self.mode == "generate":
            kwargs["cache_implementation"] = self.options.cache_implementation
            if self.options.torch_compile:
                from transformers import CompileConfig

                kwargs["compile_config"] = CompileConfig()
            else:
                kwargs["disable_compile"] = True
        # generate() fills unset fields from the model's own generation config: EOS must be off there too.
        self.model.generation_config.eos_token_id = sorted(self.eos) or None
        kwargs["eos_token_id"] = sorted(self.eos) or (-1 if self.mode == "continuous_batching" else None)
        return GenerationConfig(**kwargs)

    def _start_manager(self) -> float:
        cls = _cb_config_class()
        self.manager = self.model.init_continuous_batching(
            generation_config=self.generation_config, continuous_batching_config=cls(**self.cb_options)
        )
        t0 = time.perf_counter()
        self.manager.warmup()
        capture = time.perf_counter() - t0
        self.manager.start()
        from llmbench.bench.backends.transformers_cb import records_timestamps

        self.token_times_source = (
            "record_timestamps: transformers' generation thread stamps each token as it is appended"
            if records_timestamps(self.manager)
            else "streaming: each token stamped when its output reached the benchmark thread"
        )
        return capture

    def run(
        self,
        specs: list[RequestSpec],
        offsets: list[float] | None,
        *,
        concurrency: int | None,
        tag: str,
        max_duration: float | None,
        on_progress: OnProgress | None,
    ) -> DriveResult:
        check_drive_args(offsets, concurrency)
        ignore_eos = self.scenario.sampling.ignore_eos
        if self.mode == "generate":
            from llmbench.bench.backends.transformers_generate import run_generate

            return run_generate(
                self.model, self.generation_config, specs, offsets, concurrency=concurrency, eos=self.eos,
                ignore_eos=ignore_eos, max_duration=max_duration, on_progress=on_progress,
            )  # fmt: skip
        from llmbench.bench.backends.transformers_cb import run_continuous_batching

        return run_continuous_batching(
            self.manager, specs, offsets, concurrency=concurrency, eos=self.eos, ignore_eos=ignore_eos,
            tag=tag, max_duration=max_duration, on_progress=on_progress,
        )  # fmt: skip

    def between_repeats(self) -> None:
        pass  # prompts are fresh per repeat; transformers has no call to empty its prefix cache

    def shutdown(self) -> None:
        if self.manager is not None:
            try:
                self.manager.stop(block=True, timeout=10)
            finally:
                destroy = getattr(self.manager, "destroy", None)
                if destroy is not None:
                    destroy()
                self.manager = None
