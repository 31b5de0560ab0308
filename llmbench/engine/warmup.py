"""Work the model runner does at start-up so that no measured step pays for it: the peak memory of the
largest step (what the KV pool gets is what it leaves), every Triton kernel variant a step can need, and
torch.compile's graphs. Each runs dummy steps on a small pool of its own (or, for torch.compile, on the
real pool, whose shape is guarded on).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from llmbench.engine import kv_cache
from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.sequence import Sequence
from llmbench.engine.step_inputs import build_step
from llmbench.kernels._triton import set_programmatic_launch

if TYPE_CHECKING:
    from llmbench.engine.model_runner import ModelRunner
    from llmbench.engine.step_upload import StepInputs

_DUMMY_PARAMS = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def dummy_inputs(runner: ModelRunner, num_tokens: int, seq_len: int, caches) -> tuple[StepInputs, list]:
    """A prefill batch of ``num_tokens`` tokens in sequences of ``seq_len``, on its own small pool."""
    lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
    seqs = []
    block = 0
    for n in lens:
        s = Sequence(f"dummy{len(seqs)}", [0] * n, _DUMMY_PARAMS, 0.0)
        nb = -(-n // runner.block_size)
        s.block_table = list(range(block, block + nb))
        block += nb
        seqs.append(s)
    if caches is None:
        caches = kv_cache.allocate(
            runner.num_layers,
            block,
            runner.block_size,
            runner.kv_heads,
            runner.head_dim,
            runner.kv_dtype,
            runner.device,
        ).layers
    return runner.to_inputs(build_step(seqs, lens, runner.block_size)), caches


@torch.inference_mode()
def peak_memory(runner: ModelRunner) -> int:
    """Peak bytes of this process for the largest step the scheduler may build."""
    torch.cuda.synchronize(runner.device)
    torch.cuda.reset_peak_memory_stats(runner.device)
    tokens = min(runner.config.max_num_batched_tokens, runner.config.max_num_seqs * runner.max_model_len)
    inputs, caches = dummy_inputs(runner, tokens, min(tokens, runner.max_model_len), None)
    hidden = runner._forward(inputs.input_ids, inputs.positions, inputs.meta, caches)
    rows = min(runner.config.max_num_seqs, hidden.shape[0])
    runner.model.compute_logits(hidden[:rows]).float()  # the peak includes the sampler's float copy
    torch.cuda.synchronize(runner.device)
    peak = torch.cuda.max_memory_allocated(runner.device)
    del inputs, caches, hidden
    torch.cuda.empty_cache()
    return peak


@torch.inference_mode()
def kernel_variants(runner: ModelRunner) -> None:
    """JIT-compile every kernel variant a step can need now, not inside a measured step.

    Attention picks its tile shape from the longest query of the step (powers of two up to 128, and the
    wide tiles past ``Tuning.prefill_narrow_tiles_up_to``) and decode-only steps use the decode kernel: one
    dummy step per case covers them. Each kernel launches with programmatic dependent launch or without by
    its own rows (``Tuning.programmatic_launch_rows``), a variant of its own: the dummy steps run as
    configured and again with it off, since a tile a few rows warm up is also run by steps of many."""
    rows = runner.config.tuning.programmatic_launch_rows
    for programmatic_rows in (rows, 0) if rows else (0,):
        set_programmatic_launch(programmatic_rows)
        _steps_and_splits(runner)
    set_programmatic_launch(rows)


def _steps_and_splits(runner: ModelRunner) -> None:
    lengths = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    narrow = runner.config.tuning.prefill_narrow_tiles_up_to
    if narrow and narrow < min(runner.max_model_len, runner.config.max_num_batched_tokens):
        lengths.append(narrow + 1)  # a query a step can have that takes the wide tiles
    for query_len in lengths:
        n = min(query_len, runner.max_model_len)
        tokens = 2 if n == 1 else n  # two one-token sequences: a decode-shaped step
        inputs, caches = dummy_inputs(runner, tokens, n, None)
        hidden = runner._forward(inputs.input_ids, inputs.positions, inputs.meta, caches)
        runner.model.compute_logits(hidden[inputs.logits_indices])
    if runner.config.attention_backend == "triton":
        _decode_splits(runner)
    torch.cuda.synchronize(runner.device)


@torch.inference_mode()
def _decode_splits(runner: ModelRunner) -> None:
    """The split-KV decode variants: the merge kernel is compiled per power-of-two slice count, and
    which counts a step needs depends on its batch and block-table width (eager decode steps, e.g.
    with CUDA Graphs off or past the largest bucket, would otherwise compile them mid-run); the
    longest-first variants, which large batches take; and a wide batch's tiles, and the tiles for contexts
    of about one length (Tuning.decode_uniform_tiling), where they differ."""
    from llmbench.kernels.decode_config import MAX_SPLITS, default_decode_config
    from llmbench.kernels.kv_layout import by_token
    from llmbench.kernels.triton_decode import decode_attention

    heads = runner.model.model.layers[0].self_attn.num_heads
    dtype = runner.config.torch_dtype
    q = torch.zeros(1, heads, runner.head_dim, dtype=dtype, device=runner.device)
    cache = kv_cache.allocate(
        1, 2, runner.block_size, runner.kv_heads, runner.head_dim, runner.kv_dtype, runner.device
    )
    cache.data.zero_()
    kv = cache.layers[0]
    scales = {"k_scale": kv.k_scale, "v_scale": kv.v_scale}  # None unless the pool is float8
    table = torch.zeros(1, 2, dtype=torch.int32, device=runner.device)
    seq_lens = torch.ones(1, dtype=torch.int32, device=runner.device)
    for num_splits in (1 << i for i in range(MAX_SPLITS.bit_length())):  # 1, 2, 4, ... MAX_SPLITS
        decode_attention(q, kv.k, kv.v, table, seq_lens, 1.0, num_splits=num_splits, **scales)
    longest_first = runner.config.tuning.decode_longest_first
    order = torch.zeros(1, dtype=torch.int64, device=runner.device) if longest_first else None
    if longest_first:  # one slice and several: the count itself is not compiled in, the merge's is above
        for num_splits in (1, 2):
            decode_attention(
                q, kv.k, kv.v, table, seq_lens, 1.0, num_splits=num_splits, order=order, **scales
            )
    layout = (runner.head_dim, dtype, kv.quantised, by_token(kv.v))
    wide = default_decode_config(*layout, wide=True)
    if wide != default_decode_config(*layout):  # a wide batch's own tiles (in one slice)
        decode_attention(
            q, kv.k, kv.v, table, seq_lens, 1.0, num_splits=1, config=wide, order=order, **scales
        )
    uniform = default_decode_config(*layout, uniform=True)
    if runner.config.tuning.decode_uniform_tiling and uniform != default_decode_config(*layout):
        rows_orders = (None,) if order is None else (None, order)
        for num_splits, rows in itertools.product((1, 2), rows_orders):  # batches below wide, of one length
            decode_attention(
                q,
                kv.k,
                kv.v,
                table,
                seq_lens,
                1.0,
                num_splits=num_splits,
                config=uniform,
                order=rows,
                **scales,
            )


@torch.inference_mode()
def compile_steps(runner: ModelRunner) -> None:
    """Compile outside the measured steps, on the real KV pool (its shape is guarded on).

    Sizes 1 and 2 of the token dimension get graphs of their own (Dynamo specialises 0 and 1, and
    marks a size dynamic once it has seen two), so the warm-up runs a prefill, a one-token step and a
    two-token step, first and later layers alike."""
    n = min(64, runner.max_model_len)
    for tokens, seq_len in ((n, n), (2, 1), (1, 1), (n - 1, n - 1), (3, 1)):
        inputs, _ = dummy_inputs(runner, tokens, seq_len, runner.kv_caches)
        runner._forward(inputs.input_ids, inputs.positions, inputs.meta, runner.kv_caches)
