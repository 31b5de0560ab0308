"""The Llama-family decoder that Llama 2/3, Qwen2 and Qwen3 share.

The three differ only in flags of ``ModelConfig``: Qwen2 has a bias on q/k/v, Qwen3 normalises q and k
per head before RoPE, Llama 3 scales RoPE frequencies. Parameter names follow Hugging Face's, with q/k/v
and gate/up fused (``packed_modules`` tells the loader how).
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
    backend: AttentionBackend
    max_positions: int
    tp: TPGroup = SINGLE
    use_triton: bool = False
    skinny_rows: int = 0  # linear layers: inputs of up to this many rows take the skinny Triton kernel
    # what the skinny kernel does on its loads (Tuning.skinny_fusion, resolved): all, silu, none
    skinny_fusion: str = "none"


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, opts: BuildOptions) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            h, [i, i], bias=cfg.mlp_bias, tp=opts.tp, skinny_rows=opts.skinny_rows
        )
        self.down_proj = RowParallelLinear(i, h, bias=cfg.mlp_bias, tp=opts.tp, skinny_rows=opts.skinny_rows)
        self.act = SiluAndMul(opts.use_triton)
        self.fused_rows = opts.skinny_rows if opts.skinny_fusion != "none" else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate_up_proj(x))

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        # -> partial sums at tp > 1 (RowParallelLinear)
        if gate_up.shape[0] <= self.fused_rows:  # the SiLU-and-multiply on the skinny kernel's loads
            return self.down_proj(gate_up, gated=True)
        return self.down_proj(self.act(gate_up))


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
            skinny_rows=opts.skinny_rows,
        )
        self.mlp = MLP(cfg, opts)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts.use_triton)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts.use_triton)
        # "all": each RMSNorm on the loads of the skinny matmul after it (where tp_fuse_norm applies, the
        # norms go with the all-reduce instead: engine/resolve.py chose "silu" then)
        self.norm_rows = opts.skinny_rows if opts.skinny_fusion == "all" else 0
        self.tp = opts.tp

    def forward(
        self,
        positions: torch.Tensor,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        meta: AttentionMetadata,
        kv_cache: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # h: the previous layer's output (the embedding's for the first), not yet summed over the
        # tensor-parallel ranks; returns this layer's, likewise, and the residual stream.
        tp = self.tp
        if h.shape[0] <= self.norm_rows:  # each RMSNorm on the loads of the skinny matmul after it
            qkv, residual = self.self_attn.qkv_proj.forward_normed(
                tp.all_reduce(h), residual, self.input_layernorm
            )
            h = self.self_attn.forward_projected(positions, qkv, meta, kv_cache)
            gate_up, residual = self.mlp.gate_up_proj.forward_normed(
                tp.all_reduce(h), residual, self.post_attention_layernorm
            )
            return self.mlp.down(gate_up), residual
        # lazy: where the all-reduce was done in the product's kernel, the norm is done on the next
        # product's loads (q/k/v, gate/up: column-parallel layers)
        h, residual = tp.all_reduce_norm(h, residual, self.input_layernorm, lazy=True)
        h = self.self_attn(positions, h, meta, kv_cache)
        h, residual = tp.all_reduce_norm(h, residual, self.post_attention_layernorm, lazy=True)
        return self.mlp(h), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, opts: BuildOptions) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, opts.tp)
        # One rotary table shared by every layer: it depends on shapes only.
        rotary = RotaryEmbedding(cfg.head_dim, opts.max_positions, cfg.rope, opts.use_triton)
        self.layers = nn.ModuleList(DecoderLayer(cfg, opts, rotary) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts.use_triton)
        self.tp = opts.tp

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        # At tp > 1 each rank's partial sums travel from layer to layer and every all-reduce happens
        # together with the RMSNorm after it (TPGroup.all_reduce_norm).
        h = self.embed_tokens(input_ids)  # (T, hidden)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(positions, h, residual, meta, kv_cache)
        return self.tp.all_reduce_norm(h, residual, self.norm)[0]


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
