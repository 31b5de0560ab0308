"""The decode kernel doing the attention prologue itself (kernels/decode_prologue.py) against the unfused
reference: the separate prologue's torch reference, then the paged decode's.

Triton kernels run on the GPU, or on the CPU under TRITON_INTERPRET=1 (set before triton is imported).
"""

from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1", allow_module_level=True)

from llmbench.kernels.attention_prologue import attention_prologue_ref  # noqa: E402
from llmbench.kernels.decode_prologue import DecodePrologue  # noqa: E402
from llmbench.kernels.paged_attention import paged_attention_decode_ref  # noqa: E402
from llmbench.kernels.triton_decode import decode_attention  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
DTYPE = torch.float32 if INTERPRET else torch.bfloat16
TOL = 2e-5 if INTERPRET else 2e-2  # relative to max(1, max |ref|)


def close(name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    diff = (out.float() - ref.float()).abs().max().item()
    bound = TOL * max(1.0, ref.float().abs().max().item())
    assert torch.isfinite(ref).all(), f"{name}: the reference is not finite"
    assert diff <= bound, f"{name}: max |fused - ref| = {diff:.3g} > {bound:.3g}"


def decode_step(Hq: int, Hk: int, D: int, page: int, seq_lens: list[int], qk_norm: bool):
    """A decode step's inputs: the projection's output, a paged cache whose slots for the new tokens
    hold NaN, block tables, and each row's position and slot (a row of length 0 is padding: slot -1)."""
    B = len(seq_lens)
    width = (Hq + 2 * Hk) * D
    kw = dict(device=DEVICE, dtype=DTYPE)
    qkv = torch.randn(B, width, **kw) * 2
    cos_sin = torch.randn(4096, D, device=DEVICE, dtype=torch.float32)
    weights = (torch.randn(D, **kw), torch.randn(D, **kw)) if qk_norm else (None, None)
    max_blocks = max(1, max(-(-n // page) for n in seq_lens)) + 2
    num_blocks = B * max_blocks + 3
    k_cache = torch.randn(num_blocks, page, Hk, D, **kw)
    v_cache = torch.randn(num_blocks, page, Hk, D, **kw)
    tables = torch.randperm(num_blocks, device=DEVICE)[: B * max_blocks].view(B, max_blocks).to(torch.int32)
    lens = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    last = (lens - 1).clamp(min=0).long()
    slots = tables.long().gather(1, (last // page)[:, None])[:, 0] * page + last % page
    slots[lens == 0] = -1
    for s in slots[slots >= 0].tolist():  # the new token's slot: never read before it is written
        k_cache[s // page, s % page] = float("nan")
        v_cache[s // page, s % page] = float("nan")
    prologue = DecodePrologue(qkv, last, cos_sin, *weights, 1e-6, slots)
    return prologue, k_cache, v_cache, tables, lens


@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("Hq,Hk,D,page", [(4, 2, 64, 8), (8, 1, 128, 16), (6, 2, 80, 8), (16, 8, 128, 16)])
@pytest.mark.parametrize("num_splits,ordered", [(1, False), (1, True), (3, False), (2, True)])
def test_the_fused_prologue_matches_the_separate_one(
    qk_norm: bool, Hq: int, Hk: int, D: int, page: int, num_splits: int, ordered: bool
) -> None:
    # Lengths at and around tile bounds (the new token in a whole tile or in the tail), a context of one
    # token, and padded rows of length 0, which store nothing and give zeros.
    seq_lens = [1, 33, 64, 65, 0, 128, 97, 16, 0]
    p, k_cache, v_cache, tables, lens = decode_step(Hq, Hk, D, page, seq_lens, qk_norm)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q_ref = attention_prologue_ref(
        p.qkv, p.positions, p.cos_sin_cache, p.q_norm_weight, p.k_norm_weight, p.eps, k_ref, v_ref,
        p.slot_mapping, Hq, Hk,
    )  # fmt: skip
    scale = D**-0.5
    ref = paged_attention_decode_ref(q_ref, k_ref, v_ref, tables, lens, scale)
    order = torch.argsort(lens, descending=True) if ordered else None
    qkv_before = p.qkv.clone()
    out = decode_attention(
        p.q_view(Hq, D), k_cache, v_cache, tables, lens, scale, num_splits=num_splits, order=order, prologue=p
    )
    live = lens > 0
    close("output", out[live], ref[live])
    assert not out[~live].any(), "a padded row's output is 0"
    filled = ~torch.isnan(k_ref)  # every slot but a padded row's new one (none) is a number
    assert filled.all(), "the reference stored every live row's new token"
    close("K cache", k_cache, k_ref)
    assert torch.equal(v_cache, v_ref), "V is copied into its slot, not computed: bit-exact"
    assert torch.equal(p.qkv, qkv_before), "the projection's output is read only"


def test_a_prologue_needs_its_own_query_view_and_a_cache_of_the_model_dtype() -> None:
    p, k_cache, v_cache, tables, lens = decode_step(4, 2, 64, 8, [5, 9], True)
    q = p.q_view(4, 64)
    with pytest.raises(ValueError, match="q must be prologue.q_view"):
        decode_attention(q.clone(), k_cache, v_cache, tables, lens, 0.125, prologue=p)
    with pytest.raises(ValueError, match="cache of the model's dtype"):
        decode_attention(q, k_cache.half(), v_cache.half(), tables, lens, 0.125, prologue=p)
    with pytest.raises(ValueError, match="positions and slot_mapping"):
        decode_attention(q, k_cache, v_cache, tables, lens, 0.125, prologue=p._replace(positions=lens[:1]))
