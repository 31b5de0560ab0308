"""The sampler's Triton kernels against their torch references, id for id, on awkward sizes.

Under ``TRITON_INTERPRET=1`` (conftest.py, no GPU) they run on CPU tensors at small sizes; on CUDA at
larger ones. The uniforms are bit-identical by construction (integer hashing); the scores go through
log2, which a GPU may round differently in the last bit, so on CUDA a differing id must be a near-tie
of the reference's own scores.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from llmbench.kernels import sample as draw  # noqa: E402
from llmbench.kernels._triton import aligns_on_request, cdiv, tl  # noqa: E402
from llmbench.kernels.sample import DEFAULT_CONFIG, SampleConfig, sample, sample_ref, uniforms_ref  # noqa: E402
from llmbench.kernels.sample_cut import cut_threshold, cut_threshold_ref  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else ("cuda" if torch.cuda.is_available() else None)
if DEVICE is None:
    pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1", allow_module_level=True)
LOG2E = 1.4426950408889634


def _rows(n: int, v: int, spread: float, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=g) * spread).to(dtype).to(DEVICE)
    scale = (LOG2E / (torch.rand(n, generator=g) * 1.5 + 0.2)).to(DEVICE)
    scale[::4] = 0.0  # every fourth row greedy
    keys = torch.randint(0, 2**32, (n,), generator=g).to(DEVICE)
    positions = torch.randint(0, 10_000, (n,), generator=g).to(DEVICE)
    return logits, scale, keys, positions


def _same_ids(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    differ = (got != want).sum().item()
    print(f"{name}: {differ} of {want.numel()} ids differ")
    assert differ == 0 if INTERPRET else differ <= max(1, want.numel() // 1000), name


SIZES = [(1, 1), (3, 17), (5, 1023), (2, 1025), (9, 3001)] if INTERPRET else [(1, 151_936), (256, 151_936)]


CONFIGS = {
    "default": DEFAULT_CONFIG,
    "accurate log2": SampleConfig(fast_log2=False),
    "4 warps, 2048 a step, 2 programs an SM": SampleConfig(block=2048, num_warps=4, programs_per_sm=2),
}


@pytest.mark.parametrize("n,v", SIZES, ids=lambda x: str(x))
@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_draw_kernel_matches_reference(n: int, v: int, cut: bool, config: str) -> None:
    dtype = torch.float32 if v < 1000 else torch.bfloat16
    logits, scale, keys, positions = _rows(n, v, 2.0, dtype)
    threshold = None
    if cut:  # keep about the top tenth of each row (all of it where the row is tiny)
        threshold = logits.float().quantile(0.9, dim=-1) if v > 1 else logits.float()[:, 0]
    _same_ids(
        f"sample {n}x{v} cut={cut}",
        sample(logits, scale, threshold, keys, positions, CONFIGS[config]),
        sample_ref(logits, scale, threshold, keys, positions),
    )


@draw.jit
def _neg_log2_kernel(u_ptr, out_ptr, n, SERIES: tl.constexpr, APPROX: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    u = tl.load(u_ptr + offs, mask=offs < n, other=0.5)
    tl.store(out_ptr + offs, draw._neg_log2_uniform(u, SERIES, APPROX), mask=offs < n)


@pytest.mark.parametrize(
    "approx", [False] if INTERPRET else [False, True], ids=lambda a: "lg2.approx" if a else "log2"
)
def test_the_fast_inner_log_is_accurate_relative_to_itself_where_u_nears_1(approx: bool) -> None:
    # Every uniform the hash can give near 1 (odd multiples of 2^-24), and a spread of the rest.
    top = torch.arange(1, 2**14, 2, dtype=torch.float64)  # 1 - u for u within 2^-10 of 1
    rest = torch.linspace(2**-24, 1 - 2**-10, 5001, dtype=torch.float64)
    u64 = torch.cat([1 - top * 2**-24, (rest * 2**23).floor() * 2**-23 + 2**-24])
    u = u64.float().to(DEVICE)
    assert (u.double().cpu() == u64).all()  # every one exact in float32
    out = torch.empty_like(u)
    _neg_log2_kernel[(cdiv(u.numel(), 1024),)](u, out, u.numel(), SERIES=True, APPROX=approx, BLOCK=1024)
    want = -torch.log2(u64)
    rel = ((out.double().cpu() - want) / want).abs()
    worst = rel.max().item()
    print(
        f"-log2(u), series near 1, {'lg2.approx' if approx else 'log2'} elsewhere: worst relative error {worst:.2g}"
    )
    # the approximate log2's absolute error (~2^-22) is relative to -log2(u) >= 0.0227 beyond the series
    assert worst < (2**-15 if approx else 2**-21)


def test_a_row_draws_the_same_id_whatever_the_number_of_rows() -> None:
    # One row alone is spread over many programs; among many rows it is read by one: same id.
    n, v = (3, 3001) if INTERPRET else (300, 151_936)
    logits, scale, keys, positions = _rows(n, v, 0.5, torch.float32, seed=3)
    scale[:] = LOG2E
    together = sample(logits, scale, None, keys, positions)
    for i in range(min(n, 3)):
        alone = sample(logits[i : i + 1], scale[i : i + 1], None, keys[i : i + 1], positions[i : i + 1])
        assert alone.item() == together[i].item()


def test_uniform_logits_draw_the_argmax_of_the_reference_uniforms() -> None:
    # With every logit equal the winner is the largest uniform: the kernel's hash is the reference's.
    n, v = 6, 700
    logits = torch.zeros(n, v, device=DEVICE)
    scale = torch.ones(n, device=DEVICE)
    keys = torch.arange(n, device=DEVICE) * 977 + 5
    positions = torch.arange(n, device=DEVICE)
    want = uniforms_ref(keys, positions, v).argmax(-1)
    assert sample(logits, scale, None, keys, positions).tolist() == want.tolist()


def test_greedy_rows_take_the_first_of_tied_maxima_across_blocks_and_programs() -> None:
    # 1024 columns a block; a row alone is split over several programs, rows together are not.
    v = 3001
    logits = torch.zeros(4, v, device=DEVICE)
    logits[0, [2500, 1100, 1030]] = 1.0  # three blocks: the first of them wins
    logits[1, [7, 9]] = 1.0  # one block, two lanes
    logits[2, [2049, 5]] = 1.0  # the last block and the first
    logits[3, v - 1] = 1.0  # the last column alone
    want = [1030, 7, 5, v - 1]
    scale = torch.zeros(4, device=DEVICE)  # greedy
    keys, positions = (
        torch.zeros(4, dtype=torch.int64, device=DEVICE),
        torch.zeros(4, dtype=torch.int64, device=DEVICE),
    )
    assert sample(logits, scale, None, keys, positions).tolist() == want
    for i in range(4):
        alone = sample(logits[i : i + 1], scale[i : i + 1], None, keys[i : i + 1], positions[i : i + 1])
        assert alone.item() == want[i]
    assert sample_ref(logits, scale, None, keys, positions).tolist() == want


CUT_SIZES = [(4, 33), (6, 1000), (3, 4099)] if INTERPRET else [(8, 151_936)]


@pytest.mark.parametrize("n,v", CUT_SIZES, ids=lambda x: str(x))
@pytest.mark.parametrize("spread", [0.3, 3.0, 30.0], ids=["flat", "normal", "peaked"])
def test_cut_kernel_keeps_what_the_reference_keeps(n: int, v: int, spread: float) -> None:
    logits, scale, _, _ = _rows(n, v, spread, torch.bfloat16 if v > 1000 else torch.float32, seed=7)
    g = torch.Generator().manual_seed(1)
    top_p = (torch.rand(n, generator=g) * 0.98 + 0.01).to(DEVICE)
    top_p[1] = 1.0
    min_p = torch.where(torch.rand(n, generator=g) < 0.5, torch.rand(n, generator=g) * 0.2, 0.0).to(DEVICE)
    floor = logits.float().topk(min(v, 20), dim=-1).values[:, -1]
    floor[::2] = float("-inf")
    for args in ((None, top_p, None), (None, None, min_p), (floor, top_p, min_p), (floor, top_p, None)):
        got = cut_threshold(logits, scale, *args)
        want = cut_threshold_ref(logits, scale, *args)
        # Masses summed in another order may move a boundary by a token or two on a GPU; never more.
        tokens = ((logits.float() >= got[:, None]) != (logits.float() >= want[:, None])).sum(dim=-1)
        print(f"cut {n}x{v} spread {spread}: rows keep {tokens.tolist()} other tokens")
        assert tokens.max().item() <= (0 if INTERPRET else 2)


def _launch_key(kernel, name: str, t: torch.Tensor):
    """What ``kernel`` specialises a launch on for pointer argument ``name`` = ``t``, as the compiled
    (not interpreted) form of the same kernel would."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, native_specialize_impl

    jitted = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **kernel.kwargs)
    (kp,) = [p for p in jitted.params if p.name == name]
    return native_specialize_impl(
        BaseBackend, t, False, not kp.do_not_specialize, not kp.do_not_specialize_on_alignment
    )


@pytest.mark.skipif(not aligns_on_request(), reason="this Triton specialises every pointer on its alignment")
def test_rows_at_any_offset_of_a_step_upload_launch_the_same_compiled_draw_and_cut() -> None:
    # (2, N) keys with N odd: the positions' row starts 8 bytes past a 16-byte boundary. A kernel that
    # specialised on it would compile again inside a measured step the first time N is odd.
    from llmbench.kernels import sample_cut

    keys = torch.zeros(2, 3, dtype=torch.int64)
    assert keys[0].data_ptr() % 16 == 0 and keys[1].data_ptr() % 16 == 8
    for kernel, names in (
        (draw._sample_kernel, draw.ROW_POINTERS),
        (sample_cut._cut_kernel, sample_cut.ROW_POINTERS),
    ):
        for name in names:
            assert _launch_key(kernel, name, keys[0]) == _launch_key(kernel, name, keys[1]), name
    # and the check sees a pointer that is specialised: the logits
    assert _launch_key(draw._sample_kernel, "logits_ptr", keys[0]) != _launch_key(
        draw._sample_kernel, "logits_ptr", keys[1]
    )


@pytest.mark.parametrize("b", [1, 3, 17, 300, 1500])
def test_the_fill_kernel_takes_the_rows_last_samples_as_its_reference_does(b: int) -> None:
    from llmbench.kernels.token_fill import fill_tokens, fill_tokens_ref

    g = torch.Generator().manual_seed(b)
    last = torch.randint(0, 150_000, (b + 7,), generator=g).to(DEVICE)
    ids = torch.randint(0, 150_000, (b,), generator=g).to(DEVICE)
    fill = torch.randint(-1, b + 7, (b,), generator=g).to(DEVICE)  # about one row in b + 8 keeps its own id
    fill[::3] = -1
    got, want = fill_tokens(ids, fill, last), fill_tokens_ref(ids, fill, last)
    assert torch.equal(got, want)
    kept = fill < 0
    assert torch.equal(got[kept], ids[kept]) and torch.equal(got[~kept], last[fill[~kept]])


def test_the_draw_writes_into_a_given_buffer() -> None:
    logits, scale, keys, positions = _rows(3, 1025, 2.0, torch.float32)
    for fn in (sample, sample_ref):
        buf = torch.full((5,), -7, dtype=torch.int64, device=DEVICE)
        got = fn(logits, scale, None, keys, positions, out=buf[1:4])
        assert got.data_ptr() == buf[1:].data_ptr() and buf[0] == buf[4] == -7
        assert torch.equal(buf[1:4], sample_ref(logits, scale, None, keys, positions))
