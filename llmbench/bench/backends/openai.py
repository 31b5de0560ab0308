"""Any OpenAI-compatible completions server as a peer backend (vLLM, SGLang, llama.cpp server, ...).

Each request is a streamed ``POST /v1/completions`` with the workload's exact prompt token ids (a list of
ints, which vLLM and SGLang take as is), ``max_tokens``, and -- when the scenario ignores EOS -- vLLM's
``ignore_eos``/``min_tokens`` so every request produces exactly the tokens asked for. The scenario's
``model`` (a preset, a local folder of the served model, or its hub id where the local Hugging Face cache
holds it) gives the vocabulary that random prompt ids are drawn from and the tokenizer for text workloads;
``backend_options.openai.model`` is the name the server serves. ``start()`` asks the server for
``/v1/models`` first, so a dead server or a wrong model name fails before anything is measured; where
that answer is not a model list, one one-token request must succeed instead (a wrong URL path fails
there). Output tokens are counted as openai_counts.py says.

What the client cannot see is unavailable, with the reason: the server's own queue (only the client's is
measured), its start-up, GPUs and memory, and everything the engine reports per step.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

from llmbench import collector
from llmbench.bench.backends.base import (
    OnProgress,
    check_drive_args,
    peer_unavailable,
    untaken_engine_options,
)
from llmbench.bench.backends.engine import request_seed
from llmbench.bench.backends.openai_driver import Client, Counting, Flight
from llmbench.bench.backends.openai_http import Endpoint, body_lines, close, read_error_body, request
from llmbench.bench.backends.openai_warnings import late_sends, loop_stalls
from llmbench.bench.driver import DriveResult
from llmbench.bench.errors import BenchError, RunFailed
from llmbench.bench.scenario.schema import Scenario
from llmbench.bench.workload.spec import RequestSpec

_TEXT_SOURCES = ("file", "sharegpt")
# The last part of a URL's path that names an endpoint other than completions, which this backend does not
# speak: chat takes messages (no token-id prompts), the others are not text generation or not OpenAI's.
_OTHER_ENDPOINTS = ("chat/completions", "chat", "responses", "embeddings", "models", "messages", "generate")


class _NoTokenizer:
    """Stands in where the served model's tokenizer is unknown; synthetic workloads never call it."""

    eos_token_id = None

    def encode(self, text: str, special: bool = True) -> list[int]:
        raise BenchError("text prompts need the served model's tokenizer: set model to its local folder")

    def decode(self, ids: list[int]) -> str:
        raise BenchError(
            "backend_options.openai.prompt: text needs the served model's tokenizer (model: a folder)"
        )


def _text_counter(tokenizer: Any) -> Callable[[str], int] | None:
    from llmbench.models.tokenizer import HFTokenizer

    if not isinstance(tokenizer, HFTokenizer):
        return None
    return lambda text: len(tokenizer.encode(text, special=False))  # an output's text: no BOS of its own


def endpoints(url: str) -> tuple[Endpoint, Endpoint]:
    """(completions, models) endpoints from a base URL, a ``.../v1`` URL or the completions URL itself."""
    ep = Endpoint.parse(url)
    path = ep.path.split("?")[0].rstrip("/")
    named = next((e for e in _OTHER_ENDPOINTS if path.endswith(f"/{e}")), None)
    if named is not None:
        raise BenchError(
            f"backend_options.openai.url: {url} names the /{named} endpoint; the openai backend sends "
            "completions requests (prompts as token ids): give the server's base URL (http://host:port), "
            "its /v1, or its /v1/completions"
        )
    if path.endswith("/completions"):
        base = path[: -len("/completions")]
        completions = ep.path
    else:
        base = path if path.endswith("/v1") else f"{path}/v1"
        completions = f"{base}/completions"
    return ep.with_path(completions), ep.with_path(f"{base}/models")


class OpenAIBackend:
    name = "openai"

    def __init__(self, scenario: Scenario) -> None:
        from llmbench.models.registry import UnknownModelError, resolve_model
        from llmbench.models.tokenizer import IdsOnly, serving_tokenizer

        self.scenario = scenario
        opts = scenario.backend_options.openai
        if opts is None:  # the schema asks for it; a scenario built in code might not
            raise BenchError("backend_options.openai.url: required for backend 'openai'")
        self.options = opts
        self.completions, self.models = endpoints(opts.url)
        self.served_model = opts.model or scenario.model
        self.headers: dict[str, str] = {}
        if opts.api_key_env:
            key = os.environ.get(opts.api_key_env)
            if not key:
                raise BenchError(
                    f"backend_options.openai.api_key_env: environment variable {opts.api_key_env} is not set"
                )
            self.headers["Authorization"] = f"Bearer {key}"
        try:
            model_config, folder = resolve_model(scenario.model)
        except UnknownModelError:
            model_config = folder = None
        if model_config is not None:
            self.vocab_size = opts.vocab_size or model_config.vocab_size
            # a tokenizer that cannot be loaded stops text only: token-id prompts are sent as they are
            self.tokenizer: Any = serving_tokenizer(folder, self.vocab_size, scenario.model)
            if isinstance(self.tokenizer, IdsOnly) and opts.prompt == "text":
                raise BenchError(
                    f"backend_options.openai.prompt: text needs a tokenizer: {self.tokenizer.reason}"
                )
        elif opts.vocab_size is None:
            raise BenchError(
                f"backend_options.openai.vocab_size: needed because model {scenario.model!r} is not a preset, "
                "a local folder, nor a repository in the local Hugging Face cache (random prompt ids must lie in "
                "the served model's vocabulary); or set model to the served model's local folder"
            )
        elif scenario.workload.source in _TEXT_SOURCES or opts.prompt == "text":
            raise BenchError(
                f"workload.source {scenario.workload.source!r} / prompt {opts.prompt!r} needs the served "
                f"model's tokenizer: set model to its local folder (now {scenario.model!r})"
            )
        else:
            self.vocab_size = opts.vocab_size
            self.tokenizer = _NoTokenizer()
        # Only the served model's own tokenizer can count its output from text (a preset's byte-level
        # stand-in is not the server's): openai_counts.py.
        self.count_text = _text_counter(self.tokenizer)
        self.device = "remote"
        self.cuda_indices: list[int] | None = None
        self.tp = 1
        self.model_info: Any = None
        self.max_model_len: int | None = None
        self.server_models: list[str] | None = None
        self.startup: dict[str, Any] = {}
        self.warnings: list[str] = untaken_engine_options(scenario, self.name, ())
        self.unavailable = {
            **peer_unavailable(self.name),
            "queue": "a remote server does not say when it scheduled a request (the client's own queue is "
            "client_queue)",
            **dict.fromkeys(
                ("arrival_lag_p99", "arrival_lag_max"),
                "the openai backend sends each request as it enters, so its arrival is its send; lateness "
                "against the schedule is client_queue",
            ),
        }
        self.output_len_sources: dict[str, int] = {}  # where measured requests' output counts came from

    def describe(self) -> dict[str, Any]:
        o = self.options
        return {
            "device": self.device,
            "url": o.url,
            "completions_url": self.completions.url,
            "model": self.served_model,
            "api_key_env": o.api_key_env,  # the variable's name only, never the key
            "max_concurrency": o.max_concurrency,
            "timeout_s": o.timeout_s,
            "connect_timeout_s": o.connect_timeout_s,
            "prompt": o.prompt,
            "send_ignore_eos": o.send_ignore_eos,
            "token_ids": o.token_ids,
            "include_usage": o.include_usage,
            "extra_body": o.extra_body,
            "server_models": self.server_models,
            "server_max_model_len": self.max_model_len,
            "count_from_text": self.count_text is not None,
            "output_len_sources": dict(self.output_len_sources),
        }

    def body_for(self, spec: RequestSpec) -> dict[str, Any]:
        o, s = self.options, self.scenario.sampling
        body: dict[str, Any] = {
            "model": self.served_model,
            "prompt": spec.prompt if o.prompt == "token_ids" else self.tokenizer.decode(spec.prompt),
            "max_tokens": spec.max_tokens,
            "stream": True,
            "temperature": s.temperature,
        }
        if s.top_p < 1:
            body["top_p"] = s.top_p
        if s.top_k > 0:
            body["top_k"] = s.top_k
        if s.min_p > 0:
            body["min_p"] = s.min_p
        seed = request_seed(self.scenario, spec)
        if seed is not None:
            body["seed"] = seed
        if o.include_usage:
            body["stream_options"] = {"include_usage": True}
        if s.ignore_eos and o.send_ignore_eos:
            body.update(ignore_eos=True, min_tokens=spec.max_tokens)
        if o.token_ids:
            body["return_token_ids"] = True
        body.update(o.extra_body)
        return body

    def start(self) -> None:
        """Ask the server which models it serves: fails early on a dead server, a wrong model name, or a URL
        where no completions are served."""
        t0 = time.perf_counter()
        try:
            status, text = asyncio.run(self._get_models())
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ConnectionError) as exc:
            raise RunFailed(
                f"cannot reach the openai server at {self.options.url}: {exc or type(exc).__name__}"
            ) from None
        if status in (401, 403):
            raise RunFailed(f"the server at {self.options.url} refused the key (HTTP {status}): {text[:200]}")
        if not self._check_models(status, text):
            self._check_completions(f"HTTP {status}" if status != 200 else "HTTP 200 without a model list")
        # What start-up loaded (torch, a tokenizer) stays out of the collector's walks, as the engine's does:
        # a full collection in the middle of a point holds the client's loop up and stamps tokens late.
        collector.freeze_startup()
        self.startup = {"server_check_time": time.perf_counter() - t0}

    def _check_models(self, status: int, text: str) -> bool:
        """Whether ``/v1/models`` listed models (the served one among them, else an error)."""
        if status != 200:
            return False
        try:
            data = json.loads(text).get("data") or []
        except (ValueError, AttributeError):
            data = []
        entries = [d for d in data if isinstance(d, dict) and "id" in d] if isinstance(data, list) else []
        if not entries:
            return False
        self.server_models = [str(d["id"]) for d in entries]
        if self.served_model not in self.server_models:
            raise RunFailed(
                f"the server at {self.options.url} serves {', '.join(self.server_models)}, not "
                f"{self.served_model!r}: set backend_options.openai.model"
            )
        mine = next(d for d in entries if str(d["id"]) == self.served_model)
        if isinstance(mine.get("max_model_len"), int):  # vLLM says it
            self.max_model_len = mine["max_model_len"]
        return True

    def _check_completions(self, models_said: str) -> None:
        """``/v1/models`` listed nothing (some proxies and servers have none): one one-token request must
        succeed instead, or nothing would."""
        flight = Flight(RequestSpec("server-check", [1], 1), time.perf_counter())
        asyncio.run(self._client(None).send(flight))
        if flight.error is not None:
            raise RunFailed(
                f"the server at {self.options.url} answered {self.models.url} with {models_said}, and a one-token "
                f"request to {self.completions.url} failed: {flight.error}. backend_options.openai.url takes the "
                "server's base URL (http://host:port), its /v1, or its /v1/completions"
            )
        self.warnings.append(
            f"the server answered {self.models.url} with {models_said}, so the model name "
            f"{self.served_model!r} was not checked (a one-token request to {self.completions.url} succeeded)"
        )

    def _client(self, cap: int | None) -> Client:
        o = self.options
        counting = Counting(self.scenario.sampling.ignore_eos, o.token_ids, self.count_text)
        return Client(
            self.completions, self.headers, self.body_for, timeout_s=o.timeout_s,
            connect_timeout_s=o.connect_timeout_s, max_concurrency=cap, counting=counting,
        )  # fmt: skip

    async def _get_models(self) -> tuple[int, str]:
        resp = await request(self.models, "GET", None, self.headers, self.options.connect_timeout_s)
        try:
            if resp.status != 200:
                return resp.status, await read_error_body(resp)
            lines = [line async for line in body_lines(resp)]
            return resp.status, "\n".join(lines)
        finally:
            await close(resp)

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
        cap = self.options.max_concurrency
        if offsets is not None and concurrency is not None:  # the scenario's arrival.max_concurrency
            if cap and cap != concurrency:
                raise BenchError(
                    f"arrival.max_concurrency {concurrency} and backend_options.openai.max_concurrency {cap} "
                    "disagree: give one"
                )
            cap, concurrency = concurrency, None
        client = self._client(cap)
        result = client.run(specs, offsets, concurrency, max_duration, on_progress)
        if tag == "w-":
            return result
        sources = self.output_len_sources
        for r in result.requests:
            if r.output_len_source is not None:
                sources[r.output_len_source] = sources.get(r.output_len_source, 0) + 1
        # Without a limit, a request held in the client was held by the client's own event loop.
        late = late_sends(result.requests) if offsets is not None and not cap else None
        stalls = loop_stalls(client.loop_lag, result.requests)
        self.warnings += [w for w in (late, stalls) if w is not None]
        if client.multi_token_chunks:
            self.warnings.append(
                f"{client.multi_token_chunks} stream chunks carried more than one token: their tokens share the "
                "chunk's time (ITL counts 0 between them; TPOT divides by the token count)"
            )
        return result

    def between_repeats(self) -> None:
        pass  # a server's prefix cache cannot be emptied through the API; prompts are fresh per repeat

    def shutdown(self) -> None:
        collector.thaw()
