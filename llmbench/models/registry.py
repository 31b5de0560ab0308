"""Supported architectures, keyed by the ``architectures`` entry of config.json, and how a model name
is found: a preset's shapes, a local folder's config.json, or a Hugging Face repository id already in the
local Hugging Face cache (llmbench never downloads).

``resolve_model`` needs neither the engine nor torch's model code, so the peer backends (transformers,
an OpenAI-compatible server) can use it without loading the engine.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from llmbench.models.config import ModelConfig, ModelConfigError
from llmbench.models.presets import PRESETS
from llmbench.suggest import did_you_mean, nearest

if TYPE_CHECKING:
    from torch import nn

    from llmbench.models.llama import BuildOptions

# Structural flags of each architecture that config.json does not spell out.
ARCHITECTURES: dict[str, dict[str, bool]] = {
    "LlamaForCausalLM": {"qk_norm": False, "qkv_bias": False},
    "Qwen2ForCausalLM": {"qk_norm": False, "qkv_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True, "qkv_bias": False},
}


# "org/name": what the Hugging Face hub calls a model repository.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class UnknownModelError(ModelConfigError):
    """A model name that is neither a preset, a folder, nor a repository in the local Hugging Face cache."""


def hub_snapshot(repo_id: str, cache_dir: str | Path | None = None) -> Path | None:
    """The folder of ``repo_id``'s cached snapshot (its ``main`` revision) holding config.json, or None
    when the local Hugging Face cache (``HF_HUB_CACHE``, or ``cache_dir``) does not hold one."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    return Path(found).parent if isinstance(found, str) else None


def cached_models(cache_dir: str | Path | None = None) -> dict[str, ModelConfig | str]:
    """Each model repository in the local Hugging Face cache that has a snapshot: its config, or why
    llmbench cannot run it (an architecture it lacks, a broken config.json)."""
    from huggingface_hub import constants

    from llmbench.models.loader import read_model_config

    root = Path(cache_dir or constants.HF_HUB_CACHE)
    found: dict[str, ModelConfig | str] = {}
    for repo in sorted(root.glob("models--*--*")):
        repo_id = repo.name.removeprefix("models--").replace("--", "/", 1)
        snapshot = hub_snapshot(repo_id, root)
        if snapshot is None:
            continue
        try:
            found[repo_id] = read_model_config(snapshot)
        except ModelConfigError as exc:
            found[repo_id] = str(exc).removeprefix(f"{snapshot / 'config.json'}: ")
        if not any(snapshot.glob("*.safetensors")):
            found[repo_id] = "no *.safetensors in its snapshot (the weights were not downloaded)"
    return found


def _cached_ids() -> list[str]:
    """The repository ids the local Hugging Face cache holds a folder for (downloaded or not)."""
    from huggingface_hub import constants

    root = Path(constants.HF_HUB_CACHE)
    if not root.is_dir():
        return []
    return [p.name.removeprefix("models--").replace("--", "/", 1) for p in root.glob("models--*--*")]


def _not_cached(model: str) -> UnknownModelError:
    from huggingface_hub import constants

    preset = difflib.get_close_matches(model.rsplit("/", 1)[-1].lower(), list(PRESETS), n=1, cutoff=0.75)
    same_shapes = f", or use the preset {preset[0]!r} (its shapes, random weights)" if preset else ""
    return UnknownModelError(
        f"model {model!r}{did_you_mean(model, [i for i in _cached_ids() if i != model])} is not a preset, not a folder, and not in the "
        f"local Hugging Face cache ({constants.HF_HUB_CACHE}); llmbench does not download: fetch it first "
        f"with `hf download {model}` (or `huggingface-cli download {model}`), or give its folder{same_shapes}"
    )


def _no_such_folder(model: str, folder: Path) -> UnknownModelError:
    """A path that names no folder: the sibling it may have meant (``models/goood`` -> ``models/good``)."""
    parent = folder.parent
    siblings = [p.name for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
    near = nearest(folder.name, siblings)
    hint = f" (did you mean {str(parent / near)!r}?)" if near else ""
    where = "" if parent.is_dir() else f", nor its parent {str(parent)!r}"
    return UnknownModelError(
        f"model {model!r}: no such folder{where}{hint}; a model is a preset, a folder holding config.json "
        "and *.safetensors, or a Hugging Face repository id (org/name) in the local cache"
    )


def _is_path(model: str, folder: Path) -> bool:
    """Whether ``model`` is written as a path rather than a preset or a hub id: it starts like one, or it
    reads as org/name but the folder it would be in exists here."""
    if model.startswith(("/", "~", ".")) or model.count("/") > 1 or "\\" in model:
        return True
    return "/" in model and folder.parent.is_dir()


def resolve_model(model: str) -> tuple[ModelConfig, Path | None]:
    """A preset's config (and None), or the config.json of a folder or of a cached hub repository's
    snapshot (and that folder)."""
    if model in PRESETS:
        if (Path(model) / "config.json").is_file():  # a download into ./<name>: the same name, two models
            raise UnknownModelError(
                f"model {model!r} names both a preset (its shapes with random weights) and the folder "
                f"./{model} here: write ./{model} for the folder's weights, or run from another folder for "
                "the preset"
            )
        return PRESETS[model].config, None
    folder = Path(model).expanduser()
    if not folder.exists() and HUB_ID.fullmatch(model):
        snapshot = hub_snapshot(model)
        if snapshot is None:
            raise _no_such_folder(model, folder) if _is_path(model, folder) else _not_cached(model)
        folder = snapshot
    if folder.is_dir():
        from llmbench.models.loader import read_model_config  # (the loader imports ARCHITECTURES from here)

        return read_model_config(folder), folder
    if folder.is_file():
        raise UnknownModelError(
            f"model {model!r} is a file: a model is a preset or the folder holding config.json and "
            f"*.safetensors (here perhaps {str(folder.parent)!r})"
        )
    if _is_path(model, folder):
        raise _no_such_folder(model, folder)
    raise UnknownModelError(
        f"Unknown model {model!r}{did_you_mean(model, PRESETS)}: not a preset ({', '.join(PRESETS)}), a "
        "folder holding config.json, nor a Hugging Face repository id (org/name) in the local cache"
    )


def check_model_files(model: str) -> None:
    """A model folder's checkpoint fits the model its config.json describes, from every file's header
    (names, shapes, dtypes; nothing of a preset to check), and a tied config's own output head, where the
    checkpoint stores one, equals its embedding: what is cheap to know of its weights before an engine is
    built, for the checks made before any cost (models/checkpoint_check.py; the head's values are read only
    in that one case)."""
    # (imported here: the loader imports ARCHITECTURES from this module)
    from llmbench.models.checkpoint_check import check_checkpoint, check_tied_head

    config, folder = resolve_model(model)
    if folder is not None:
        check_checkpoint(folder, config)
        check_tied_head(folder, config)


def build_model(cfg: ModelConfig, opts: BuildOptions) -> nn.Module:
    from llmbench.models.llama import LlamaForCausalLM

    if cfg.architecture not in ARCHITECTURES:
        raise ModelConfigError(
            f"Unsupported architecture: {cfg.architecture!r}. Supported: {sorted(ARCHITECTURES)}"
        )
    return LlamaForCausalLM(cfg, opts)
