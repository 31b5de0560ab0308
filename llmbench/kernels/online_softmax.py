"""The online-softmax step the paged-attention kernels share (``triton_decode.py``, ``triton_prefill.py``).

Attention over a context walked in key tiles keeps, per query row, the largest score so far ``m``, the sum
of exponentials ``l_sum`` relative to it, and the output ``acc`` weighted the same way; each tile rescales
them to its own maximum when that is larger. Scores are in log2 units (the scale times log2(e)), so that
``exp2`` does the exponentials; everything is float32.
"""

from __future__ import annotations

from llmbench.kernels._triton import jit, tl


@jit
def fold_tile(m, l_sum, acc, s, v, DOT_PRECISION: tl.constexpr):
    """A tile's scores ``s`` (rows x keys, log2 units, -inf where masked) and its V tile (keys x head_dim)
    folded into the rows' running ``m``, ``l_sum`` and ``acc``; every row must have met a finite score by
    then (its first tile holds one)."""
    m_new = tl.maximum(m, tl.max(s, axis=1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    l_sum = l_sum * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_sum, acc
