"""Supported architectures, keyed by the ``architectures`` entry of config.json."""

from __future__ import annotations

from torch import nn

from llmbench.models.config import ModelConfig, ModelConfigError
from llmbench.models.llama import BuildOptions, LlamaForCausalLM

# Structural flags of each architecture that config.json does not spell out.
ARCHITECTURES: dict[str, dict[str, bool]] = {
    "LlamaForCausalLM": {"qk_norm": False, "qkv_bias": False},
    "Qwen2ForCausalLM": {"qk_norm": False, "qkv_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True, "qkv_bias": False},
}


def build_model(cfg: ModelConfig, opts: BuildOptions) -> nn.Module:
    if cfg.architecture not in ARCHITECTURES:
        raise ModelConfigError(
            f"Unsupported architecture: {cfg.architecture!r}. Supported: {sorted(ARCHITECTURES)}"
        )
    return LlamaForCausalLM(cfg, opts)
