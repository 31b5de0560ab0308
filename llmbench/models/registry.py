"""Supported architectures, keyed by the ``architectures`` entry of config.json, and how a model name
is found: a preset's shapes or a local folder's config.json.

``resolve_model`` needs neither the engine nor torch's model code, so the peer backends (transformers,
an OpenAI-compatible server) can use it without loading the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llmbench.models.config import ModelConfig, ModelConfigError
from llmbench.models.presets import PRESETS
from llmbench.suggest import did_you_mean

if TYPE_CHECKING:
    from torch import nn

    from llmbench.models.llama import BuildOptions

# Structural flags of each architecture that config.json does not spell out.
ARCHITECTURES: dict[str, dict[str, bool]] = {
    "LlamaForCausalLM": {"qk_norm": False, "qkv_bias": False},
    "Qwen2ForCausalLM": {"qk_norm": False, "qkv_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True, "qkv_bias": False},
}


class UnknownModelError(ModelConfigError):
    """A model name that is neither a preset nor a folder."""


def resolve_model(model: str) -> tuple[ModelConfig, Path | None]:
    """A preset's config (and None), or a folder's config.json (and the folder)."""
    if model in PRESETS:
        return PRESETS[model].config, None
    folder = Path(model).expanduser()
    if folder.is_dir():
        from llmbench.models.loader import read_model_config  # (the loader imports ARCHITECTURES from here)

        return read_model_config(folder), folder
    if folder.is_file():
        raise UnknownModelError(
            f"model {model!r} is a file: a model is a preset or the folder holding config.json and "
            f"*.safetensors (here perhaps {str(folder.parent)!r})"
        )
    raise UnknownModelError(
        f"Unknown model {model!r}{did_you_mean(model, PRESETS)}: not a preset ({', '.join(PRESETS)}) nor a "
        "folder holding config.json"
    )


def build_model(cfg: ModelConfig, opts: BuildOptions) -> nn.Module:
    from llmbench.models.llama import LlamaForCausalLM

    if cfg.architecture not in ARCHITECTURES:
        raise ModelConfigError(
            f"Unsupported architecture: {cfg.architecture!r}. Supported: {sorted(ARCHITECTURES)}"
        )
    return LlamaForCausalLM(cfg, opts)
