"""The counts the bench layer's derived figures (bench/derived.py) are built on: what this rank holds and
what a step computes.

``RankWeights``: this rank's own parameters, grouped by what a step does with them. At tp > 1 a rank
holds shards of the sharded layers and whole copies of the replicated ones (norms; K/V projections when
there are fewer KV heads than ranks; the vocabulary padded to a multiple of tp), so the breakdown is read
from the parameters the rank actually holds, not worked out from the model's shapes.

``step_work``: per step, the rows whose logits are computed, the causal query-key pairs attention
computes and the keys it reads, from the scheduled batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from torch import nn

    from llmbench.engine.scheduler import ScheduledBatch


@dataclass(frozen=True)
class RankWeights:
    tp: int
    layer_bytes: int  # the decoder layers and the final norm: all read by every step
    layer_matmul_params: int  # elements of the layers' 2-D (matmul) weights: 2 FLOPs per token each
    lm_head_bytes: int  # this rank's vocabulary slice of the LM head (the embedding matrix when tied)
    lm_head_params: int
    embedding_bytes: int  # this rank's slice of the input embedding (a lookup reads only its tokens' rows)
    embedding_row_bytes: int  # one token's embedding row: hidden x dtype size
    tied_embeddings: bool
    kv_bytes_per_token: int  # K and V of one context token in this rank's cache, all layers
    num_layers: int
    attention_heads: int  # query heads on this rank
    kv_heads: int  # KV heads on this rank (one replicated head when there are fewer KV heads than ranks)
    head_dim: int


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def rank_weights(model: nn.Module, tp: int, kv_bytes_per_token: int) -> RankWeights:
    """The breakdown of a built Llama-family model (``LlamaForCausalLM``) on this rank."""
    decoder = model.model
    layers = list(decoder.layers.parameters()) + list(decoder.norm.parameters())
    embed, head = decoder.embed_tokens.weight, model.lm_head.weight  # (vocab / tp, hidden)
    attn = decoder.layers[0].self_attn
    return RankWeights(
        tp=tp,
        layer_bytes=_bytes(layers),
        layer_matmul_params=sum(p.numel() for p in decoder.layers.parameters() if p.dim() == 2),
        lm_head_bytes=_bytes([head]),
        lm_head_params=head.numel(),
        embedding_bytes=_bytes([embed]),
        embedding_row_bytes=embed.shape[1] * embed.element_size(),
        tied_embeddings=head is embed,
        kv_bytes_per_token=kv_bytes_per_token,
        num_layers=len(decoder.layers),
        attention_heads=attn.num_heads,
        kv_heads=attn.num_kv_heads,
        head_dim=attn.head_dim,
    )


class StepWork(NamedTuple):
    num_logits_rows: int  # the sequences that sample in the step
    attention_pairs: int  # causal (query, key) pairs, summed over the sequences
    context_tokens: int  # keys attended (cached + new tokens), summed over the sequences


def step_work(batch: ScheduledBatch) -> StepWork:
    """The batch's counts, taken before ``Scheduler.advance`` moves them on: a sequence with c tokens in
    the cache and q new ones has q*c + q(q+1)/2 query-key pairs and c + q keys, and samples when the step
    reaches its last token."""
    c = batch.counts()
    q = c.new
    pairs = int((q * c.computed + q * (q + 1) // 2).sum())
    context = int((c.computed + q).sum())
    rows = int(np.count_nonzero(c.samples))
    return StepWork(rows, pairs, context)
