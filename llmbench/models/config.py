"""A model's shape, read from a Hugging Face ``config.json`` of either transformers generation.

transformers 4 writes ``rope_theta``/``rope_scaling``/``torch_dtype``; transformers 5 writes
``rope_parameters``/``dtype``. Both are accepted; anything the engine cannot honour is an error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class ModelConfigError(ValueError):
    """A config.json the engine cannot run."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # "default" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope: RopeConfig
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    qkv_bias: bool  # Qwen2: bias on q/k/v projections
    mlp_bias: bool
    dtype: str | None = None  # as stored, e.g. "bfloat16"
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        return self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)

    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            attn += 2 * self.head_dim
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        per_layer = attn + mlp + 2 * h
        embed = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embed + h

    def kv_bytes_per_token(self, dtype_size: int) -> int:
        return 2 * self.num_hidden_layers * self.kv_size * dtype_size

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def _rope_from_hf(cfg: dict[str, Any]) -> RopeConfig:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return RopeConfig(theta=float(theta))
    if kind == "llama3":
        return RopeConfig(
            theta=float(theta),
            kind="llama3",
            factor=float(params["factor"]),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
        )
    raise ModelConfigError(f"Unsupported rope type: {kind!r}. Supported: ['default', 'llama3']")


def model_config_from_hf(cfg: dict[str, Any], supported: dict[str, dict[str, bool]]) -> ModelConfig:
    """Parse a config.json dict. ``supported`` maps architecture name -> its structural flags."""
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in supported), None)
    if arch is None:
        raise ModelConfigError(
            f"Unsupported architecture: {archs or cfg.get('model_type')!r}. Supported: {sorted(supported)}"
        )
    if cfg.get("use_sliding_window"):
        raise ModelConfigError("Sliding-window attention (use_sliding_window=true) is not supported")
    flags = supported[arch]
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        eos = cfg.get("eos_token_id")
        return ModelConfig(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope=_rope_from_hf(cfg),
            qk_norm=flags["qk_norm"],
            qkv_bias=flags["qkv_bias"] or bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            dtype=cfg.get("dtype") or cfg.get("torch_dtype"),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        )
    except KeyError as e:
        raise ModelConfigError(f"config.json lacks the field {e.args[0]!r}, which {arch} needs") from None
