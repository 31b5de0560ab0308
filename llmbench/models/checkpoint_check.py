"""A checkpoint checked against the model its config.json describes, from the safetensors headers alone.

``check_checkpoint`` reads every file's header (each tensor's name, shape and dtype; no tensor data) and
routes those entries through the loader's own ``load_weights`` into the model built on the ``meta``
device at full, unsharded shapes (whatever the tensor-parallel degree). So it refuses what loading would
refuse, with the same messages, before any cost: a tensor the model has no parameter for, a parameter no
tensor provides (tied embeddings and the packed q/k/v and gate/up parameters as the loader sees them), a
shape that does not fit, a dtype that cannot stand for a float weight. It adds what the loader alone
cannot know: a tensor name held by two files, and the config.json field a mismatch most likely comes
from (``head_dim`` when the checkpoint's shapes fit another head size, ``tie_word_embeddings`` when
``lm_head.weight`` is missing...). Reading headers only keeps it fast for a checkpoint of any size.

``check_tied_head`` needs the values: with ``tie_word_embeddings: true``, a checkpoint whose own
``lm_head.weight`` differs from its embedding is refused (the engine would run the embedding as the head);
it reads values in that case only. The engine calls both before it builds anything, and so do the checks
made before any cost (``run --dry-run``, ``ablate`` and ``profile`` before their first variant).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import NamedTuple

import torch

from llmbench.models.config import ModelConfig
from llmbench.models.loader import (
    TensorMismatch,
    WeightLoadError,
    load_weights,
    open_safetensors,
    safetensors_files,
)
from llmbench.models.random_weights import checkpoint_shapes

# The safetensors format's dtype names; float8 and integer types map too, for the loader to refuse by name.
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
}
# The config.json fields that set a parameter's dimensions, in the order a hint names them.
_DIMENSIONS = (
    "head_dim",
    "num_key_value_heads",
    "num_attention_heads",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
)
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_HEAD, _EMBED = "lm_head.weight", "model.embed_tokens.weight"
# Rows compared at a time (as float64): about 32 MiB, whatever the vocabulary
_COMPARED_ELEMENTS = 1 << 22


class Header(NamedTuple):
    name: str
    file: Path
    shape: tuple[int, ...]
    dtype: str  # as the safetensors header names it: F32, BF16, F8_E4M3...


def read_headers(folder: str | Path) -> list[Header]:
    """Every tensor of a checkpoint as its files' headers describe it; a name held by two files (another
    checkpoint left in the folder, whose tensors would silently replace the first's) is a WeightLoadError
    naming both."""
    headers: list[Header] = []
    held: dict[str, Path] = {}
    for file in safetensors_files(folder):
        with open_safetensors(file) as f:
            for name in f.keys():
                if name in held:
                    raise WeightLoadError(
                        f"{file}: tensor {name!r} is also in {held[name]}, and a tensor may come from one "
                        "file only (is one of them another checkpoint? move it out of the folder)"
                    )
                held[name] = file
                part = f.get_slice(name)
                headers.append(Header(name, file, tuple(part.get_shape()), part.get_dtype()))
    return headers


def check_checkpoint(folder: str | Path, config: ModelConfig) -> None:
    """The checkpoint's headers fit the model ``config`` describes, as loading it would check them (see the
    module docstring); a WeightLoadError (with a hint on config.json where one is likely) otherwise."""
    headers = read_headers(folder)
    entries = ((h.name, str(h.file), _meta_tensor(h)) for h in headers)
    try:
        load_weights(_meta_model(config), entries, str(folder))
    except TensorMismatch as error:
        hint = _hint(error, config, headers, _raw_config(Path(folder)))
        if hint:
            raise WeightLoadError(f"{error}; {hint}") from None
        raise


def check_tied_head(folder: str | Path, config: ModelConfig) -> None:
    """With tied embeddings, a checkpoint's own ``lm_head.weight`` must equal its embedding: one that differs
    is a WeightLoadError naming config.json's tie_word_embeddings (the two are read a block of rows at a
    time; nothing is read when the config is untied or the checkpoint has no lm_head.weight)."""
    if not config.tie_word_embeddings:
        return
    where = {h.name: h.file for h in read_headers(folder) if h.name in (_HEAD, _EMBED)}
    if len(where) < 2:
        return
    with open_safetensors(where[_HEAD]) as fh, open_safetensors(where[_EMBED]) as fe:
        head, embed = fh.get_slice(_HEAD), fe.get_slice(_EMBED)
        shape = tuple(head.get_shape())
        same = shape == tuple(embed.get_shape()) and len(shape) > 0
        rows = max(1, _COMPARED_ELEMENTS // max(1, math.prod(shape[1:])))
        for start in range(0, shape[0] if same else 0, rows):
            block = slice(start, start + rows)
            same = torch.equal(head[block].to(torch.float64), embed[block].to(torch.float64))
            if not same:
                break
    if not same:
        raise WeightLoadError(
            f"{where[_HEAD]}: holds its own {_HEAD}, which differs from {_EMBED}, but "
            f"{Path(folder) / 'config.json'} says tie_word_embeddings: true, which would run the embedding as "
            "the output head and leave the checkpoint's unused: set tie_word_embeddings to false to run the "
            "checkpoint's head (transformers keeps it in this case)"
        )


def _meta_tensor(h: Header) -> torch.Tensor:
    dtype = _DTYPES.get(h.dtype)
    if dtype is None:
        raise WeightLoadError(
            f"{h.file}: tensor {h.name!r} is stored as {h.dtype}, which cannot stand for a float parameter: "
            "allowed: float32, float16, bfloat16, float64"
        )
    return torch.empty(h.shape, dtype=dtype, device="meta")


def _meta_model(config: ModelConfig) -> torch.nn.Module:
    """The model at full shapes (one rank), on the meta device: parameters with shapes, no memory."""
    from llmbench.layers.attention.backends import AttentionBackend
    from llmbench.models.llama import BuildOptions
    from llmbench.models.registry import build_model

    with torch.device("meta"):
        return build_model(config, BuildOptions(AttentionBackend(), max_positions=1))


def _raw_config(folder: Path) -> dict:
    """config.json's own fields (a multimodal config's text part), to tell a field given from one absent."""
    try:
        raw = json.loads((folder / "config.json").read_bytes())
    except (OSError, ValueError):
        return {}
    if isinstance(raw, dict) and isinstance(raw.get("text_config"), dict) and "hidden_size" not in raw:
        raw = raw["text_config"]
    return raw if isinstance(raw, dict) else {}


def _says(field: str, config: ModelConfig, raw: dict) -> str:
    value = json.dumps(getattr(config, field))
    if raw.get(field) is None:
        return f"config.json has no {field} (taken as {value})"
    return f"config.json gives {field} {value}"


def _hint(error: TensorMismatch, config: ModelConfig, headers: list[Header], raw: dict) -> str:
    """The config.json field a mismatch most likely comes from, or ""."""
    hints = []
    if error.kind == "shape":
        hints.append(_shape_hint(error.names[0], error.shape, config, headers, raw))
    if error.kind == "missing" and _HEAD in error.names and not config.tie_word_embeddings:
        hints.append(
            f"{_says('tie_word_embeddings', config, raw)}: a checkpoint without {_HEAD} shares the input "
            f"embedding's ({_EMBED}), which needs tie_word_embeddings: true"
        )
    if error.kind in ("missing", "unexpected"):
        held = [int(m.group(1)) for h in headers if (m := _LAYER.match(h.name))]
        count = max(held) + 1 if held else 0
        if count != config.num_hidden_layers:
            hints.append(
                f"{_says('num_hidden_layers', config, raw)}, and the checkpoint holds {count} layers"
            )
    return "; ".join(h for h in hints if h)


def _fitting(config: ModelConfig, headers: list[Header]) -> int:
    """How many of the checkpoint's tensors have the shape ``config`` gives them."""
    shapes = checkpoint_shapes(config)
    return sum(shapes.get(h.name) == h.shape for h in headers)


def _shape_hint(
    name: str, got: tuple[int, ...], config: ModelConfig, headers: list[Header], raw: dict
) -> str:
    """The dimension field(s) whose other value would give ``name`` its checkpoint shape ``got`` and fit
    more of the checkpoint than config.json's values do (every dimension is proportional to each field that
    sets it, so one candidate value per differing dimension)."""
    want = checkpoint_shapes(config).get(name)
    if want is None or len(want) != len(got):
        return ""
    candidates = {
        (field, getattr(config, field) * g // w)
        for field in _DIMENSIONS
        for w, g in zip(want, got, strict=True)
        if w != g and g > 0 and getattr(config, field) * g % w == 0
    }
    scored = []
    for field, value in candidates:
        other = config.replace(**{field: value})
        if checkpoint_shapes(other).get(name) == got:
            scored.append((_fitting(other, headers), _DIMENSIONS.index(field), field, value))
    best = max((s[0] for s in scored), default=0)
    if best <= _fitting(config, headers):
        return ""
    top = sorted(s for s in scored if s[0] == best)
    says = "; ".join(_says(field, config, raw) for _, _, field, _ in top)
    return f"{says}, and the checkpoint's shapes fit {' or '.join(f'{f} {v}' for _, _, f, v in top)}"
