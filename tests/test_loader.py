"""The Hugging Face folder loader: both config.json generations and sharding (its errors: test_model_errors.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from llmbench import LLM, SamplingParams
from llmbench.models.loader import read_model_config

from tiny_models import make_tiny


def _to_transformers4_style(folder):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    if rope.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = rope
    cfg["torch_dtype"] = cfg.pop("dtype")
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_transformers4_and_5_configs_read_the_same(arch, tmp_path):
    make_tiny(arch, tmp_path / "v5")
    shutil.copytree(tmp_path / "v5", tmp_path / "v4")
    _to_transformers4_style(tmp_path / "v4")
    assert "rope_theta" in json.loads((tmp_path / "v4" / "config.json").read_text())
    assert read_model_config(tmp_path / "v4") == read_model_config(tmp_path / "v5")


def test_sharded_and_single_file_give_the_same_tokens(tmp_path):
    make_tiny("llama", tmp_path / "one")
    make_tiny("llama", tmp_path / "many", shard=True)
    assert (tmp_path / "many" / "model.safetensors.index.json").is_file()
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    a = LLM(str(tmp_path / "one"), num_kv_blocks=64).generate([[1, 2, 3]], params)[0].token_ids
    b = LLM(str(tmp_path / "many"), num_kv_blocks=64).generate([[1, 2, 3]], params)[0].token_ids
    assert a == b


def test_preset_weights_equal_a_transformers_model_drawn_the_same_way():
    """A preset is a checkpoint drawn by name: transformers with the same draws gives the same tokens."""
    import transformers

    from llmbench.bench.backends.hf_model import hf_config
    from llmbench.models.presets import PRESETS
    from llmbench.models.random_weights import init_random_weights

    from tiny_models import hf_greedy

    hf_cfg = hf_config(PRESETS["qwen3-tiny"].config)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32).eval()
    init_random_weights(hf, seed=0)
    llm = LLM("qwen3-tiny", device="cpu", dtype="float32", num_kv_blocks=64, seed=0)
    got = llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0]
    assert got.token_ids == hf_greedy(hf, [1, 2, 3, 4], 10)


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16, torch.float64])
def test_a_checkpoint_of_another_float_dtype_is_cast_to_the_parameters(stored, tmp_path):
    """Only non-float tensors are refused (test_model_errors.py): a float one of any width is cast, and runs
    as the same values stored in float32 do."""
    from safetensors.torch import load_file, save_file

    make_tiny("qwen3", tmp_path / "f32")
    shutil.copytree(tmp_path / "f32", tmp_path / "other")
    tensors = load_file(str(tmp_path / "f32" / "model.safetensors"))
    rounded = {name: t.to(stored) for name, t in tensors.items()}
    save_file(rounded, str(tmp_path / "other" / "model.safetensors"), metadata={"format": "pt"})
    as_f32 = {name: t.float() for name, t in rounded.items()}
    save_file(as_f32, str(tmp_path / "f32" / "model.safetensors"), metadata={"format": "pt"})
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    runs = [
        LLM(str(tmp_path / name), device="cpu", dtype="float32", num_kv_blocks=64).generate(
            [[1, 2, 3]], params
        )
        for name in ("f32", "other")
    ]
    assert runs[0][0].token_ids == runs[1][0].token_ids
