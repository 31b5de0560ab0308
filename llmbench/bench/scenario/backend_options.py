"""What a scenario may say about the peer backends it is measured on (``backend_options:``).

``backend:`` names who serves the workload: ``engine`` (llmbench's own, the default), ``transformers``
(the same model in Hugging Face transformers) or ``openai`` (any OpenAI-compatible completions server);
a list names several, which ``llmbench ablate`` compares side by side. Each peer's options live under
its own key, so one file can hold the options of every backend it compares::

    backend: [engine, transformers, openai]
    backend_options:
      transformers: {attn_implementation: sdpa, cuda_graph: true}
      openai: {url: "http://127.0.0.1:8000", model: Qwen/Qwen3-0.6B, max_concurrency: 64}

Engine options stay under ``engine:``; the transformers backend reads ``engine.device``, ``engine.dtype``
and ``engine.seed`` from there unless its own options say otherwise (same device, dtype and weights).
Which backends exist, and which of these models is whose, is the registry (``backend_registry.py``).
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from llmbench.bench.scenario.fields import StrictModel

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TransformersOptions(StrictModel):
    """Hugging Face transformers on the same device, dtype and weights as the engine.

    mode: ``continuous_batching`` (``init_continuous_batching``: paged KV, requests join every step),
    ``generate`` (``model.generate`` one request at a time, with a static cache), or ``auto``:
    generate when one request is in flight at a time (``arrival: {kind: concurrency, concurrency: 1}``),
    continuous batching otherwise.
    """

    mode: Literal["auto", "continuous_batching", "generate"] = "auto"
    attn_implementation: str = "sdpa"  # continuous batching pages it (paged|sdpa); generate runs it as is
    device: str | None = None  # default: engine.device (auto: cuda when torch sees one)
    dtype: Literal["auto", "float32", "float16", "bfloat16"] | None = None  # default: engine.dtype
    cuda_graph: bool | None = None  # continuous batching's use_cuda_graph; None lets transformers decide
    torch_compile: bool = False  # generate: compile the forward (static cache); CB: default_compile_level
    compile_level: int = Field(default=1, ge=1, le=3)  # continuous batching's default_compile_level when on
    cache_implementation: Literal["static", "dynamic"] = "static"  # generate's KV cache
    num_blocks: int | None = Field(default=None, ge=1)  # CB KV pages; None: sized for the workload on CPU
    page_size: int | None = Field(default=None, ge=4)  # CB tokens per page (transformers' block size)
    max_batch_tokens: int | None = Field(default=None, ge=1)  # CB token budget per step
    max_requests_per_batch: int | None = Field(default=None, ge=1)
    allow_block_sharing: bool = True  # CB prefix caching


class OpenAIOptions(StrictModel):
    """An OpenAI-compatible server, streamed ``/v1/completions`` requests with token-id prompts.

    url: the server's base (``http://host:8000`` or ``.../v1``; ``/v1/completions`` is appended) or the
    full completions URL. model: the name the server serves (default: the scenario's ``model``).
    api_key_env: the *name* of an environment variable holding the key (never the key itself).
    max_concurrency: requests in flight at most; more wait in the client (reported as client queue time,
    not in TTFT). timeout_s bounds a whole request, connect_timeout_s its connection. prompt: token ids
    (exact lengths) or text decoded with the scenario model's tokenizer. send_ignore_eos: add vLLM's
    ``ignore_eos``/``min_tokens`` when the scenario ignores EOS. token_ids: ask for each chunk's token ids
    (vLLM's ``return_token_ids``) so multi-token chunks are counted exactly. include_usage: ask for the
    server's token counts at the stream's end (``stream_options``). vocab_size: the vocabulary random prompt
    ids are drawn from when the scenario's model is neither a preset nor a folder. extra_body: merged into
    every request body.
    """

    url: str = Field(description="the server's base URL")
    model: str | None = None
    api_key_env: str | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    timeout_s: float = Field(default=600.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    prompt: Literal["token_ids", "text"] = "token_ids"
    send_ignore_eos: bool = True
    token_ids: bool = False
    include_usage: bool = True
    vocab_size: int | None = Field(
        default=None, ge=2
    )  # when the scenario's model is neither preset nor folder
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http:// or https:// URL with a host, got {value!r}")
        try:
            parts.port  # noqa: B018 -- raises on a malformed port
        except ValueError:
            raise ValueError(f"has a malformed port: {value!r}") from None
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(
                "is the name of an environment variable (letters, digits, '_'), not the key itself"
            )
        return value

    @field_validator("extra_body")
    @classmethod
    def _no_reserved_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = sorted({"prompt", "stream", "max_tokens", "model"} & set(value))
        if reserved:
            raise ValueError(f"sets {', '.join(reserved)}, which every request sets itself")
        return value
