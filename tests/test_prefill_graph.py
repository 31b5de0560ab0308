"""A step's forward cut at attention (models/piecewise.py) and replayed from CUDA Graphs
(engine/prefill_graph.py, Tuning.prefill_graphs).

On the CPU the pieces run eagerly under the Triton interpreter: they must give the model's own forward's
values and store the same K/V, padded rows storing none. On a GPU the engine replays them and its greedy
tokens must equal transformers' (tests/test_parity.py's fixtures)."""

from __future__ import annotations

import pytest
import torch

from llmbench import LLM, SamplingParams
from llmbench.engine.facts import triton_usable
from llmbench.engine.prefill_graph import PrefillGraphRunner
from llmbench.engine.sequence import Sequence
from llmbench.engine.step_inputs import build_step
from llmbench.models.piecewise import PieceBuffers, PiecewiseForward

from tiny_models import hf_greedy, make_tiny

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 8
pytestmark = pytest.mark.skipif(not triton_usable(DEVICE), reason="needs triton (or its interpreter)")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3")
    hf = make_tiny("qwen3", folder)
    return folder, hf


def _llm(folder, **options) -> LLM:
    return LLM(
        str(folder), block_size=BLOCK, max_model_len=128, dtype="float32", num_kv_blocks=64,
        attention_backend="triton", triton_kernels=True, **options,
    )  # fmt: skip


def _mixed_step(runner):
    """Two decodes, a chunk after 10 cached tokens and a fresh prompt: (the step's inputs, its tokens)."""
    params = SamplingParams(max_tokens=4)
    shapes = [(20, 19), (13, 12), (30, 10), (9, 0)]  # (tokens, of which cached)
    seqs, new, block = [], [], 0
    for i, (n, cached) in enumerate(shapes):
        s = Sequence(f"s{i}", [(7 * i + 3 * j) % 384 for j in range(n)], params, 0.0)
        s.num_computed_tokens = cached
        nb = -(-n // BLOCK)
        s.block_table = list(range(block, block + nb))
        block += nb
        seqs.append(s)
        new.append(n - cached)
    return runner.to_inputs(build_step(seqs, new, BLOCK)), sum(new)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # float8 has no equality on the CPU


@torch.inference_mode()
@pytest.mark.parametrize(
    "padding,kv_dtype", [(0, "auto"), (6, "auto"), (6, "fp8_e4m3")], ids=["exact", "padded", "padded-fp8"]
)
def test_pieces_give_the_forward_values_and_store_the_same_kv(qwen3, padding, kv_dtype):
    # A float8 cache: the pieces' prologue quantises with the layer's scales as the forward's does.
    folder, _ = qwen3
    llm = _llm(folder, kv_cache_dtype=kv_dtype, tuning={"kv_cache_scale": 0.5} if kv_dtype != "auto" else {})
    runner = llm.engine.runner
    inputs, tokens = _mixed_step(runner)
    assert inputs.meta.num_decodes == 2, "the step's decodes go to the decode kernel (mixed_step_decodes)"
    torch.manual_seed(0)
    pool = runner.kv_pool  # the cached tokens' K/V
    pool.copy_(torch.randn(pool.shape).to(pool.dtype))
    start = runner.kv_pool.clone()
    expected = runner.model(inputs.input_ids, inputs.positions, inputs.meta, runner.kv_caches)
    stored = runner.kv_pool.clone()

    runner.kv_pool.copy_(start)
    rows = tokens + padding
    buf = PieceBuffers.allocate(runner.model, rows, runner.device)
    buf.input_ids[:tokens] = inputs.input_ids
    buf.positions[:tokens] = inputs.positions
    buf.slot_mapping[:tokens] = inputs.meta.slot_mapping  # the padded rows keep slot -1
    buf.o.fill_(float("nan"))  # attention must write every real row
    got = PiecewiseForward(runner.model, runner.kv_caches).forward(buf, rows, tokens, inputs.meta)

    assert got.shape == (rows, expected.shape[1])
    if padding:  # the products ran over more rows: the same values up to float32 rounding
        torch.testing.assert_close(got[:tokens], expected, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(got, expected)
    assert _same_bytes(runner.kv_pool, stored), "the pieces stored other K/V than the forward"


class _Eager:
    """Stands in for a captured graph on the CPU: a replay runs the piece again."""

    def __init__(self, run) -> None:
        self.run = run

    def replay(self) -> None:
        self.run()


def _eager_graphs(runner: PrefillGraphRunner) -> None:
    """What ``capture`` leaves, with each piece run eagerly at replay (its output into a fixed tensor)."""
    pieces, buf = runner.pieces, runner.buffers
    last = pieces.num_pieces - 1
    for bucket in runner.buckets:
        hidden = pieces.model.config.hidden_size
        out = runner.outputs[bucket] = torch.empty(bucket, hidden, device=buf.input_ids.device)
        graphs = [_Eager(lambda i=i, b=bucket: pieces.piece(i, buf, b)) for i in range(last)]
        graphs.append(_Eager(lambda b=bucket, out=out: out.copy_(pieces.piece(last, buf, b))))
        runner.graphs[bucket] = graphs


@torch.inference_mode()
def test_a_step_runs_in_the_smallest_bucket_and_its_padded_rows_store_nothing(qwen3):
    # The runner's replay loop: a step's ids, positions and slots copied in, the rows past it given slot -1
    # (a larger step before left real slots there), attention between the pieces, the output cut to the step.
    folder, _ = qwen3
    llm = _llm(folder)
    runner = llm.engine.runner
    inputs, tokens = _mixed_step(runner)
    graphs = PrefillGraphRunner(
        PiecewiseForward(runner.model, runner.kv_caches), [16, tokens + 8, 256], runner.device
    )
    _eager_graphs(graphs)
    assert graphs.bucket_for(tokens) == tokens + 8 and graphs.bucket_for(257) is None
    torch.manual_seed(0)
    runner.kv_pool.copy_(torch.randn_like(runner.kv_pool))
    start = runner.kv_pool.clone()
    expected = runner.model(inputs.input_ids, inputs.positions, inputs.meta, runner.kv_caches)
    stored = runner.kv_pool.clone()

    runner.kv_pool.copy_(start)
    graphs.buffers.slot_mapping.copy_(torch.arange(256))  # what a larger step would have left
    got, bucket = graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
    assert bucket == tokens + 8 and graphs.replays == 1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert _same_bytes(runner.kv_pool, stored), "padded rows stored K/V"


def test_a_model_without_the_fused_prologue_is_refused(qwen3):
    folder, _ = qwen3
    llm = LLM(str(folder), block_size=BLOCK, max_model_len=128, dtype="float32", num_kv_blocks=64,
              attention_backend="sdpa", triton_kernels=False)  # fmt: skip
    runner = llm.engine.runner
    with pytest.raises(ValueError, match="needs the fused attention prologue"):
        PiecewiseForward(runner.model, runner.kv_caches)


@pytest.mark.gpu  # CUDA Graphs need a GPU
@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_prefill_graphs_keep_tokens(tmp_path, arch):
    # Steps of 24 tokens at most: prompts chunked, mixed with decodes, most steps padded to a bucket.
    hf = make_tiny(arch, tmp_path, tie=(arch == "qwen2"))
    prompts = [[(7 * i + 3 * j) % 384 for j in range(1 + (13 * i) % 40)] for i in range(6)]
    expected = [hf_greedy(hf, p, 12) for p in prompts]
    llm = _llm(tmp_path, cuda_graph=True, max_num_batched_tokens=24, tuning={"prefill_graphs": True})
    runner = llm.engine.runner
    assert runner.prefill_graphs is not None and runner.prefill_graphs.buckets == [16, 24]
    runner.kv_pool.fill_(float("nan"))  # a piece that reads a slot no token was written to poisons it
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    got = [o.token_ids for o in llm.generate(prompts, params)]
    assert got == expected
    assert runner.prefill_graphs.replays > 0, "no step ran from the prefill graphs"


@pytest.mark.gpu  # CUDA Graphs need a GPU
def test_prefill_graphs_over_a_float8_cache_give_the_eager_steps_tokens(tmp_path):
    # The first prefill sets the float8 scales eagerly; every later step reads them from memory, so the
    # graphs captured before it see them. Float8 changes the numerics: the reference is the eager engine.
    make_tiny("qwen3", tmp_path)
    prompts = [[(7 * i + 3 * j) % 384 for j in range(1 + (13 * i) % 40)] for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    runs = []
    for graphs in (False, True):
        llm = _llm(
            tmp_path, cuda_graph=True, max_num_batched_tokens=24, kv_cache_dtype="fp8_e4m3",
            tuning={"prefill_graphs": graphs},
        )  # fmt: skip
        runs.append([o.token_ids for o in llm.generate(prompts, params)])
        pieces = llm.engine.runner.prefill_graphs
        assert (pieces is not None and pieces.replays > 0) == graphs
    assert runs[0] == runs[1]
