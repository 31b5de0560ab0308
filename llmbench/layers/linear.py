"""Linear layers split over tensor-parallel ranks, vLLM style.

Each parameter carries ``weight_loader(param, loaded, shard_id)``: the loader hands it the full tensor
from the checkpoint and the layer keeps its own slice, so a rank only ever holds its shard. With one
rank every slice is the whole tensor. An input of up to ``skinny_rows`` rows (a decode step at a small
batch) runs the skinny Triton kernel (kernels/skinny_matmul.py), a larger one cuBLAS; ``skinny_rows`` is
0 until the decode plan sets it (models/fused_decode.py).
"""

from __future__ import annotations

import torch
from torch import nn

from llmbench.kernels.skinny_matmul import linear_into, skinny_matmul, skinny_silu_matmul
from llmbench.layers.parallel import SINGLE, TPGroup


class LinearBase(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.skinny_rows = 0  # inputs of up to this many rows go to the skinny Triton kernel
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmul(x, self.bias)

    def _matmul(
        self, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x.shape[0] <= self.skinny_rows:  # x: (T, in) -> (T, out)
            return skinny_matmul(x, self.weight, bias, out=out)
        return linear_into(x, self.weight, bias, out)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        _copy_checked(param.data, loaded)


def _copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"shape {tuple(src.shape)} does not fit the parameter's {tuple(dst.shape)}")
    dst.copy_(src)


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks; no communication."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__(in_features, tp.split(out_features, "output features"), bias, tp)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        n = param.shape[0]
        _copy_checked(param.data, loaded.narrow(0, self.tp.rank * n, n) if self.tp.size > 1 else loaded)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate and up); ``shard_id`` is the part index."""

    def __init__(
        self,
        in_features: int,
        out_sizes: list[int],
        bias: bool = False,
        tp: TPGroup = SINGLE,
    ) -> None:
        self.out_sizes = [tp.split(s, "output features") for s in out_sizes]
        super().__init__(in_features, sum(out_sizes), bias, tp)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        assert isinstance(shard_id, int)
        offset = sum(self.out_sizes[:shard_id])
        n = self.out_sizes[shard_id]
        if self.tp.size > 1:
            loaded = loaded.narrow(0, self.tp.rank * n, n)
        _copy_checked(param.data.narrow(0, offset, n), loaded)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul, split by heads; KV heads are replicated when fewer than ranks."""

    def __init__(
        self,
        hidden: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        tp: TPGroup = SINGLE,
    ) -> None:
        self.head_dim = head_dim
        self.num_heads = tp.split(num_heads, "attention heads")
        if num_kv_heads >= tp.size:
            self.num_kv_heads = tp.split(num_kv_heads, "key/value heads")
            self.kv_replicas = 1
        else:
            if tp.size % num_kv_heads:
                raise ValueError(
                    f"tensor-parallel degree {tp.size} must divide or be a multiple of key/value heads ({num_kv_heads})"
                )
            self.num_kv_heads = 1
            self.kv_replicas = tp.size // num_kv_heads
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        LinearBase.__init__(self, hidden, out, bias, tp)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, n, rank_slot = 0, q, self.tp.rank
        elif shard_id in ("k", "v"):
            offset = q if shard_id == "k" else q + kv
            n, rank_slot = kv, self.tp.rank // self.kv_replicas
        else:
            raise ValueError(f"QKV shard must be 'q', 'k' or 'v', got {shard_id!r}")
        if self.tp.size > 1:
            loaded = loaded.narrow(0, rank_slot * n, n)
        _copy_checked(param.data.narrow(0, offset, n), loaded)


class RowParallelLinear(LinearBase):
    """Input features split over ranks: each rank's product is its partial sums of the output, which
    ``forward`` adds over the ranks. The bias is added on rank 0 only, so it counts once in the sum."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__(tp.split(in_features, "input features"), out_features, bias, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (T, in / tp) -> (T, out), summed over the ranks
        return self.tp.all_reduce(self.partial(x))

    @property
    def rank_bias(self) -> torch.Tensor | None:
        """The bias as this rank adds it: rank 0's, None on the others."""
        return self.bias if self.tp.rank == 0 else None

    def partial(self, x: torch.Tensor, out: torch.Tensor | None = None, gated: bool = False) -> torch.Tensor:
        """This rank's partial sums (T, out), into ``out`` when given (a buffer the sum is taken from).
        ``gated``: x is the gated MLP's gate | up (T, 2 in / tp), its SiLU-and-multiply done on the skinny
        kernel's loads."""
        if gated:
            return skinny_silu_matmul(x, self.weight, self.rank_bias, out=out)
        return self._matmul(x, self.rank_bias, out)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if param.dim() == 2 and self.tp.size > 1:
            n = param.shape[1]
            loaded = loaded.narrow(1, self.tp.rank * n, n)
        _copy_checked(param.data, loaded)
