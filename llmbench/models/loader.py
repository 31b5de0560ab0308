"""Load a Hugging Face-style folder: config.json plus single or sharded ``*.safetensors``.

Each checkpoint tensor is routed to its parameter's ``weight_loader`` (which keeps this rank's shard);
q/k/v and gate/up go to their fused parameters through the model's ``packed_modules``. A missing
tensor, an unexpected one or a shape that does not fit is an error naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from llmbench.models.config import ModelConfig, ModelConfigError, model_config_from_hf
from llmbench.models.registry import ARCHITECTURES


class WeightLoadError(ValueError):
    """A checkpoint does not match the model built from its config."""


# Buffers some checkpoints carry that the engine recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_model_config(folder: str | Path) -> ModelConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelConfigError(f"{folder} has no config.json")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path} is not valid JSON: {e}") from None
    if isinstance(raw.get("text_config"), dict) and "hidden_size" not in raw:
        raw = {**raw["text_config"], "architectures": raw.get("architectures")}
    return model_config_from_hf(raw, ARCHITECTURES)


def safetensors_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise WeightLoadError(f"{index} names shard(s) that are not in the folder: {missing}")
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"{folder} has no *.safetensors files")
    return files


def iter_checkpoint(folder: str | Path) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(tensor name, file name, tensor) for every tensor of a safetensors checkpoint."""
    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                yield key, file.name, f.get_tensor(key)


def load_weights(model: nn.Module, tensors: Iterable[tuple[str, str, torch.Tensor]], source: str) -> None:
    """Route checkpoint tensors (Hugging Face names, full shapes) into the model's parameters."""
    params = dict(model.named_parameters(remove_duplicate=False))
    packed: dict[str, tuple[str, object]] = getattr(model, "packed_modules", {})
    tied = getattr(model.config, "tie_word_embeddings", False)
    # A fused parameter is complete once each of its shards has arrived.
    expected: dict[str, set[object]] = {}
    for name in params:
        if tied and name == "lm_head.weight":
            continue
        shards = {sid for frag, (fused, sid) in packed.items() if f".{fused}." in f".{name}"}
        expected[name] = shards or {None}
    seen: dict[str, set[object]] = {name: set() for name in expected}

    for key, where, tensor in tensors:
        if key.endswith(_IGNORED_SUFFIXES) or (tied and key == "lm_head.weight"):
            continue
        target, shard_id = key, None
        for frag, (fused, sid) in packed.items():
            if f".{frag}." in key:
                target, shard_id = key.replace(f".{frag}.", f".{fused}."), sid
                break
        if target not in params:
            raise WeightLoadError(f"unexpected tensor {key!r} in {where}: the model has no such parameter")
        param = params[target]
        try:
            loader = getattr(param, "weight_loader", _default_loader)
            loader(param, tensor.to(param.dtype), shard_id)
        except ValueError as e:
            raise WeightLoadError(f"tensor {key!r} in {where}: {e}") from None
        seen[target].add(shard_id)

    missing = [n for n, want in expected.items() if not want <= seen[n]]
    if missing:
        raise WeightLoadError(f"checkpoint in {source} lacks tensor(s) for: {', '.join(missing[:8])}")


def _default_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"shape {tuple(loaded.shape)} does not fit the parameter's {tuple(param.shape)}")
    param.data.copy_(loaded)
