"""The communicators (llmbench/distributed/) and the fused decode (models/fused_decode.py) in one process.

The fused one-shot communicator runs here over a group of one rank in ordinary memory (``over(None, ...)``):
its kernels run under the Triton interpreter with no peers, so what is checked is the path through the
layers, the buffer handles and the rule on buffers. The kernels with emulated peers are test_kernels.py's;
several ranks over gloo, test_tensor_parallel.py's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmbench.distributed import PartialBuffer, Product, make_communicator, single_rank
from llmbench.distributed import communicator as communicator_mod
from llmbench.distributed.fused import FusedOneShot, Layout
from llmbench.distributed.one_shot import OneShotAllReduce
from llmbench.engine import warmup
from llmbench.engine.config import EngineConfig
from llmbench.engine.facts import triton_usable
from llmbench.engine.model_runner import ModelRunner
from llmbench.engine.resolve import resolve_here
from llmbench.kernels.allreduce_norm import MAX_ROWS
from llmbench.layers.attention.backends import make_backend
from llmbench.layers.linear import LinearBase
from llmbench.layers.parallel import TPGroup
from llmbench.models.fused_decode import (
    AFTER_MLP,
    EMBEDDING,
    DecodePlan,
    FusedDecode,
    fuse_decode,
)
from llmbench.models.llama import BuildOptions, LlamaForCausalLM
from llmbench.models.presets import PRESETS
from llmbench.models.registry import resolve_model

from tiny_models import make_tiny

CPU = torch.device("cpu")
needs_triton = pytest.mark.skipif(not triton_usable("cpu"), reason="the fused kernels need Triton")


def test_the_one_shot_all_reduce_takes_what_fits_and_hands_the_rest_to_torch_distributed(monkeypatch):
    comm = OneShotAllReduce.over(None, torch.float32, CPU, max_bytes=8 * 4)  # messages of up to 8 values
    assert comm.all_reduce(torch.ones(3, 4)).equal(torch.ones(3, 4))  # one rank: the sum is its own
    comm.size = 2  # as rank 0 of two, each rank holding the same x
    monkeypatch.setattr(comm, "_one_shot", lambda x: x * 2)
    through_torch: list[int] = []
    monkeypatch.setattr(communicator_mod.dist, "all_reduce", lambda x, group: through_torch.append(x.numel()))
    assert torch.equal(comm.all_reduce(torch.ones(2, 4)), torch.full((2, 4), 2.0)) and through_torch == []
    large, half, strided = torch.ones(3, 4), torch.ones(2, 2, dtype=torch.float16), torch.ones(4, 2).t()
    for x in (large, half, strided):  # too many values, another dtype, not contiguous
        assert comm.all_reduce(x) is x  # summed in place by torch.distributed
    assert through_torch == [12, 4, 8]


def test_a_partial_buffer_is_a_handle_on_one_slot_for_what_the_fused_kernel_takes():
    comm = FusedOneShot.over(None, torch.float32, CPU, max_bytes=64 * 4)
    buf = comm.partial_buffer(1, 3, 16, torch.float32)
    assert isinstance(buf, PartialBuffer) and buf.slot == 1 and buf.tensor.shape == (3, 16)
    buf.tensor.fill_(7.0)
    assert comm.slots[1][:48].eq(7.0).all() and not comm.slots[0].any() and not comm.slots[2].any()
    assert comm.partial_buffer(0, MAX_ROWS + 1, 4, torch.float32) is None  # more rows than the kernel's
    assert comm.partial_buffer(0, 1, 65, torch.float32) is None  # more values than a slot holds
    assert comm.partial_buffer(0, 1, 16, torch.float16) is None  # not the buffer's dtype
    with pytest.raises(ValueError, match=r"Unsupported slot 3\. Supported: \[0, 1, 2\]"):
        comm.partial_buffer(3, 1, 16, torch.float32)
    assert single_rank().partial_buffer(0, 1, 16, torch.float32) is None  # offers no fused operations


@needs_triton
def test_no_buffer_serves_two_reductions_in_a_row():
    """A rank writes a buffer again only after every peer has read it, which it knows once it has passed
    another reduction since (each waits for every rank): the same buffer twice in a row is refused."""
    comm = FusedOneShot.over(None, torch.float32, CPU, max_bytes=64 * 4, fuse_matmul=True)
    weight = torch.ones(16)

    def reduce(slot: int) -> None:
        buf = comm.partial_buffer(slot, 1, 16, torch.float32)
        assert buf is not None
        buf.tensor.normal_()
        comm.all_reduce_norm(buf, None, weight, 1e-6)

    def product(buffer: int) -> None:
        comm.product_all_reduce(Product(torch.randn(1, 8), torch.randn(16, 8), None, False), buffer, None)

    reduce(2), product(0), product(1), reduce(0), reduce(1), reduce(0)
    with pytest.raises(RuntimeError, match="slot 0 reduced twice in a row"):
        reduce(0)
    product(0)
    with pytest.raises(RuntimeError, match="receive buffer 0 reduced twice in a row"):
        product(0)


def test_make_communicator_refuses_what_cannot_be_built():
    group = object()  # never reached: each case fails on its arguments
    cases = [
        (("mpi", False, False), r"Unsupported all-reduce: 'mpi'\. Supported: \['nccl', 'gloo', 'symm_mem'\]"),
        (("symm_mem", False, True), "fuse_matmul builds on fuse_norm"),
        (("nccl", True, False), r"the fused all-reduce needs the one-shot all-reduce \('symm_mem'\)"),
    ]
    for (kind, fuse_norm, fuse_matmul), message in cases:
        with pytest.raises(ValueError, match=message):
            make_communicator(kind, group, torch.float32, CPU, fuse_norm=fuse_norm, fuse_matmul=fuse_matmul)


def test_the_decode_plan_reads_the_resolved_fusion():
    # the fusions go on the one-row form only; more rows take the tensor-core products unfused
    assert DecodePlan.of(8, "all") == DecodePlan(skinny_rows=8, silu_rows=1, norm_rows=1)
    assert DecodePlan.of(8, "silu") == DecodePlan(skinny_rows=8, silu_rows=1, norm_rows=0)
    assert DecodePlan.of(1, "all") == DecodePlan(skinny_rows=1, silu_rows=1, norm_rows=1)
    assert DecodePlan.of(0, "none") == DecodePlan()
    assert DecodePlan.of(1, "none") == DecodePlan(skinny_rows=1)
    with pytest.raises(ValueError, match=r"Unsupported skinny_fusion: 'auto'\. Supported: \['all', "):
        DecodePlan.of(1, "auto")  # resolve decides "auto": the plan only reads


def _on_meta(layers: int) -> LlamaForCausalLM:
    cfg = dataclasses.replace(PRESETS["qwen3-tiny"].config, num_hidden_layers=layers)
    with torch.device("meta"):
        return LlamaForCausalLM(cfg, BuildOptions(make_backend("torch", 0), 64, TPGroup()))


@pytest.mark.parametrize("layers", [1, 2, 5])
def test_the_seams_buffers_alternate_within_and_across_forwards(layers):
    model = _on_meta(layers)
    fused = fuse_decode(model, DecodePlan.of(1, "silu"), single_rank())
    assert isinstance(fused, FusedDecode) and fused.rows == 1
    assert all(m.skinny_rows == 1 for m in model.modules() if isinstance(m, LinearBase))
    forward = [fused.first.buffer] + [s.buffer for pair in fused.seams for s in pair]
    assert len(forward) == 1 + 2 * layers and forward[0] == EMBEDDING and forward[-1] == AFTER_MLP
    two = forward + forward
    assert all(a != b for a, b in zip(two, two[1:], strict=False)), two
    assert fused.seams[-1][1].next is None and fused.seams[-1][1].norm is model.model.norm


def test_nothing_to_fuse_leaves_the_model_and_both_norm_fusions_are_refused():
    model = _on_meta(1)
    assert fuse_decode(model, DecodePlan.of(1, "none"), single_rank()) is model
    assert model.model.layers[0].self_attn.qkv_proj.skinny_rows == 1  # the skinny kernel all the same
    with pytest.raises(ValueError, match="the norms go on the next product's loads .* not both"):
        FusedDecode(
            model, DecodePlan.of(1, "all"), FusedOneShot.over(None, torch.float32, CPU, max_bytes=256)
        )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fused")
    make_tiny("qwen3", folder)
    return folder


def _runner(folder, fusion: str, comm) -> ModelRunner:
    """A model runner on the CPU whose linear layers take the skinny kernels up to 8 rows, with ``comm``."""
    options = dict(device="cpu", dtype="float32", attention_backend="torch", triton_kernels=True)
    options |= dict(num_kv_blocks=16, block_size=8, max_model_len=64)
    config = resolve_here(
        EngineConfig.from_options(
            str(folder), **options, tuning={"skinny_matmul_rows": 8, "skinny_fusion": fusion}
        )
    )
    model_config, _ = resolve_model(str(folder))
    return ModelRunner(config, model_config, folder, config.max_model_len, comm)


def _empty_marks(t: torch.Tensor) -> torch.Tensor:
    return (t == 0) & torch.signbit(t)


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize(
    "fusion,fused_one_shot,fuse_matmul",
    [("all", False, False), ("silu", False, False), ("silu", True, False), ("silu", True, True)],
    ids=["norms-on-loads", "silu", "one-shot+norm", "one-shot+norm+product"],
)
def test_the_fused_decode_gives_the_models_output(tiny, fusion, fused_one_shot, fuse_matmul):
    """Decode-sized steps (1 and 3 rows) through the fused seams against the model's own forward (the same
    skinny kernels, nothing fused), float32; over the fused one-shot communicator, each seam's partial sums
    go through its buffers (the last through the MLP's: a receive buffer for one row with the product
    fused, a slot otherwise), and the receive buffers are left empty."""
    comm = (
        FusedOneShot.over(None, torch.float32, CPU, max_bytes=1 << 16, fuse_matmul=fuse_matmul)
        if fused_one_shot
        else single_rank()
    )
    runner = _runner(tiny, fusion, comm)
    assert isinstance(runner.runnable, FusedDecode)
    for rows in (1, 3, 1):
        inputs, caches = warmup.dummy_inputs(runner, rows, 1, None)  # `rows` sequences of one token
        args = (inputs.input_ids, inputs.positions, inputs.meta, caches)
        got, want = runner.runnable(*args), runner.model(*args)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        if fused_one_shot:
            product = fuse_matmul and rows == 1
            assert comm._last == ("receive buffer" if product else "slot", AFTER_MLP)
    if fuse_matmul:
        receive = comm.buffer[Layout.of(comm.capacity, 1, torch.float32, True).receive_at :]
        assert receive.numel() == 2 * comm.capacity and _empty_marks(receive).all(), (
            "a receive buffer was left written"
        )
