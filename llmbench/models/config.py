"""A model's shape, read from a Hugging Face ``config.json`` of either transformers generation.

transformers 4 writes ``rope_theta``/``rope_scaling``/``torch_dtype``; transformers 5 writes
``rope_parameters``/``dtype``. Both are accepted; anything the engine cannot honour is an error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from llmbench.models.errors import ModelError


class ModelConfigError(ModelError):
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


_REQUIRED = object()


def _number(
    cfg: dict[str, Any], key: str, arch: str, default: Any = _REQUIRED, *, integer: bool = True
) -> Any:
    """``cfg[key]`` as a positive int (or float); a missing or ill-typed value is a ModelConfigError."""
    value = cfg.get(key)
    if value is None:  # absent, or written as null
        if default is _REQUIRED:
            raise ModelConfigError(f"lacks the field {key!r}, which {arch} needs")
        return default
    kind = "a positive integer" if integer else "a positive number"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if ok and integer and value != int(value):
        ok = False
    if not ok:
        raise ModelConfigError(f"field {key!r} must be {kind}, got {value!r}")
    return int(value) if integer else float(value)


def _rope_from_hf(cfg: dict[str, Any], arch: str) -> RopeConfig:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ModelConfigError(f"field 'rope_parameters' / 'rope_scaling' must be an object, got {params!r}")
    theta = _number(params if "rope_theta" in params else cfg, "rope_theta", arch, 10000.0, integer=False)
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "llama3":
        return RopeConfig(
            theta=theta,
            kind="llama3",
            factor=_number(params, "factor", "llama3 rope scaling", integer=False),
            low_freq_factor=_number(params, "low_freq_factor", arch, 1.0, integer=False),
            high_freq_factor=_number(params, "high_freq_factor", arch, 4.0, integer=False),
            # absent, transformers takes the model's own context length
            original_max_position_embeddings=_number(
                params,
                "original_max_position_embeddings",
                arch,
                _number(cfg, "max_position_embeddings", arch, 4096),
            ),
        )
    raise ModelConfigError(f"Unsupported rope type: {kind!r}. Supported: ['default', 'llama3']")


def model_config_from_hf(cfg: dict[str, Any], supported: dict[str, dict[str, bool]]) -> ModelConfig:
    """Parse a config.json dict. ``supported`` maps architecture name -> its structural flags.

    Messages do not name the file; the caller that read it puts its path in front."""
    archs = cfg.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    arch = next((a for a in archs if isinstance(a, str) and a in supported), None)
    if arch is None and not archs:  # as transformers does, the model type names the class
        model_type = str(cfg.get("model_type", "")).lower()
        arch = next((a for a in supported if a.removesuffix("ForCausalLM").lower() == model_type), None)
    if arch is None:
        if archs:
            named = repr(archs[0]) if len(archs) == 1 else repr(archs)
        else:
            named = f"none named (no 'architectures' field; model_type {cfg.get('model_type')!r})"
        raise ModelConfigError(f"Unsupported architecture: {named}. Supported: {sorted(supported)}")
    if cfg.get("use_sliding_window"):
        raise ModelConfigError("Sliding-window attention (use_sliding_window=true) is not supported")
    if quant := cfg.get("quantization_config"):
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise ModelConfigError(
            f"quantization_config (quant_method {method!r}) describes quantized weights: llmbench runs float "
            "checkpoints (float32, float16, bfloat16) only; use the model's unquantized release"
        )
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # (transformers takes "swish" for SiLU too)
        raise ModelConfigError(f"Unsupported hidden_act: {act!r} (the MLP's activation). Supported: ['silu']")
    if cfg.get("attention_bias") and not supported[arch]["qkv_bias"]:
        raise ModelConfigError(
            "attention_bias=true (a bias on every attention projection, the output's too) is not supported; "
            "supported: a bias on q/k/v alone, as Qwen2 has"
        )
    flags = supported[arch]
    heads = _number(cfg, "num_attention_heads", arch)
    hidden = _number(cfg, "hidden_size", arch)
    kv_heads = _number(cfg, "num_key_value_heads", arch, heads)
    if heads % kv_heads:
        raise ModelConfigError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        )
    if cfg.get("head_dim") is None and hidden % heads:
        raise ModelConfigError(
            f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}) and no head_dim is given"
        )
    eos = cfg.get("eos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=_number(cfg, "vocab_size", arch),
        hidden_size=hidden,
        intermediate_size=_number(cfg, "intermediate_size", arch),
        num_hidden_layers=_number(cfg, "num_hidden_layers", arch),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=_number(cfg, "head_dim", arch, hidden // heads),
        rms_norm_eps=_number(cfg, "rms_norm_eps", arch, 1e-6, integer=False),
        max_position_embeddings=_number(cfg, "max_position_embeddings", arch, 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope=_rope_from_hf(cfg, arch),
        qk_norm=flags["qk_norm"],
        qkv_bias=flags["qkv_bias"],
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        dtype=cfg.get("dtype") or cfg.get("torch_dtype"),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
    )
