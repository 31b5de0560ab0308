"""The decode fusions, applied to a built model from outside: one mechanism at tp=1 and tp > 1.

At a decode step of a few rows every launch is latency. The model (models/llama.py) runs each *seam*
between two projections as separate steps: the product whose rows are this rank's partial sums (the
embedding, o_proj, down_proj), their sum over the ranks, the residual add, the RMSNorm, and the next
projection (q/k/v, gate/up; none after the last layer). ``FusedDecode`` runs steps of up to ``rows``
tokens seam by seam instead, each seam with the fewest kernels the plan and the communicator allow:

- the RMSNorm and residual add on the loads of the next projection's skinny kernel (``norm_rows``:
  ``tuning.skinny_fusion`` "all");
- the SiLU-and-multiply on the loads of the down projection's skinny kernel (``silu_rows``: "silu" or
  "all");
- the sum over the ranks, the residual add and the norm in one kernel, the partial sums written straight
  into the communicator's buffer (``Communicator.partial_buffer``: ``tuning.tp_fuse_norm``);
- the row-parallel product, the sum and the residual add in one kernel, the norm then on the next
  projection's loads (``Communicator.takes_product``: ``tuning.tp_fuse_matmul``).

What a seam cannot fuse it runs as the model does, and a larger step is the model's own forward; the
values between seams are plain tensors. Which fusions apply is decided by engine/resolve.py: this module
reads the resolved values (``DecodePlan``) and the communicator's limits. The parameters are the model's:
nothing is copied or registered again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from llmbench.distributed import Communicator, Product
from llmbench.kernels.skinny_matmul import skinny_norm_matmul
from llmbench.layers.attention.metadata import AttentionMetadata
from llmbench.layers.linear import ColumnParallelLinear, LinearBase, RowParallelLinear
from llmbench.layers.norm import RMSNorm
from llmbench.models.llama import KVCache, LlamaForCausalLM

SKINNY_FUSIONS = ("all", "silu", "none")
# The communicator buffer of each seam's partial sums. No buffer may serve two reductions in a row
# (distributed/fused.py); a forward reduces the embedding's, then attention's and the MLP's of every
# layer, so these three alternate whatever the depth, across forwards too.
EMBEDDING, AFTER_ATTENTION, AFTER_MLP = 2, 0, 1
# The norm and SiLU fusions go on the skinny kernel's one-row (broadcast) form only. From two rows on its
# products run on the tensor cores, where work on the loads delays the operands: at 8 rows on an H200
# (qwen3-0.6b) the fused kernels made a decode step 26% longer than cuBLAS's, the SiLU alone 12%, and
# the unfused ones 11% shorter (BENCHMARKS.md, "The skinny matmul at a few rows").
FUSED_ROWS = 1


@dataclass(frozen=True)
class DecodePlan:
    """The resolved decode-step kernels (``tuning.skinny_matmul_rows``, ``tuning.skinny_fusion``)."""

    skinny_rows: int = 0  # linear layers: inputs of up to this many rows take the skinny kernel
    silu_rows: int = 0  # the SiLU-and-multiply on the down projection's loads, up to this many rows
    norm_rows: int = 0  # the RMSNorm on the next projection's loads, up to this many rows

    @classmethod
    def of(cls, skinny_rows: int, skinny_fusion: str) -> DecodePlan:
        if skinny_fusion not in SKINNY_FUSIONS:
            raise ValueError(
                f"Unsupported skinny_fusion: {skinny_fusion!r}. Supported: {list(SKINNY_FUSIONS)}"
            )
        fused = min(skinny_rows, FUSED_ROWS)
        return cls(
            skinny_rows, fused if skinny_fusion != "none" else 0, fused if skinny_fusion == "all" else 0
        )


@dataclass(frozen=True)
class Seam:
    buffer: int  # EMBEDDING, AFTER_ATTENTION or AFTER_MLP
    norm: RMSNorm
    next: ColumnParallelLinear | None  # the projection after the norm; None after the last layer


def fuse_decode(model: LlamaForCausalLM, plan: DecodePlan, comm: Communicator) -> nn.Module:
    """Apply ``plan`` to ``model``: every linear layer takes the skinny kernel up to ``plan.skinny_rows``
    rows. Returns what to run: the model with its seams fused for small steps (``FusedDecode``), or the
    model itself where nothing fuses."""
    for module in model.modules():
        if isinstance(module, LinearBase):
            module.skinny_rows = plan.skinny_rows
    fused = FusedDecode(model, plan, comm)
    return fused if fused.rows else model


class FusedDecode(nn.Module):
    """``model``'s forward, with steps of up to ``rows`` tokens run seam by seam with the fusions."""

    def __init__(self, model: LlamaForCausalLM, plan: DecodePlan, comm: Communicator) -> None:
        super().__init__()
        if plan.norm_rows and comm.fuses_norm:
            raise ValueError(
                "the norms go on the next product's loads (skinny_fusion 'all') or with the all-reduce "
                "(tp_fuse_norm), not both"
            )
        self.model = model
        self.plan = plan
        self.comm = comm
        self.rows = max(plan.silu_rows, plan.norm_rows, comm.max_fused_rows)
        decoder = model.model
        layers = list(decoder.layers)
        first = layers[0]
        self.first = Seam(EMBEDDING, first.input_layernorm, first.self_attn.qkv_proj)
        after = [Seam(AFTER_MLP, layer.input_layernorm, layer.self_attn.qkv_proj) for layer in layers[1:]]
        after.append(Seam(AFTER_MLP, decoder.norm, None))
        self.seams = [
            (Seam(AFTER_ATTENTION, layer.post_attention_layernorm, layer.mlp.gate_up_proj), after_mlp)
            for layer, after_mlp in zip(layers, after, strict=True)
        ]

    def forward(
        self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata, kv_caches: list[KVCache]
    ) -> Tensor:
        # input_ids, positions: (T,) -> (T, hidden): the final norm's output, as the model's forward
        T = input_ids.shape[0]
        if T > self.rows:
            return self.model(input_ids, positions, meta, kv_caches)
        decoder = self.model.model
        embed = decoder.embed_tokens
        x, residual = self._reduce_norm(
            self.first, T, embed.weight.dtype, lambda out: embed.partial(input_ids, out), None
        )
        for layer, (after_attention, after_mlp), kv_cache in zip(
            decoder.layers, self.seams, kv_caches, strict=True
        ):
            attn, mlp = layer.self_attn, layer.mlp
            o = attn.attend(positions, x, meta, kv_cache)  # q/k/v (T, (Hq + 2 Hk) D) -> (T, Hq D)
            x, residual = self._row_parallel(after_attention, attn.o_proj, o, False, residual)
            gated = T <= self.plan.silu_rows  # x: gate | up (T, 2 inter)
            x, residual = self._row_parallel(
                after_mlp, mlp.down_proj, x if gated else mlp.act(x), gated, residual
            )
        return x

    def _row_parallel(
        self,
        seam: Seam,
        linear: RowParallelLinear,
        x: Tensor,
        gated: bool,
        residual: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """``linear`` on ``x`` and the seam after it: (the next projection's output, or the final norm's
        after the last layer; the sum over the ranks + residual)."""
        T = x.shape[0]
        if T <= self.plan.skinny_rows and self.comm.takes_product(T, linear.weight.shape[0], x.dtype):
            product = Product(x, linear.weight, linear.rank_bias, gated)
            h, squares = self.comm.product_all_reduce(product, seam.buffer, residual)
            if seam.next is None:
                return seam.norm(h)[0], h
            nxt, norm = seam.next, seam.norm
            out, _ = skinny_norm_matmul(h, None, norm.weight, norm.eps, nxt.weight, nxt.bias, squares=squares)
            return out, h
        return self._reduce_norm(seam, T, x.dtype, lambda out: linear.partial(x, out, gated), residual)

    def _reduce_norm(
        self,
        seam: Seam,
        rows: int,
        dtype: torch.dtype,
        partial: Callable[[Tensor | None], Tensor],
        residual: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        """The seam from this rank's partial sums on (``partial(out)`` writes them into ``out``, or into a
        new tensor for None): (the next projection's output, or the final norm's; the sum + residual)."""
        norm = seam.norm
        buf = self.comm.partial_buffer(seam.buffer, rows, norm.weight.shape[0], dtype)
        if buf is not None:  # the sum, the residual add and the norm in one kernel
            partial(buf.tensor)
            normed, h = self.comm.all_reduce_norm(buf, residual, norm.weight, norm.eps)
        else:
            h = self.comm.all_reduce(partial(None))
            if seam.next is not None and rows <= self.plan.norm_rows:  # the norm on the next one's loads
                nxt = seam.next
                return skinny_norm_matmul(h, residual, norm.weight, norm.eps, nxt.weight, nxt.bias)
            normed, h = norm(h, residual)
        return (normed if seam.next is None else seam.next(normed)), h
