"""The same model the engine runs, built in Hugging Face transformers.

A preset becomes a transformers config of its architecture (Qwen3, Qwen2, Llama with Llama 3 RoPE
scaling) whose weights are drawn by :func:`init_random_weights` from the engine's seed, so both hold the
same numbers (drawn on the same device, then cast to the same dtype). A folder is loaded with
``AutoModelForCausalLM.from_pretrained``. Works with transformers 4.51 and later (``torch_dtype`` became
``dtype`` in 4.56; ``rope_theta``/``rope_scaling`` keywords are accepted by both generations).
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import Any

import torch

from llmbench.bench.errors import BenchError
from llmbench.models.config import ModelConfig

_CONFIG_CLASSES = {
    "Qwen3ForCausalLM": "Qwen3Config",
    "Qwen2ForCausalLM": "Qwen2Config",
    "LlamaForCausalLM": "LlamaConfig",
}


class HFModelError(BenchError):
    """A model the transformers backend cannot build."""


def transformers_version() -> tuple[int, int]:
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def dtype_keyword() -> str:
    """``from_pretrained``/``from_config`` call it ``dtype`` from 4.56 on, ``torch_dtype`` before."""
    return "dtype" if transformers_version() >= (4, 56) else "torch_dtype"


def hf_config(cfg: ModelConfig) -> Any:
    """A transformers config with the shapes, RoPE and flags of an engine ``ModelConfig``."""
    import transformers

    name = _CONFIG_CLASSES.get(cfg.architecture)
    if name is None:
        raise HFModelError(
            f"Unsupported architecture for the transformers backend: {cfg.architecture!r}. "
            f"Supported: {sorted(_CONFIG_CLASSES)}"
        )
    kwargs: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_theta=cfg.rope.theta,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id,
    )
    if cfg.architecture == "Qwen2ForCausalLM":
        if cfg.head_dim != cfg.hidden_size // cfg.num_attention_heads:
            raise HFModelError(
                f"Qwen2 derives head_dim from hidden_size/heads; this model has {cfg.head_dim}"
            )
    else:
        kwargs["head_dim"] = cfg.head_dim
    if cfg.architecture == "LlamaForCausalLM":
        kwargs.update(attention_bias=cfg.qkv_bias, mlp_bias=cfg.mlp_bias)
    if cfg.rope.kind == "llama3":
        kwargs["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": cfg.rope.factor,
            "low_freq_factor": cfg.rope.low_freq_factor,
            "high_freq_factor": cfg.rope.high_freq_factor,
            "original_max_position_embeddings": cfg.rope.original_max_position_embeddings,
        }
    elif cfg.rope.kind != "default":
        raise HFModelError(f"Unsupported rope type: {cfg.rope.kind!r}. Supported: ['default', 'llama3']")
    return getattr(transformers, name)(**kwargs)


def _no_init() -> contextlib.AbstractContextManager[Any]:
    """Skip transformers' own weight init (every tensor is drawn again right after)."""
    for module in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(mod, "no_init_weights"):
            return mod.no_init_weights()
    return contextlib.nullcontext()


def preset_model(
    cfg: ModelConfig, seed: int, device: str, dtype: torch.dtype, attn: str | None = None
) -> Any:
    """A transformers model with the weights the engine's preset draws (same seed, same device)."""
    import transformers

    from llmbench.models.random_weights import init_random_weights

    hf_cfg = hf_config(cfg)
    kwargs: dict[str, Any] = {dtype_keyword(): dtype}
    if attn is not None:
        kwargs["attn_implementation"] = attn
    with torch.device(device), _no_init():
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg, **kwargs)
    init_random_weights(model, seed)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def folder_model(folder: Path, device: str, dtype: torch.dtype, attn: str | None = None) -> Any:
    import transformers

    kwargs: dict[str, Any] = {dtype_keyword(): dtype}
    if attn is not None:
        kwargs["attn_implementation"] = attn
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    return model.to(device).eval()
