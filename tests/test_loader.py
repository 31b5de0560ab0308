"""The Hugging Face folder loader: both config.json generations, sharding, and errors that name the tensor."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from llmbench import LLM, SamplingParams
from llmbench.models.config import ModelConfigError
from llmbench.models.loader import WeightLoadError, read_model_config

from tiny_models import make_tiny


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("q3")
    make_tiny("qwen3", folder)
    return folder


def _copy(src, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(src, dst)
    return dst


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


def _edit_weights(folder, edit):
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_tensor_is_named(qwen3_folder, tmp_path):
    folder = _copy(qwen3_folder, tmp_path)
    _edit_weights(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(WeightLoadError, match=r"model\.layers\.1\.mlp\.gate_up_proj\.weight"):
        LLM(str(folder), num_kv_blocks=64)


def test_unexpected_tensor_is_named(qwen3_folder, tmp_path):
    folder = _copy(qwen3_folder, tmp_path)
    _edit_weights(folder, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(WeightLoadError, match=r"unexpected tensor 'model\.layers\.0\.extra\.weight'"):
        LLM(str(folder), num_kv_blocks=64)


def test_wrong_shape_is_named(qwen3_folder, tmp_path):
    folder = _copy(qwen3_folder, tmp_path)
    _edit_weights(folder, lambda t: t.update({"model.norm.weight": torch.ones(3)}))
    with pytest.raises(WeightLoadError, match=r"model\.norm\.weight.*\(3,\)"):
        LLM(str(folder), num_kv_blocks=64)


def test_unsupported_architecture_lists_the_supported(qwen3_folder, tmp_path):
    folder = _copy(qwen3_folder, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["MistralForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelConfigError,
        match=r"MistralForCausalLM.*Supported: \['LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM'\]",
    ):
        LLM(str(folder), num_kv_blocks=64)


def test_folder_without_weights_says_so(qwen3_folder, tmp_path):
    folder = _copy(qwen3_folder, tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(WeightLoadError, match="no \\*.safetensors"):
        LLM(str(folder), num_kv_blocks=64)


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
