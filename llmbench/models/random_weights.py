"""Random weights for presets, drawn as a checkpoint would hold them.

Each tensor is drawn under Hugging Face's name and full shape from a generator seeded by (seed, name), so
a preset's weights do not depend on tensor-parallel sharding (every rank draws the same full tensor and
keeps its slice through the loader) and equal those of a transformers model initialised with
``init_random_weights`` from the same config.

Scales: embeddings (and the head) std 0.1, linear weights std 2/sqrt(fan_in), biases std 0.02, norms 1.
Each layer then moves the residual stream well past the input token's embedding. With training-time
init (std 0.02 everywhere), or embeddings as large as the layers' outputs, the last hidden state stays
closest to the input token's own embedding and greedy decoding repeats one token; these scales were
picked by counting distinct greedy tokens on qwen3-tiny (tests/test_api.py keeps that property).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import torch
from torch import nn

from llmbench.models.config import ModelConfig


def checkpoint_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        for name, rows in (("q", cfg.q_size), ("k", cfg.kv_size), ("v", cfg.kv_size)):
            shapes[p + f"self_attn.{name}_proj.weight"] = (rows, h)
            if cfg.qkv_bias:
                shapes[p + f"self_attn.{name}_proj.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (h, cfg.q_size)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
        if cfg.mlp_bias:
            for name, rows in (("gate", i), ("up", i), ("down", h)):
                shapes[p + f"mlp.{name}_proj.bias"] = (rows,)
    shapes["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def draw(name: str, shape: tuple[int, ...], seed: int, device: torch.device | str) -> torch.Tensor:
    """One float32 tensor, a function of (seed, name, shape) only."""
    # manual_seed takes a signed 64-bit integer: any engine seed (0 .. 2**63 - 1) folded into one
    gen = torch.Generator(device=device).manual_seed(
        (seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63)
    )
    t = torch.empty(shape, dtype=torch.float32, device=device)
    if name.endswith("norm.weight"):
        return t.fill_(1.0)
    if len(shape) == 1:  # biases
        return t.normal_(0.0, 0.02, generator=gen)
    if "embed_tokens" in name or "lm_head" in name:
        return t.normal_(0.0, 0.1, generator=gen)
    return t.normal_(0.0, 2.0 * shape[1] ** -0.5, generator=gen)


def random_checkpoint(
    cfg: ModelConfig, seed: int, device: torch.device | str
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, shape in checkpoint_shapes(cfg).items():
        yield name, draw(name, shape, seed, device)


@torch.no_grad()
def init_random_weights(model: nn.Module, seed: int) -> None:
    """Give a transformers model (Hugging Face parameter names) the weights a preset would draw."""
    for name, p in model.named_parameters():
        p.copy_(draw(name, tuple(p.shape), seed, p.device))
