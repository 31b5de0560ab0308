"""Load a Hugging Face-style folder: config.json plus single or sharded ``*.safetensors``.

Each checkpoint tensor is routed to its parameter's ``weight_loader`` (which keeps this rank's shard);
q/k/v and gate/up go to their fused parameters through the model's ``packed_modules``. Whatever makes the
folder unusable -- no config.json, one that is not JSON or lacks a field, an unsupported architecture, no
weights, a safetensors file that cannot be read, a shard index naming absent files, a missing tensor, an
unexpected one, a shape that does not fit, a dtype that cannot stand for the parameter (an integer, bool or
float8 tensor where a float weight goes) -- is a :class:`ModelError` naming the file (and the tensor).
Float tensors are cast to the parameter's dtype (a float32 checkpoint runs in bfloat16). The same routing
runs over the safetensors headers alone, before any cost (models/checkpoint_check.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from llmbench.models.config import ModelConfig, ModelConfigError, model_config_from_hf
from llmbench.models.errors import ModelError
from llmbench.models.registry import ARCHITECTURES


class WeightLoadError(ModelError):
    """A checkpoint is unreadable or does not match the model built from its config."""


class TensorMismatch(WeightLoadError):
    """A checkpoint's tensors and the model's parameters disagree; ``kind`` ("shape", "missing" or
    "unexpected"), ``names`` (the checkpoint's names) and ``shape`` (the checkpoint's, for "shape") let the
    check before any cost say which config.json field is the likely cause."""

    kind = ""
    names: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()


def _mismatch(message: str, kind: str, names: Iterable[str], shape: Iterable[int] = ()) -> TensorMismatch:
    error = TensorMismatch(message)
    error.kind, error.names, error.shape = kind, tuple(names), tuple(shape)
    return error


# Buffers some checkpoints carry that the engine recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_LAYOUT = "a model folder holds config.json and *.safetensors, Hugging Face layout"
_INDEX = "model.safetensors.index.json"
# What a float parameter takes: float8 is excluded, as its values are stored divided by scales this
# loader does not apply (and an integer or bool tensor would be truncated to nonsense, silently).
_FLOAT_WEIGHTS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _read_json(path: Path, error: type[ModelError]) -> Any:
    try:
        return json.loads(path.read_bytes())
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not valid JSON (not UTF-8 text)") from None
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e})") from None


def read_model_config(folder: str | Path) -> ModelConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelConfigError(f"{folder}: no config.json ({_LAYOUT})")
    raw = _read_json(path, ModelConfigError)
    if not isinstance(raw, dict):
        raise ModelConfigError(
            f"{path}: expected a JSON object of model settings, got a {type(raw).__name__}"
        )
    if isinstance(raw.get("text_config"), dict) and "hidden_size" not in raw:
        raw = {**raw["text_config"], "architectures": raw.get("architectures")}
    try:
        config = model_config_from_hf(raw, ARCHITECTURES)
    except ModelConfigError as e:
        raise ModelConfigError(f"{path}: {e}") from None
    return _with_generation_eos(config, Path(folder) / "generation_config.json")


def _with_generation_eos(config: ModelConfig, path: Path) -> ModelConfig:
    """``config`` with the end-of-sequence ids of the folder's generation_config.json added, as
    transformers' generation stops at them too (an instruct checkpoint names its chat turn's end there)."""
    if not path.is_file():
        return config
    raw = _read_json(path, ModelConfigError)
    eos = raw.get("eos_token_id") if isinstance(raw, dict) else None
    extra = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in extra):
        raise ModelConfigError(f"{path}: 'eos_token_id' must be a token id or a list of them, got {eos!r}")
    ids = tuple(dict.fromkeys([*config.eos_token_ids, *extra]))
    return dataclasses.replace(config, eos_token_id=ids or None)


def safetensors_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    index = folder / _INDEX
    if index.is_file():
        weight_map = _read_json(index, WeightLoadError)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightLoadError(f"{index}: no 'weight_map' of tensor names to shard files")
        names = sorted({str(n) for n in weight_map.values()})
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise WeightLoadError(f"{index}: names shard(s) that are not in the folder: {', '.join(missing)}")
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"{folder}: no *.safetensors files ({_LAYOUT})")
    return files


@contextlib.contextmanager
def open_safetensors(file: Path) -> Iterator[Any]:
    """A safetensors file open for reading; a file that cannot be read, at its header or at a tensor, is a
    WeightLoadError naming it."""
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            yield f
    except (SafetensorError, OSError) as e:
        what = str(e).strip() or type(e).__name__
        raise WeightLoadError(
            f"{file}: not a readable safetensors file ({what[:1].lower()}{what[1:]}); is it truncated or corrupt?"
        ) from None


def iter_checkpoint(folder: str | Path) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(tensor name, file path, tensor) for every tensor of a safetensors checkpoint."""
    for file in safetensors_files(folder):
        with open_safetensors(file) as f:
            for key in f.keys():
                yield key, str(file), f.get_tensor(key)


def _checkpoint_names(param: str, shards: set[object], packed: dict[str, tuple[str, object]]) -> list[str]:
    """The checkpoint tensor names that fill ``shards`` of ``param`` (q/k/v, gate/up under their own names)."""
    if shards == {None}:
        return [param]
    return sorted(
        param.replace(f".{fused}.", f".{frag}.")
        for frag, (fused, sid) in packed.items()
        if sid in shards and f".{fused}." in f".{param}"
    )


def load_weights(model: nn.Module, tensors: Iterable[tuple[str, str, torch.Tensor]], source: str) -> None:
    """Route checkpoint tensors (Hugging Face names, full shapes) into the model's parameters.

    ``tensors`` yields (name, the file it came from, tensor); ``source`` names the checkpoint as a whole
    (its folder, or "preset NAME") in the message for tensors that never came."""
    params = dict(model.named_parameters(remove_duplicate=False))
    packed: dict[str, tuple[str, object]] = getattr(model, "packed_modules", {})
    tied = getattr(model.config, "tie_word_embeddings", False)
    arch = getattr(model.config, "architecture", "the model")
    # A fused parameter is complete once each of its shards has arrived.
    expected: dict[str, set[object]] = {}
    for name in params:
        if tied and name == "lm_head.weight":
            continue
        shards = {sid for frag, (fused, sid) in packed.items() if f".{fused}." in f".{name}"}
        expected[name] = shards or {None}
    seen: dict[str, set[object]] = {name: set() for name in expected}
    files: set[str] = set()

    for key, where, tensor in tensors:
        files.add(where)
        if key.endswith(_IGNORED_SUFFIXES) or (tied and key == "lm_head.weight"):
            continue
        target, shard_id = key, None
        for frag, (fused, sid) in packed.items():
            if f".{frag}." in key:
                target, shard_id = key.replace(f".{frag}.", f".{fused}."), sid
                break
        if target not in params:
            raise _mismatch(
                f"{where}: unexpected tensor {key!r}: {arch} has no such parameter", "unexpected", [key]
            )
        param = params[target]
        _check_dtype(tensor, param, where, key, target)
        try:
            loader = getattr(param, "weight_loader", _default_loader)
            loader(param, tensor.to(param.dtype), shard_id)
        except ValueError as e:
            raise _mismatch(f"{where}: tensor {key!r}: {e}", "shape", [key], tensor.shape) from None
        except (RuntimeError, IndexError):  # a rank's slice of a tensor too small to hold it
            raise _mismatch(
                f"{where}: tensor {key!r}: shape {tuple(tensor.shape)} does not fit the parameter "
                f"{target} ({tuple(param.shape)} on this rank)",
                "shape",
                [key],
                tensor.shape,
            ) from None
        seen[target].add(shard_id)

    missing = [
        ckpt
        for n, want in expected.items()
        if not want <= seen[n]
        for ckpt in _checkpoint_names(n, want - seen[n], packed)
    ]
    if missing:
        one = next(iter(files)) if len(files) == 1 else ""
        where = one if one.endswith(".safetensors") else source  # one file, or the folder of shards
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise _mismatch(
            f"{where}: the checkpoint lacks tensor(s) {', '.join(missing[:8])}{more}, which {arch} needs",
            "missing",
            missing,
        )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_dtype(tensor: torch.Tensor, param: nn.Parameter, where: str, key: str, target: str) -> None:
    """A float parameter takes any float tensor of _FLOAT_WEIGHTS (cast to its dtype); any other
    parameter its own dtype only."""
    allowed = _FLOAT_WEIGHTS if param.dtype.is_floating_point else (param.dtype,)
    if tensor.dtype in allowed:
        return
    kind = "a float parameter" if param.dtype.is_floating_point else "the parameter"
    raise WeightLoadError(
        f"{where}: tensor {key!r} is {_dtype_name(tensor.dtype)}, which cannot stand for {kind} "
        f"({target}, {_dtype_name(param.dtype)}): allowed: {', '.join(map(_dtype_name, allowed))}"
    )


def _default_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"shape {tuple(loaded.shape)} does not fit the parameter's {tuple(param.shape)}")
    param.data.copy_(loaded)
