"""The checkpoint checked against its config.json before any cost (models/checkpoint_check.py): from the
safetensors headers alone, with a hint naming the likely config.json field; a tensor two files hold; a
tied config over a checkpoint whose own head differs; a tokenizer that cannot load, which only text needs.
(The messages for one broken tensor or file, at load and in --dry-run: test_model_errors.py.)"""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from llmbench import LLM, SamplingParams
from llmbench.cli.app import app
from llmbench.models.errors import ModelError
from llmbench.models.registry import check_model_files

from tiny_models import break_tokenizer, make_tiny

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("q3")
    make_tiny("qwen3", folder)
    return folder


def copy_of(source: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    return folder


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key)
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))


def edit_weights(folder: Path, **tensors) -> None:
    file = folder / "model.safetensors"
    held = load_file(str(file))
    for name, value in tensors.items():
        name = name.replace("__", ".")
        if value is None:
            held.pop(name)
        else:
            held[name] = value
    save_file(held, str(file), metadata={"format": "pt"})


def scenario(tmp_path: Path, folder: Path, **overrides) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "model": str(folder),
                "engine": {"device": "cpu", "num_kv_blocks": 32},
                "workload": {"num_requests": 2, "input_len": 4, "output_len": 2},
                "arrival": {"kind": "offline"},
                "warmup": 0,
                "repeats": 1,
                "telemetry": {"enabled": False},
                **overrides,
            }
        )
    )
    return path


def dry_run(path: Path, *args: str):
    return CliRunner().invoke(app, ["run", str(path), "--dry-run", *args])


def refusal(folder: Path) -> str:
    with pytest.raises(ModelError) as info:
        check_model_files(str(folder))
    return str(info.value)


# (case, how a copy of the Qwen3 folder is broken, the hint the message ends with)
HINTS = [
    (
        "config without head_dim",  # the tiny Qwen3 has head_dim 32, not hidden_size / heads = 16
        lambda m: edit_config(m, head_dim=None),
        "; config.json has no head_dim (taken as 16), and the checkpoint's shapes fit head_dim 32",
    ),
    (
        "config without num_key_value_heads",
        lambda m: edit_config(m, num_key_value_heads=None),
        "; config.json has no num_key_value_heads (taken as 4), and the checkpoint's shapes fit "
        "num_key_value_heads 2",
    ),
    (
        "config with the wrong head_dim",
        lambda m: edit_config(m, head_dim=16),
        "; config.json gives head_dim 16, and the checkpoint's shapes fit head_dim 32",
    ),
    (
        "config with the wrong vocab_size",
        lambda m: edit_config(m, vocab_size=400),
        "; config.json gives vocab_size 400, and the checkpoint's shapes fit vocab_size 384",
    ),
    (
        "tied checkpoint, config not tied",
        lambda m: edit_weights(m, lm_head__weight=None),
        "; config.json gives tie_word_embeddings false: a checkpoint without lm_head.weight shares the input "
        "embedding's (model.embed_tokens.weight), which needs tie_word_embeddings: true",
    ),
    (
        "config with more layers than the checkpoint",
        lambda m: edit_config(m, num_hidden_layers=3),
        "; config.json gives num_hidden_layers 3, and the checkpoint holds 2 layers",
    ),
]


@pytest.mark.parametrize("breaks,hint", [c[1:] for c in HINTS], ids=[c[0] for c in HINTS])
def test_a_mismatch_names_the_likely_config_field_in_dry_run_and_at_load(breaks, hint, qwen3, tmp_path):
    folder = copy_of(qwen3, tmp_path)
    breaks(folder)
    message = refusal(folder)
    assert message.endswith(hint), message
    res = dry_run(scenario(tmp_path, folder))
    assert (res.exit_code, res.stderr) == (2, f"error: {message}\n"), res.output
    with pytest.raises(ModelError) as info:  # the engine checks the headers before it builds anything
        LLM(str(folder), device="cpu", num_kv_blocks=16)
    assert str(info.value) == message


def test_a_mismatch_no_single_field_explains_has_no_hint(qwen3, tmp_path):
    folder = copy_of(qwen3, tmp_path)
    edit_weights(folder, model__norm__weight=torch.ones(3))
    assert refusal(folder) == (
        f"{folder}/model.safetensors: tensor 'model.norm.weight': shape (3,) does not fit the parameter's (64,)"
    )


def test_a_sharded_checkpoint_without_index_missing_a_file_is_refused_from_the_headers(tmp_path):
    folder = tmp_path / "model"
    make_tiny("llama", folder, shard=True)
    (folder / "model.safetensors.index.json").unlink()
    shards = sorted(folder.glob("*.safetensors"))
    gone = load_file(str(shards[1]))
    shards[1].unlink()
    message = refusal(folder)
    assert message.startswith(f"{folder}: the checkpoint lacks tensor(s) "), message
    assert all(name in message for name in sorted(gone)[:3]), (message, sorted(gone))


def test_tensor_parallel_checks_the_full_shapes(qwen3, tmp_path):
    """A folder that fits its config passes at tp=2 too; one that does not is refused with the message tp=1
    gives (the headers are checked against the unsharded model)."""
    good = scenario(tmp_path, qwen3, engine={"device": "cpu", "num_kv_blocks": 32, "tp": 2})
    res = dry_run(good)
    assert res.exit_code == 0, res.output
    folder = copy_of(qwen3, tmp_path)
    edit_config(folder, head_dim=None)
    res = dry_run(good, "--set", f"model={folder}")
    assert (res.exit_code, res.stderr) == (2, f"error: {refusal(folder)}\n"), res.output


def test_a_tensor_held_by_two_files_is_refused_naming_both(qwen3, tmp_path):
    """Without an index every *.safetensors file is read: a second checkpoint left in the folder would
    silently replace the first one's tensors."""
    folder = copy_of(qwen3, tmp_path)
    make_tiny("qwen3", tmp_path / "other", seed=1)
    shutil.copy(tmp_path / "other" / "model.safetensors", folder / "model_v2.safetensors")
    message = (
        f"{folder}/model_v2.safetensors: tensor 'lm_head.weight' is also in {folder}/model.safetensors, and a "
        "tensor may come from one file only (is one of them another checkpoint? move it out of the folder)"
    )
    assert refusal(folder) == message
    assert dry_run(scenario(tmp_path, folder)).stderr == f"error: {message}\n"
    with pytest.raises(ModelError, match="is also in"):
        LLM(str(folder), device="cpu", num_kv_blocks=16)


def test_a_tied_config_over_a_checkpoint_with_its_own_different_head_is_refused(qwen3, tmp_path):
    folder = copy_of(qwen3, tmp_path)  # untied: its lm_head.weight differs from the embedding
    edit_config(folder, tie_word_embeddings=True)
    with pytest.raises(ModelError) as info:
        LLM(str(folder), device="cpu", num_kv_blocks=16)
    assert str(info.value) == (
        f"{folder}/model.safetensors: holds its own lm_head.weight, which differs from "
        f"model.embed_tokens.weight, but {folder}/config.json says tie_word_embeddings: true, which would run "
        "the embedding as the output head and leave the checkpoint's unused: set tie_word_embeddings to false "
        "to run the checkpoint's head (transformers keeps it in this case)"
    )
    # and before any cost: --dry-run (and so ablate's and profile's checks) reads the two and says so
    res = dry_run(scenario(tmp_path, folder))
    assert res.exit_code == 2, res.output
    assert "says tie_word_embeddings: true" in " ".join(res.stderr.split())


def test_a_tied_checkpoint_that_also_stores_its_head_as_the_embedding_runs(tmp_path):
    make_tiny("qwen3", tmp_path / "tied", tie=True)
    folder = copy_of(tmp_path / "tied", tmp_path)
    held = load_file(str(folder / "model.safetensors"))
    assert "lm_head.weight" not in held
    edit_weights(folder, lm_head__weight=held["model.embed_tokens.weight"].clone())
    runs = [
        LLM(str(f), device="cpu", num_kv_blocks=16).generate([[1, 2, 3]], GREEDY)[0].token_ids
        for f in (tmp_path / "tied", folder)
    ]
    assert runs[0] == runs[1]


def sparse_checkpoint(folder: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """A bfloat16 checkpoint with real headers over holes: gigabytes long, nothing written but headers."""
    offset, header = 0, {}
    for name, shape in shapes.items():
        size = math.prod(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def test_an_8b_checkpoint_is_checked_from_its_headers_alone(tmp_path):
    """Llama 3.1 8B's shapes (16 GB of bfloat16) as holes in a file: the check reads no tensor, so it passes
    without reading or allocating the weights; a wrong shape is still found."""
    from llmbench.bench.backends.hf_model import hf_config
    from llmbench.models.presets import PRESETS
    from llmbench.models.random_weights import checkpoint_shapes

    cfg = PRESETS["llama3.1-8b"].config
    hf_config(cfg).save_pretrained(tmp_path)
    shapes = checkpoint_shapes(cfg)
    sparse_checkpoint(tmp_path, shapes)
    check_model_files(str(tmp_path))
    sparse_checkpoint(tmp_path, {**shapes, "model.layers.31.mlp.down_proj.weight": (4096, 14000)})
    assert "shape (4096, 14000) does not fit the parameter's (4096, 14336)" in refusal(tmp_path)


@pytest.mark.parametrize("command", ["ablate", "profile"])
def test_ablate_and_profile_refuse_a_header_mismatch_before_any_variant(command, qwen3, tmp_path):
    folder = copy_of(qwen3, tmp_path)
    edit_weights(
        folder, model__layers__0__mlp__down_proj__weight=torch.zeros(64, 128, dtype=torch.float8_e4m3fn)
    )
    res = CliRunner().invoke(
        app,
        [command, str(scenario(tmp_path, folder)), "--toggle", "prefix_cache", "--out", str(tmp_path / "r")],
    )
    assert res.exit_code == 2, res.output
    assert "tensor 'model.layers.0.mlp.down_proj.weight' is float8_e4m3fn" in " ".join(res.stderr.split())
    assert not (tmp_path / "r").exists()


def test_token_id_runs_need_no_tokenizer_and_a_text_dry_run_sees_one_that_cannot_load(qwen3, tmp_path):
    folder = copy_of(qwen3, tmp_path)
    break_tokenizer(folder)
    res = CliRunner().invoke(
        app, ["run", str(scenario(tmp_path, folder)), "--out", str(tmp_path / "r"), "-q"]
    )
    assert res.exit_code == 0, res.output
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\n")
    text = scenario(tmp_path, folder, workload={"source": "file", "path": str(prompts), "output_len": 2})
    res = dry_run(text)
    assert res.exit_code == 2, res.output
    said = " ".join(res.stderr.split())
    assert said.startswith(
        f"error: {prompts}:1: a text prompt needs the model's tokenizer: {folder}: its tokenizer "
        "(tokenizer_config.json) cannot be loaded by transformers: "
    ), said
