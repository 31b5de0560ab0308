"""A model folder that cannot be used is a user's error: one line naming the file (and the tensor) and
what is wrong, the same ``ModelError`` from the Python API and exit 2 from the CLI, never "unexpected"."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from llmbench import LLM, SamplingParams
from llmbench.cli.app import app
from llmbench.engine.config import ConfigError
from llmbench.models.errors import ModelError
from llmbench.models.loader import read_model_config

from tiny_models import make_tiny

SUPPORTED = "['LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM']"
LAYOUT = "a model folder holds config.json and *.safetensors, Hugging Face layout"


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("q3")
    make_tiny("qwen3", folder)
    return folder


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama-sharded")
    make_tiny("llama", folder, shard=True)
    return folder


def edit_config(folder: Path, edit: Callable[[dict], object]) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))


def edit_weights(file: Path, edit: Callable[[dict], object]) -> None:
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})


def retype(file: Path, name: str, dtype: torch.dtype) -> None:
    edit_weights(file, lambda t: t.update({name: t[name].to(dtype)}))


def truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def overwrite_header(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[:8] = b"\xff" * 8  # the header's length: now far past the end of the file
    file.write_bytes(bytes(data))


def shard_holding(folder: Path, tensor: str) -> Path:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return folder / index["weight_map"][tensor]


# (case, how the copied folder is broken, the message with {m} standing for the folder)
CASES: list[tuple[str, str, Callable[[Path], object], str]] = [
    (
        "empty folder",
        "qwen3",
        lambda m: [p.unlink() for p in m.iterdir()],
        f"{{m}}: no config.json ({LAYOUT})",
    ),
    (
        "config.json not JSON",
        "qwen3",
        lambda m: (m / "config.json").write_text("{not json"),
        "{m}/config.json: not valid JSON (Expecting property name enclosed in double quotes at line 1, column 2)",
    ),
    (
        "config.json not an object",
        "qwen3",
        lambda m: (m / "config.json").write_text("[1, 2]"),
        "{m}/config.json: expected a JSON object of model settings, got a list",
    ),
    (
        "config.json not text",
        "qwen3",
        lambda m: (m / "config.json").write_bytes(b'{"vocab_size": "\xff"}'),
        "{m}/config.json: not valid JSON (not UTF-8 text)",
    ),
    (
        "config lacks a field",
        "qwen3",
        lambda m: edit_config(m, lambda c: c.pop("hidden_size")),
        "{m}/config.json: lacks the field 'hidden_size', which Qwen3ForCausalLM needs",
    ),
    (
        "config field of the wrong type",
        "qwen3",
        lambda m: edit_config(m, lambda c: c.update(num_hidden_layers="two")),
        "{m}/config.json: field 'num_hidden_layers' must be a positive integer, got 'two'",
    ),
    (
        "config field out of range",
        "qwen3",
        lambda m: edit_config(m, lambda c: c.update(vocab_size=0)),
        "{m}/config.json: field 'vocab_size' must be a positive integer, got 0",
    ),
    (
        "heads not a multiple of KV heads",
        "qwen3",
        lambda m: edit_config(m, lambda c: c.update(num_key_value_heads=3)),
        "{m}/config.json: num_attention_heads (4) must be a multiple of num_key_value_heads (3)",
    ),
    (
        "unsupported architecture",
        "qwen3",
        lambda m: edit_config(m, lambda c: c.update(architectures=["MistralForCausalLM"])),
        f"{{m}}/config.json: Unsupported architecture: 'MistralForCausalLM'. Supported: {SUPPORTED}",
    ),
    (
        "no architecture named",
        "qwen3",
        lambda m: edit_config(m, lambda c: (c.pop("architectures"), c.update(model_type="mistral"))),
        "{m}/config.json: Unsupported architecture: none named (no 'architectures' field; model_type "
        f"'mistral'). Supported: {SUPPORTED}",
    ),
    (
        "unsupported rope type",
        "qwen3",
        lambda m: edit_config(m, lambda c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0})),
        "{m}/config.json: Unsupported rope type: 'yarn'. Supported: ['default', 'llama3']",
    ),
    (
        "quantized weights",  # a quantized release's tensors are no float weights: refused with the config
        "qwen3",
        lambda m: edit_config(m, lambda c: c.update(quantization_config={"quant_method": "fp8"})),
        "{m}/config.json: quantization_config (quant_method 'fp8') describes quantized weights: llmbench runs "
        "float checkpoints (float32, float16, bfloat16) only; use the model's unquantized release",
    ),
    (
        "unsupported activation",  # it would run SiLU and differ from the checkpoint's own model
        "qwen3",
        lambda m: edit_config(m, lambda c: c.update(hidden_act="gelu")),
        "{m}/config.json: Unsupported hidden_act: 'gelu' (the MLP's activation). Supported: ['silu']",
    ),
    (
        "a bias on every attention projection",
        "qwen3",
        lambda m: edit_config(m, lambda c: c.update(attention_bias=True)),
        "{m}/config.json: attention_bias=true (a bias on every attention projection, the output's too) is "
        "not supported; supported: a bias on q/k/v alone, as Qwen2 has",
    ),
    (
        "generation_config.json's eos_token_id of the wrong type",
        "qwen3",
        lambda m: (m / "generation_config.json").write_text('{"eos_token_id": "end"}'),
        "{m}/generation_config.json: 'eos_token_id' must be a token id or a list of them, got 'end'",
    ),
    (
        "no safetensors",
        "qwen3",
        lambda m: (m / "model.safetensors").unlink(),
        f"{{m}}: no *.safetensors files ({LAYOUT})",
    ),
    (
        "truncated safetensors",
        "qwen3",
        lambda m: truncate(m / "model.safetensors"),
        "{m}/model.safetensors: not a readable safetensors file (error while deserializing header: "
        "incomplete metadata, file not fully covered); is it truncated or corrupt?",
    ),
    (
        "corrupt safetensors header",
        "qwen3",
        lambda m: overwrite_header(m / "model.safetensors"),
        "{m}/model.safetensors: not a readable safetensors file (error while deserializing header: "
        "header too large); is it truncated or corrupt?",
    ),
    (
        "missing tensor of a fused parameter",
        "qwen3",
        lambda m: edit_weights(m / "model.safetensors", lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
        "{m}/model.safetensors: the checkpoint lacks tensor(s) model.layers.1.mlp.up_proj.weight, which "
        "Qwen3ForCausalLM needs",
    ),
    (
        "missing tensor",
        "qwen3",
        lambda m: edit_weights(m / "model.safetensors", lambda t: t.pop("model.norm.weight")),
        "{m}/model.safetensors: the checkpoint lacks tensor(s) model.norm.weight, which Qwen3ForCausalLM needs",
    ),
    (
        "wrong shape",
        "qwen3",
        lambda m: edit_weights(
            m / "model.safetensors", lambda t: t.update({"model.norm.weight": torch.ones(3)})
        ),
        "{m}/model.safetensors: tensor 'model.norm.weight': shape (3,) does not fit the parameter's (64,)",
    ),
    (
        "wrong shape of a fused shard",
        "qwen3",
        lambda m: edit_weights(
            m / "model.safetensors",
            lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(3, 64)}),
        ),
        "{m}/model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight': shape (3, 64) does not fit "
        "the parameter's (64, 64)",
    ),
    (
        "integer tensor for a float weight",  # cast, every value would truncate to an integer
        "qwen3",
        lambda m: retype(m / "model.safetensors", "model.layers.0.self_attn.q_proj.weight", torch.int32),
        "{m}/model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' is int32, which cannot stand "
        "for a float parameter (model.layers.0.self_attn.qkv_proj.weight, float32): allowed: float32, "
        "float16, bfloat16, float64",
    ),
    (
        "bool tensor for a float weight",
        "qwen3",
        lambda m: retype(m / "model.safetensors", "model.norm.weight", torch.bool),
        "{m}/model.safetensors: tensor 'model.norm.weight' is bool, which cannot stand for a float parameter "
        "(model.norm.weight, float32): allowed: float32, float16, bfloat16, float64",
    ),
    (
        "float8 tensor for a float weight",  # its scales would be lost
        "qwen3",
        lambda m: retype(m / "model.safetensors", "model.layers.1.mlp.down_proj.weight", torch.float8_e4m3fn),
        "{m}/model.safetensors: tensor 'model.layers.1.mlp.down_proj.weight' is float8_e4m3fn, which cannot "
        "stand for a float parameter (model.layers.1.mlp.down_proj.weight, float32): allowed: float32, "
        "float16, bfloat16, float64",
    ),
    (
        "unexpected tensor",
        "qwen3",
        lambda m: edit_weights(
            m / "model.safetensors", lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)})
        ),
        "{m}/model.safetensors: unexpected tensor 'model.layers.0.extra.weight': Qwen3ForCausalLM has no "
        "such parameter",
    ),
    (
        "index names a missing shard",
        "sharded",
        lambda m: shard_holding(m, "model.norm.weight").unlink(),
        "{m}/model.safetensors.index.json: names shard(s) that are not in the folder: {shard}",
    ),
    (
        "index not JSON",
        "sharded",
        lambda m: (m / "model.safetensors.index.json").write_text("weight_map:"),
        "{m}/model.safetensors.index.json: not valid JSON (Expecting value at line 1, column 1)",
    ),
    (
        "index without a weight map",
        "sharded",
        lambda m: (m / "model.safetensors.index.json").write_text('{"metadata": {}}'),
        "{m}/model.safetensors.index.json: no 'weight_map' of tensor names to shard files",
    ),
    (
        "sharded checkpoint missing a tensor",
        "sharded",
        lambda m: edit_weights(shard_holding(m, "model.norm.weight"), lambda t: t.pop("model.norm.weight")),
        "{m}: the checkpoint lacks tensor(s) model.norm.weight, which LlamaForCausalLM needs",
    ),
    (
        "truncated shard",
        "sharded",
        lambda m: truncate(shard_holding(m, "model.norm.weight")),
        "{shard_path}: not a readable safetensors file (error while deserializing header: incomplete "
        "metadata, file not fully covered); is it truncated or corrupt?",
    ),
]


@pytest.fixture(params=CASES, ids=[c[0] for c in CASES])
def broken(request, tmp_path) -> tuple[Path, str]:
    """A copy of a tiny model folder, broken as the case says, and the exact message expected."""
    _, source, breaks, message = request.param
    folder = tmp_path / "model"
    shutil.copytree(request.getfixturevalue(source), folder)
    shard = shard_holding(folder, "model.norm.weight") if source == "sharded" else folder
    breaks(folder)
    return folder, message.format(m=folder, shard=shard.name, shard_path=shard)


def test_the_api_raises_a_model_error_naming_the_file(broken):
    folder, message = broken
    with pytest.raises(ModelError) as info:
        LLM(str(folder), device="cpu", num_kv_blocks=16)
    assert str(info.value) == message


def write_scenario(folder: Path, tmp_path: Path) -> Path:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "model": str(folder),
                "engine": {"device": "cpu", "num_kv_blocks": 16},
                "workload": {"num_requests": 1, "input_len": 4, "output_len": 2},
                "telemetry": {"enabled": False},
            }
        )
    )
    return scenario


def test_the_cli_prints_one_line_and_exits_2(broken, tmp_path):
    folder, message = broken
    scenario = write_scenario(folder, tmp_path)
    res = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "r"), "-q"])
    assert res.exit_code == 2, res.output
    assert res.stderr == f"error: {message}\n"
    assert not list((tmp_path / "r").rglob("summary.json"))


def test_a_dry_run_refuses_it_with_the_same_message_before_any_cost(broken, tmp_path):
    """Every broken folder above, the checkpoint's tensors included (names, shapes, dtypes: read from the
    safetensors headers), is refused by `run --dry-run`, which builds no engine and reads no weight."""
    folder, message = broken
    res = CliRunner().invoke(app, ["run", str(write_scenario(folder, tmp_path)), "--dry-run"])
    assert res.exit_code == 2, res.output
    assert res.stderr == f"error: {message}\n"


@pytest.mark.slow
def test_a_tensor_parallel_engine_raises_the_same_error(qwen3, tmp_path):
    """With tp=2 the ranks are stopped and the checkpoint's error comes through unchanged."""
    folder = tmp_path / "model"
    shutil.copytree(qwen3, folder)
    edit_weights(folder / "model.safetensors", lambda t: t.update({"model.norm.weight": torch.ones(3)}))
    with pytest.raises(ModelError) as info:
        LLM(str(folder), device="cpu", tp=2, num_kv_blocks=16)
    assert str(info.value) == (
        f"{folder}/model.safetensors: tensor 'model.norm.weight': shape (3,) does not fit the parameter's (64,)"
    )


def test_generation_stops_at_the_end_ids_generation_config_adds_as_transformers_does(qwen3, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "m"
    shutil.copytree(qwen3, folder)
    prompt = [5, 6, 7, 8]
    llm = LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=16)
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12))[0].token_ids
    llm.shutdown()
    stop = free[3]  # an id the greedy continuation reaches: named an end id only in generation_config.json
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop]}))
    assert stop in read_model_config(folder).eos_token_ids
    llm = LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=16)
    ours = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12))[0].token_ids
    llm.shutdown()
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt) :].tolist()
    assert ours == out == free[: free.index(stop) + 1]


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_a_config_without_architectures_takes_the_class_its_model_type_names(arch, tmp_path):
    # as transformers does: config.json's model_type alone picks the class
    make_tiny(arch, tmp_path)
    named = read_model_config(tmp_path)
    edit_config(tmp_path, lambda c: c.pop("architectures"))
    assert read_model_config(tmp_path) == named


def test_a_tokenizer_transformers_cannot_load_refuses_text_and_runs_token_ids(qwen3, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(qwen3, folder)
    (folder / "tokenizer.json").write_text("{oops")
    llm = LLM(str(folder), device="cpu", num_kv_blocks=16)
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert len(out[0].token_ids) == 3
    with pytest.raises(
        ModelError, match=r"^.*/model: its tokenizer \(tokenizer\.json\) cannot be loaded by transformers: "
    ):
        llm.generate(["hello"], SamplingParams(max_tokens=2))


def test_a_vocabulary_too_small_for_bytes_takes_token_ids_and_refuses_text(tmp_path):
    # no tokenizer files and under 258 ids: the byte-level tokenizer cannot stand in, ids still run
    make_tiny("qwen3", tmp_path, vocab_size=100)
    llm = LLM(str(tmp_path), device="cpu", num_kv_blocks=16)
    from llmbench import SamplingParams

    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert len(out[0].token_ids) == 3 and all(0 <= t < 100 for t in out[0].token_ids)
    with pytest.raises(ModelError, match="a text prompt needs a tokenizer.*vocabulary of 100 ids"):
        llm.generate(["hello"], SamplingParams(max_tokens=2))


def test_a_tokenizer_with_more_ids_than_the_model_refuses_text(tmp_path):
    # its ids past the embedding would fail only when a prompt reaches them: refused for any text prompt
    from tokenizers import Tokenizer, models, pre_tokenizers

    make_tiny("qwen3", tmp_path, vocab_size=300)
    words = {f"w{i}": i for i in range(1000)} | {"[UNK]": 1000}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    llm = LLM(str(tmp_path), device="cpu", num_kv_blocks=16)
    with pytest.raises(
        ModelError, match=r"its tokenizer has 10\d\d ids but the model's vocabulary .* has 300"
    ):
        llm.generate(["w1 w2"], SamplingParams(max_tokens=2))


def hub_cache(root: Path, repo_id: str, model: Path) -> Path:
    """``model`` laid out as the Hugging Face hub's cache holds a downloaded repository (refs/main names the
    snapshot); returns the snapshot's folder."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    snapshot = repo / "snapshots" / "0123abcd"
    shutil.copytree(model, snapshot)
    return snapshot


def test_a_hub_id_in_the_local_cache_runs_that_snapshot(qwen3, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = hub_cache(tmp_path / "hub", "someone/tiny-qwen3", qwen3)
    prompts = [[5, 6, 7, 8], [9, 10]]
    with LLM(str(qwen3), device="cpu", num_kv_blocks=16) as llm:
        direct = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=6))]
    with LLM("someone/tiny-qwen3", device="cpu", num_kv_blocks=16) as llm:
        assert (llm.engine.model_info.name, llm.engine.model_info.folder) == (
            "someone/tiny-qwen3",
            str(snapshot),
        )
        assert [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=6))] == direct


def test_a_hub_id_not_in_the_cache_says_how_to_fetch_it(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "hub" / "models--someone--other" / "refs").mkdir(parents=True)  # begun, never downloaded
    scenario = tmp_path / "s.yaml"
    workload = {"num_requests": 1, "input_len": 4, "output_len": 2}
    scenario.write_text(
        yaml.safe_dump(
            {"name": "s", "model": "Qwen/Qwen3-0.6B", "engine": {"device": "cpu"}, "workload": workload}
        )
    )
    res = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "r"), "-q"])
    assert res.exit_code == 2, res.output
    assert res.stderr == (
        f"error: model 'Qwen/Qwen3-0.6B' is not a preset, not a folder, and not in the local "
        f"Hugging Face cache ({tmp_path / 'hub'}); llmbench does not download: fetch it first with "
        "`hf download Qwen/Qwen3-0.6B` (or `huggingface-cli download Qwen/Qwen3-0.6B`), or give its folder, "
        "or use the preset 'qwen3-0.6b' (its shapes, random weights)\n"
    )
    with pytest.raises(
        ConfigError, match="^model 'someone/other' is not a preset, .* `hf download someone/other`"
    ):
        LLM("someone/other", device="cpu")


def test_models_lists_the_caches_checkpoints_and_why_one_cannot_run(qwen3, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    hub_cache(tmp_path / "hub", "someone/tiny-qwen3", qwen3)
    edit_config(hub_cache(tmp_path / "hub", "someone/gpt", qwen3), lambda c: c.update(architectures=["GPT2"]))
    (hub_cache(tmp_path / "hub", "someone/config-only", qwen3) / "model.safetensors").unlink()
    (tmp_path / "hub" / "models--someone--begun" / "refs").mkdir(parents=True)
    res = CliRunner().invoke(app, ["models"], terminal_width=400)
    assert res.exit_code == 0, res.output
    cells = [[c.strip() for c in line.split("│")] for line in res.stdout.splitlines() if "someone/" in line]
    rows = {c[0]: c[1:] for c in cells}
    assert rows.keys() == {"someone/tiny-qwen3", "someone/gpt", "someone/config-only"}
    params = read_model_config(qwen3).num_params() / 1e6
    assert rows["someone/tiny-qwen3"] == ["Qwen3ForCausalLM", f"{params:,.1f} M", ""]
    assert rows["someone/gpt"][2] == f"cannot run: Unsupported architecture: 'GPT2'. Supported: {SUPPORTED}"
    assert rows["someone/config-only"][2].startswith("cannot run: no *.safetensors in its snapshot")


def test_a_hub_id_typo_names_the_cached_id_it_may_mean(qwen3, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    hub_cache(tmp_path / "hub", "acme/tiny", qwen3)
    with pytest.raises(
        ModelError, match=r"^model 'acme/tinny' \(did you mean 'acme/tiny'\?\) is not a preset, "
    ):
        LLM("acme/tinny", device="cpu")


def test_a_mistyped_folder_path_is_no_such_folder_and_names_the_sibling_it_may_mean(
    qwen3, tmp_path, monkeypatch
):
    (tmp_path / "models").mkdir()
    shutil.copytree(qwen3, tmp_path / "models" / "good")
    tail = (
        "; a model is a preset, a folder holding config.json and *.safetensors, or a Hugging Face repository "
        "id (org/name) in the local cache"
    )
    typo = tmp_path / "models" / "goood"
    with pytest.raises(ModelError) as info:
        LLM(str(typo), device="cpu")
    assert str(info.value) == (
        f"model {str(typo)!r}: no such folder (did you mean {str(tmp_path / 'models' / 'good')!r}?){tail}"
    )
    monkeypatch.chdir(tmp_path)  # written relative, it reads as a hub id (org/name): still a folder typo
    with pytest.raises(ModelError) as info:
        LLM("models/goood", device="cpu")
    assert str(info.value) == f"model 'models/goood': no such folder (did you mean 'models/good'?){tail}"
    with pytest.raises(ModelError) as info:
        LLM(str(tmp_path / "modls" / "good"), device="cpu")
    assert str(info.value) == (
        f"model {str(tmp_path / 'modls' / 'good')!r}: no such folder, nor its parent "
        f"{str(tmp_path / 'modls')!r}{tail}"
    )


def test_an_unknown_model_is_a_model_error_not_an_engine_options_error(tmp_path):
    """``model:`` is a key of its own in a scenario: its error is not put under "engine options:"."""
    scenario = tmp_path / "s.yaml"
    workload = {"num_requests": 1, "input_len": 4, "output_len": 2}
    scenario.write_text(yaml.safe_dump({"name": "s", "model": str(tmp_path / "nope"), "workload": workload}))
    res = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "r"), "-q"])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"error: model {str(tmp_path / 'nope')!r}: no such folder")
    with pytest.raises(ConfigError):  # still what callers checking the engine's options catch
        LLM(str(tmp_path / "nope"), device="cpu")


def test_a_llama3_rope_without_its_original_length_takes_the_models_as_transformers_does():
    from llmbench.models.config import model_config_from_hf
    from llmbench.models.loader import ARCHITECTURES

    cfg = {
        "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 512,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
    }  # fmt: skip
    assert model_config_from_hf(cfg, ARCHITECTURES).rope.original_max_position_embeddings == 512


def test_a_preset_name_that_is_also_a_folder_here_is_refused_as_ambiguous(tmp_path, monkeypatch):
    from llmbench.models.registry import UnknownModelError, resolve_model

    monkeypatch.chdir(tmp_path)
    assert resolve_model("qwen3-tiny")[1] is None  # the preset
    (tmp_path / "qwen3-tiny").mkdir()
    (tmp_path / "qwen3-tiny" / "config.json").write_text("{}")
    with pytest.raises(UnknownModelError, match=r"names both a preset .* write ./qwen3-tiny for the folder"):
        resolve_model("qwen3-tiny")
