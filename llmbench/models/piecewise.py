"""A step's forward cut at attention, so that all of it but attention can replay from CUDA Graphs.

A prefill or mixed step runs outside the decode graphs: eagerly, the host launches about ten kernels a layer
(norms, projections, the attention prologue, the activation) and that costs it about as long as the device
takes to run them. Only attention's launch depends on the step's sequences (their count, lengths and first
rows); everything else depends on the number of tokens alone. So the forward is cut into pieces at the
attention kernels, num_layers + 1 of them:

- piece 0: the embedding, the first layer's input norm, its q/k/v projection and prologue (q/k norm,
  RoPE, K/V into their slots; q into the q buffer);
- piece i: layer i-1's output projection (from the attention buffer), its post-attention norm and MLP, then
  layer i's input norm, q/k/v projection and prologue;
- the last: as piece i up to the MLP of the last layer, then the final norm, whose output it returns.

Between piece i and piece i+1 the host runs layer i's attention (``attend``) from the q buffer into the
attention buffer. The pieces read and write only ``PieceBuffers`` (the residual stream is updated in place)
and the KV cache, so engine/prefill_graph.py captures each once per bucket of token counts. The values are
the model's own: the same kernels in the same order as ``LlamaForCausalLM.forward`` with Triton kernels and
a backend that reads K/V from the cache (tests/test_prefill_graph.py checks them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from llmbench.layers.attention.metadata import AttentionMetadata
from llmbench.models.llama import KVCache, LlamaForCausalLM


@dataclass(frozen=True)
class PieceBuffers:
    """What the pieces read and write, for up to ``rows`` tokens; a step of T tokens uses the first T."""

    input_ids: Tensor  # (rows,) int64
    positions: Tensor  # (rows,) int64
    slot_mapping: Tensor  # (rows,) int64: -1 for a padded row, which stores no K/V
    residual: Tensor  # (rows, hidden): the residual stream, updated in place
    q: Tensor  # (rows, Hq, D): the current layer's queries, its K/V stored
    o: Tensor  # (rows, Hq, D): the current layer's attention output

    @classmethod
    def allocate(cls, model: LlamaForCausalLM, rows: int, device: torch.device) -> PieceBuffers:
        attn = model.model.layers[0].self_attn
        dtype = model.model.norm.weight.dtype
        heads = (rows, attn.num_heads, attn.head_dim)
        return cls(
            input_ids=torch.zeros(rows, dtype=torch.int64, device=device),
            positions=torch.zeros(rows, dtype=torch.int64, device=device),
            slot_mapping=torch.full((rows,), -1, dtype=torch.int64, device=device),
            residual=torch.zeros(rows, model.config.hidden_size, dtype=dtype, device=device),
            q=torch.zeros(heads, dtype=dtype, device=device),
            o=torch.zeros(heads, dtype=dtype, device=device),
        )

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]


class PiecewiseForward:
    """``model``'s forward as pieces over ``PieceBuffers``, with attention run between them."""

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[KVCache]) -> None:
        layers = list(model.model.layers)
        if not all(layer.self_attn.fused_prologue for layer in layers):
            raise ValueError(
                "a forward cut at attention needs the fused attention prologue (triton_kernels=True and a "
                "backend that reads K/V from the cache)"
            )
        if layers[0].self_attn.o_proj.tp.size != 1:
            raise ValueError("a forward cut at attention runs one rank's model (tp=1)")
        self.model = model
        self.layers = layers
        self.kv_caches = kv_caches

    @property
    def num_pieces(self) -> int:
        return len(self.layers) + 1

    def piece(self, i: int, buf: PieceBuffers, rows: int) -> Tensor | None:
        """Run piece ``i`` over the first ``rows`` rows of ``buf``; the last returns the final norm's output
        (rows, hidden), the others None (their result is layer i's q in ``buf.q``, its K/V stored)."""
        decoder = self.model.model
        residual = buf.residual[:rows]
        if i == 0:
            residual.copy_(decoder.embed_tokens(buf.input_ids[:rows]))
            x = self.layers[0].input_layernorm(residual)[0]
        else:
            done = self.layers[i - 1]
            h = done.self_attn.o_proj(buf.o[:rows].view(rows, -1))
            x, _ = done.post_attention_layernorm(h, residual, residual)
            h = done.mlp(x)
            if i == len(self.layers):
                return decoder.norm(h, residual, residual)[0]
            x, _ = self.layers[i].input_layernorm(h, residual, residual)
        attn = self.layers[i].self_attn
        attn.store_qkv(
            buf.positions[:rows], attn.qkv_proj(x), buf.slot_mapping[:rows], self.kv_caches[i], buf.q[:rows]
        )
        return None

    def attend(self, i: int, buf: PieceBuffers, tokens: int, meta: AttentionMetadata) -> None:
        """Layer ``i``'s attention for the step's ``tokens`` real rows: from ``buf.q`` into ``buf.o``."""
        self.layers[i].self_attn.attend_stored(buf.q[:tokens], meta, self.kv_caches[i], buf.o[:tokens])

    def forward(self, buf: PieceBuffers, rows: int, tokens: int, meta: AttentionMetadata) -> Tensor:
        """Every piece and attention eagerly: the step's final hidden states (rows, hidden)."""
        for i in range(len(self.layers)):
            self.piece(i, buf, rows)
            self.attend(i, buf, tokens, meta)
        out = self.piece(len(self.layers), buf, rows)
        assert out is not None
        return out
