"""Presets: real architectures' shapes with random weights from a fixed seed (no download needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmbench.models.config import ModelConfig, RopeConfig

_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    config: ModelConfig = field(repr=False)

    @property
    def architecture(self) -> str:
        return self.config.architecture


def _qwen3(**kw: Any) -> ModelConfig:
    base = dict(
        architecture="Qwen3ForCausalLM",
        vocab_size=151936,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        rope=RopeConfig(theta=1_000_000.0),
        qk_norm=True,
        qkv_bias=False,
        mlp_bias=False,
        dtype="bfloat16",
        bos_token_id=None,
        eos_token_id=151645,
    )
    return ModelConfig(**{**base, **kw})


def _llama3(**kw: Any) -> ModelConfig:
    base = dict(
        architecture="LlamaForCausalLM",
        vocab_size=128256,
        num_key_value_heads=8,
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        qk_norm=False,
        qkv_bias=False,
        mlp_bias=False,
        dtype="bfloat16",
        bos_token_id=128000,
        eos_token_id=128001,
    )
    return ModelConfig(**{**base, **kw})


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "qwen3-tiny",
            "Qwen3 layout scaled down (4 layers, hidden 256): seconds on 2 CPU cores",
            _qwen3(
                vocab_size=4096,
                hidden_size=256,
                intermediate_size=768,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=64,
                max_position_embeddings=4096,
                eos_token_id=257,
            ),
        ),
        Preset(
            "qwen3-0.6b",
            "Qwen3-0.6B shapes: 28 layers, hidden 1024, 16/8 heads",
            _qwen3(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16),
        ),
        Preset(
            "qwen3-1.7b",
            "Qwen3-1.7B shapes: 28 layers, hidden 2048, 16/8 heads",
            _qwen3(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16),
        ),
        Preset(
            "qwen3-8b",
            "Qwen3-8B shapes: 36 layers, hidden 4096, 32/8 heads, untied head",
            _qwen3(
                hidden_size=4096,
                intermediate_size=12288,
                num_hidden_layers=36,
                num_attention_heads=32,
                tie_word_embeddings=False,
            ),
        ),
        Preset(
            "qwen2-0.5b",
            "Qwen2-0.5B shapes: 24 layers, hidden 896, 14/2 heads, q/k/v bias",
            ModelConfig(
                architecture="Qwen2ForCausalLM",
                vocab_size=151936,
                hidden_size=896,
                intermediate_size=4864,
                num_hidden_layers=24,
                num_attention_heads=14,
                num_key_value_heads=2,
                head_dim=64,
                rms_norm_eps=1e-6,
                max_position_embeddings=32768,
                tie_word_embeddings=True,
                rope=RopeConfig(theta=1_000_000.0),
                qk_norm=False,
                qkv_bias=True,
                mlp_bias=False,
                dtype="bfloat16",
                eos_token_id=151643,
            ),
        ),
        Preset(
            "llama3.2-1b",
            "Llama-3.2-1B shapes: 16 layers, hidden 2048, 32/8 heads, Llama 3 RoPE scaling",
            _llama3(
                hidden_size=2048,
                intermediate_size=8192,
                num_hidden_layers=16,
                num_attention_heads=32,
                head_dim=64,
                tie_word_embeddings=True,
                rope=RopeConfig(theta=500_000.0, kind="llama3", factor=32.0, **_LLAMA3_ROPE),
            ),
        ),
        Preset(
            "llama3.1-8b",
            "Llama-3.1-8B shapes: 32 layers, hidden 4096, 32/8 heads, Llama 3 RoPE scaling",
            _llama3(
                hidden_size=4096,
                intermediate_size=14336,
                num_hidden_layers=32,
                num_attention_heads=32,
                head_dim=128,
                tie_word_embeddings=False,
                rope=RopeConfig(theta=500_000.0, kind="llama3", factor=8.0, **_LLAMA3_ROPE),
            ),
        ),
    ]
}
