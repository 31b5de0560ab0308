"""The Llama-family decoder that Llama 2/3, Qwen2 and Qwen3 share: tensors in, tensors out.

The three differ only in flags of ``ModelConfig``: Qwen2 has a bias on q/k/v, Qwen3 normalises q and k
per head before RoPE, Llama 3 scales RoPE frequencies. Parameter names follow Hugging Face's, with q/k/v
and gate/up fused (``packed_modules`` tells the loader how).

Tensor parallelism lives in the layers (each holds its shard; row-parallel layers and the embedding sum
their outputs over the ranks). The decode steps' fusions (norms and the SiLU on the loads of the skinny
matmul, the all-reduce fused with the norm or the product) are not here: models/fused_decode.py applies
them to the built model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llmbench.layers.activation import SiluAndMul
from llmbench.layers.attention.backends import AttentionBackend
from llmbench.layers.attention.kv import LayerKV
from llmbench.layers.attention.layer import Attention
from llmbench.layers.attention.metadata import AttentionMetadata
from llmbench.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from llmbench.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from llmbench.layers.norm import RMSNorm
from llmbench.layers.parallel import SINGLE, TPGroup
from llmbench.layers.rotary import RotaryEmbedding
from llmbench.models.config import ModelConfig

KVCache = LayerKV


@dataclass(frozen=True)
class BuildOptions:
    """How the layers are built; the decode fusions are applied afterwards (models/fused_decode.py)."""

    backend: AttentionBackend
    max_positions: int
    tp: TPGroup = SINGLE
    use_triton: bool = False


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, opts: BuildOptions) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(h, [i, i], bias=cfg.mlp_bias, tp=opts.tp)
        self.act = SiluAndMul(opts.use_triton)
        self.down_proj = RowParallelLinear(i, h, bias=cfg.mlp_bias, tp=opts.tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (T, hidden) -> gate | up (T, 2 inter / tp) -> (T, hidden)
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, opts: BuildOptions, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = Attention(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            qkv_bias=cfg.qkv_bias,
            qk_norm=cfg.qk_norm,
            rms_norm_eps=cfg.rms_norm_eps,
            rotary=rotary,
            backend=opts.backend,
            tp=opts.tp,
            use_triton=opts.use_triton,
        )
        self.mlp = MLP(cfg, opts)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts.use_triton)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts.use_triton)

    def forward(
        self,
        positions: torch.Tensor,  # (T,)
        h: torch.Tensor,  # (T, hidden): the previous layer's output (the embeddings for the first)
        residual: torch.Tensor | None,  # (T, hidden): the residual stream (None before the first layer)
        meta: AttentionMetadata,
        kv_cache: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # -> (this layer's output, the residual stream), each (T, hidden)
        h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(positions, h, meta, kv_cache)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, opts: BuildOptions) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, opts.tp)
        # One rotary table shared by every layer: it depends on shapes only.
        rotary = RotaryEmbedding(cfg.head_dim, opts.max_positions, cfg.rope, opts.use_triton)
        self.layers = nn.ModuleList(DecoderLayer(cfg, opts, rotary) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts.use_triton)

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        # -> (T, hidden): the final norm's output
        h = self.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(positions, h, residual, meta, kv_cache)
        return self.norm(h, residual)[0]


class LlamaForCausalLM(nn.Module):
    # checkpoint name fragment -> (our fused parameter, shard id)
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig, opts: BuildOptions) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, opts)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, opts.tp)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        return self.model(input_ids, positions, meta, kv_caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)
