"""devtools/persistent_chain.py: its kernel's tile code against the torch chain it stands for.

On the CPU (TRITON_INTERPRET=1) the kernel runs one product of one layer a launch, without barriers, over
fewer programs than most products have tiles; every activation buffer starts as NaN, so a tile never
written, a sum never zeroed or a wrong SiLU-and-multiply shows. The persistent form, with its grid
barriers, runs on a GPU only (marked gpu).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest
import torch

DEVTOOLS = str(Path(__file__).resolve().parents[1] / "devtools")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
TOL = 2e-2  # largest |out - ref| over largest |ref|: a few bf16 roundings (2**-8) apart after two layers


@pytest.fixture
def pc(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(DEVTOOLS)
    import persistent_chain

    return persistent_chain


def run_chain(pc: ModuleType, chain, x: torch.Tensor, tiling) -> torch.Tensor:
    run = pc.PersistentChain(chain, x.shape[0], tiling)
    for buf in (run.qkv, run.o, run.h, run.d):  # nothing the kernel should write may pass unwritten
        buf.fill_(float("nan"))
    run.set_input(x)
    run.launch()
    assert int(run.bar.item()) == 0  # the barrier counter is left at 0 for the next launch
    return run.output()


@pytest.mark.skipif(not INTERPRET, reason="the one-product-a-launch form runs under TRITON_INTERPRET=1")
@pytest.mark.parametrize(
    "rows,split,atomic",
    [
        (1, 1, True),  # one row in a block of 16
        (17, 2, True),  # ragged: a second block of rows with one row; K cut in two, summed by atomics
        (5, 2, False),  # the two parts stored apart and summed by the next product's loads
    ],
)
def test_chain_one_product_a_launch_matches_torch(pc, rows: int, split: int, atomic: bool) -> None:
    torch.manual_seed(0)
    chain = pc.Chain.random(layers=2, h=64, device="cpu")
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    got = run_chain(pc, chain, x, pc.Tiling(16, 32, 32, 4, 2, split, atomic))
    ref = pc.chain_ref(x, chain)
    rel = pc.rel_diff(got, ref)
    print(f"rows={rows} split={split} atomic={atomic}: largest relative difference {rel:.2e}")
    assert got.shape == ref.shape and bool(torch.isfinite(got).all())
    assert rel <= TOL


def test_a_tiling_that_does_not_divide_the_products_is_refused(pc) -> None:
    with pytest.raises(ValueError, match=r"does not fit hidden 64: o's K 128 is no multiple of 192"):
        pc.Tiling(16, 32, 64, split=3).validate(64)
    with pytest.raises(ValueError, match=r"powers of 2 from 16"):
        pc.Tiling(8, 32, 32).validate(64)


def test_programs_a_multiprocessor_holds(pc) -> None:
    # an H100's multiprocessor: 64 Ki registers, 228 KiB shared memory, 2048 threads
    h100 = pc.SmLimits(65536, 233472, 2048)
    assert h100.programs(n_regs=128, shared=64 << 10, num_warps=4) == 3  # shared memory: 3 x 65 KiB
    assert h100.programs(n_regs=255, shared=1 << 10, num_warps=4) == 2  # 256 registers a thread
    assert h100.programs(n_regs=32, shared=0, num_warps=4) == 16  # threads: 2048 / 128
    assert h100.programs(n_regs=200, shared=120 << 10, num_warps=4) == 1


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="the persistent form's barriers need compiled kernels")
@pytest.mark.parametrize("rows,split,atomic", [(3, 1, True), (17, 4, True), (40, 2, False)])
def test_persistent_chain_with_grid_barriers_matches_torch(pc, rows: int, split: int, atomic: bool) -> None:
    torch.manual_seed(0)
    chain = pc.Chain.random(layers=3, h=256, device="cuda")
    x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
    got = run_chain(pc, chain, x, pc.Tiling(16 if rows < 32 else 64, 64, 64, 4, 3, split, atomic))
    rel = pc.rel_diff(got, pc.chain_ref(x, chain))
    print(f"rows={rows} split={split} atomic={atomic}: largest relative difference {rel:.2e}")
    assert rel <= TOL
