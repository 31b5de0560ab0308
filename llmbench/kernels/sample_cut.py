"""Per-row logit thresholds for top-p and min-p, without sorting the vocabulary.

Row r keeps the tokens whose logit is at least the returned ``threshold[r]``; the draw
(``kernels/sample.py``) samples among them. With ``scale = log2(e) / T`` and ``e_v = 2^((x_v - m) scale)``
(the unnormalised softmax of logits / T, m the row's largest logit), among the tokens at or above
``floor[r]`` (the top-k cut; -inf for none):

- min-p keeps e_v >= min_p * e_max, i.e. x_v >= m + log2(min_p) / scale.
- top-p keeps the smallest set of most likely tokens whose mass reaches top_p of the total: the
  threshold is t* = the largest logit t with M(t) = sum of e_v over x_v >= t at least top_p * Z. Every
  token tied with t* is kept.

The result is the largest of floor and the two cuts. Rows that sample greedily (``scale == 0``) or set
neither cut get ``floor`` back.

``cut_threshold_ref`` finds t* by sorting each row (plain torch). ``cut_threshold`` (Triton, same
signature, one program per row) never sorts: a pass for m (and the row's smallest kept logit), a pass
for Z, then a search on the value of t. Each search pass evaluates M at a pivot t, and also finds the
nearest logits on either side of it, so the interval [L, U] that holds t* always ends on logits of the
row and the search ends exactly when L == U. The first pivot is m + log2((1 - top_p) Z / V) / scale:
the V tokens below it hold at most (1 - top_p) Z, so M there is at least top_p Z, and a peaked row
(a trained model's) leaves only a few candidates above it. Later pivots halve [L, U]. A flat row (random
weights) needs about as many passes as its logits have bits to tell neighbours apart (10-25).
"""

from __future__ import annotations

import torch

from llmbench.kernels._triton import jit, programmatic, require_triton, tl, wait_for_inputs
from llmbench.kernels.sample import REF_CHUNK_ELEMENTS

# the per-row settings: rows of a step's uploaded (4, N) array, at offsets that follow N (sample.py)
ROW_POINTERS = ("scale_ptr", "floor_ptr", "top_p_ptr", "min_p_ptr")
MAX_SEARCH_PASSES = 64  # float32 neighbours are told apart well before; the cap only bounds a bad input


def cut_threshold_ref(
    logits: torch.Tensor,  # (N, V)
    scale: torch.Tensor,  # (N,) float32: log2(e) / temperature; 0 = greedy
    floor: torch.Tensor | None,  # (N,) float32: the top-k cut (keep logits >= floor); None = none
    top_p: torch.Tensor | None,  # (N,) float32 in (0, 1]; 1 = no cut; None = no row cuts
    min_p: torch.Tensor | None,  # (N,) float32 in [0, 1]; 0 = no cut; None = no row cuts
) -> torch.Tensor:
    """(N,) float32 thresholds."""
    N, V = logits.shape
    rows = max(1, REF_CHUNK_ELEMENTS // max(1, V))
    if N > rows:  # a few rows at a time: the sort's temporaries stay small
        return torch.cat([
            cut_threshold_ref(*(None if t is None else t[i : i + rows] for t in (logits, scale, floor, top_p, min_p)))
            for i in range(0, N, rows)
        ])  # fmt: skip
    x = logits.float()  # (N, V)
    low = torch.full((N,), float("-inf"), device=x.device) if floor is None else floor
    kept = x.masked_fill(x < low[:, None], float("-inf"))  # (N, V): the top-k survivors
    m = kept.amax(dim=-1)  # (N,)
    sampled = scale > 0
    thr = low.clone()
    if min_p is not None:
        cut = m + torch.log2(min_p) / scale  # min_p = 0: -inf
        thr = torch.where(sampled & (min_p > 0), torch.maximum(thr, cut), thr)
    if top_p is not None:
        vals = kept.sort(dim=-1, descending=True).values  # (N, V)
        e = torch.exp2((vals - m[:, None]) * scale[:, None]).nan_to_num(0.0)  # -inf (and greedy) -> 0
        cum = e.cumsum(dim=-1)  # (N, V)
        # The first position whose running mass reaches top_p * Z; its logit is t*.
        first = (cum < top_p[:, None] * cum[:, -1:]).sum(dim=-1).clamp(max=V - 1)
        t = vals.gather(1, first[:, None]).squeeze(1)
        thr = torch.where(sampled & (top_p < 1), torch.maximum(thr, t), thr)
    return thr


@jit(do_not_specialize=("V", "stride"), unaligned=ROW_POINTERS)
def _cut_kernel(
    logits_ptr, scale_ptr, floor_ptr, top_p_ptr, min_p_ptr, out_ptr,
    V, stride,
    HAS_FLOOR: tl.constexpr, HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr,
    BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    scale = tl.load(scale_ptr + row)
    low = tl.full((), float("-inf"), tl.float32)
    if HAS_FLOOR:
        low = tl.load(floor_ptr + row)
    p = tl.full((), 1.0, tl.float32)
    if HAS_TOP_P:
        p = tl.load(top_p_ptr + row)
    min_p = tl.zeros((), dtype=tl.float32)
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + row)
    thr = low
    if (scale > 0) & ((p < 1.0) | (min_p > 0.0)):
        # Pass 1: the largest and smallest logits kept by the floor.
        m = tl.full((), float("-inf"), tl.float32)
        lo = tl.full((), float("inf"), tl.float32)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            kept = (cols < V) & (x >= low)
            m = tl.maximum(m, tl.max(tl.where(kept, x, float("-inf")), axis=0))
            lo = tl.minimum(lo, tl.min(tl.where(kept, x, float("inf")), axis=0))
        if min_p > 0.0:
            thr = tl.maximum(thr, m + tl.log2(min_p) / scale)
        if p < 1.0:
            # Pass 2: Z, the mass of the kept tokens (relative to the largest).
            z = tl.zeros((), dtype=tl.float32)
            for start in range(0, V, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
                e = tl.exp2((x - m) * scale)
                z += tl.sum(tl.where(x >= low, e, 0.0), axis=0)
            target = p * z
            # t* lies in [L, U], both logits of the row: M(L) >= target, nothing above U qualifies.
            L = lo
            U = m
            t = m + tl.log2((1.0 - p) * z / V) / scale
            t = tl.where(t > L, t, L + (U - L) * 0.5)
            t = tl.where(t > L, t, U)
            passes = tl.zeros((), dtype=tl.int32)
            while (L < U) & (passes < MAX_PASSES):
                mass = tl.zeros((), dtype=tl.float32)
                above = tl.full((), float("inf"), tl.float32)  # the smallest logit >= t
                below = tl.full((), float("-inf"), tl.float32)  # the largest kept logit < t
                for start in range(0, V, BLOCK):
                    cols = start + tl.arange(0, BLOCK)
                    x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
                    ge = x >= t
                    e = tl.exp2((x - m) * scale)
                    mass += tl.sum(tl.where(ge, e, 0.0), axis=0)
                    above = tl.minimum(above, tl.min(tl.where(ge, x, float("inf")), axis=0))
                    below = tl.maximum(below, tl.max(tl.where(ge | (x < low), float("-inf"), x), axis=0))
                enough = mass >= target
                L = tl.where(enough, above, L)
                U = tl.where(enough, U, below)
                t = L + (U - L) * 0.5
                t = tl.where(t > L, t, U)  # neighbouring floats: test U itself
                passes += 1
            thr = tl.maximum(thr, L)
    tl.store(out_ptr + row, thr)


BLOCK = 2048


def cut_threshold(
    logits: torch.Tensor,
    scale: torch.Tensor,
    floor: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
) -> torch.Tensor:
    """Triton version of ``cut_threshold_ref``."""
    require_triton("cut_threshold")
    N, V = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    out = torch.empty(N, dtype=torch.float32, device=logits.device)
    if N == 0:
        return out
    scale, floor, top_p, min_p = (t if t is None else t.contiguous() for t in (scale, floor, top_p, min_p))
    _cut_kernel[(N,)](
        logits, scale, scale if floor is None else floor, scale if top_p is None else top_p,
        scale if min_p is None else min_p, out,
        V, logits.stride(0),
        HAS_FLOOR=floor is not None, HAS_TOP_P=top_p is not None, HAS_MIN_P=min_p is not None,
        BLOCK=BLOCK, MAX_PASSES=MAX_SEARCH_PASSES, num_warps=8,
        **programmatic(logits, N),
    )  # fmt: skip
    return out
