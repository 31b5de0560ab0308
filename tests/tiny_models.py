"""Tiny random Hugging Face models, saved as safetensors folders, for parity tests.

Weights are re-drawn with the presets' scales (``init_random_weights``) so that greedy tokens vary with
context; with transformers' own init every model repeats one token and parity would prove little.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from llmbench.models.random_weights import init_random_weights

COMMON = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)


def hf_config(arch: str, tie: bool = False, **overrides) -> transformers.PretrainedConfig:
    common = {**COMMON, **overrides}
    if arch == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=32, tie_word_embeddings=tie, rope_theta=10000.0)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, tie_word_embeddings=tie, rope_theta=10000.0)
    if arch == "llama":
        scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        return transformers.LlamaConfig(
            **common, tie_word_embeddings=tie, rope_theta=500000.0, rope_scaling=scaling
        )
    raise ValueError(arch)


def make_tiny(arch: str, folder: Path, *, tie: bool = False, seed: int = 0, shard: bool = False, **overrides):
    """Build, re-initialise and save a tiny model; return the transformers model (float32, eval)."""
    torch.manual_seed(seed)
    cfg = hf_config(arch, tie, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    init_random_weights(model, seed)
    if tie:
        model.tie_weights()
    model.save_pretrained(folder, max_shard_size="40KB" if shard else "1GB")
    return model


@torch.no_grad()
def hf_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    """A plain argmax loop: the whole sequence re-run each step, no cache involved."""
    ids = list(prompt)
    for _ in range(max_tokens):
        logits = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


# A scenario small enough to profile on the CPU in seconds (tests/test_profile_*.py)
PROFILED = {
    "name": "prof",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu", "max_model_len": 512},
    "workload": {"num_requests": 4, "input_len": {"dist": "uniform", "min": 8, "max": 24}, "output_len": 16},
    "arrival": {"kind": "offline"},
    "warmup": 1,
    "repeats": 1,
    "cpu_threads": 1,
    "telemetry": {"enabled": False},
}


def break_tokenizer(folder: Path) -> None:
    """Give ``folder`` a tokenizer transformers cannot build: tokenizer_config.json alone, no tokenizer.json."""
    (Path(folder) / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
