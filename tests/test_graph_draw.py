"""The draw inside the decode CUDA Graphs (Tuning.graph_sampling): what a replay is given to draw with.
Capturing needs a GPU (tests/test_sampling_engine.py runs the engine so); here each "replay" runs the
captured step eagerly from the same static buffers, as the graph would."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from llmbench.engine.cuda_graph import CUDAGraphRunner
from llmbench.engine.sampler import LOG2E
from llmbench.engine.step_inputs import StepArrays
from llmbench.kernels import sample as draw

V = 64


def _runner(uniform=None) -> tuple[CUDAGraphRunner, torch.Tensor]:
    torch.manual_seed(0)
    table = torch.randn(100, V) * 0.1  # an input id's logits; flat, so that draws stray from the argmax

    def forward(input_ids, positions, meta):  # a graph of the uniform tiling adds 1: which one ran shows
        return table[input_ids] + meta.decode_uniform

    runner = CUDAGraphRunner(
        forward, [2, 4], 4, 32, torch.device("cpu"), uniform=uniform, draw=draw.sample_ref
    )
    for key in runner.keys():
        meta = runner._meta(*key)

        def replay(key=key, meta=meta):
            runner.outputs[key] = runner.step(key[0], meta)

        runner.graphs[key] = SimpleNamespace(replay=replay)
    return runner, table


def _step(ids: torch.Tensor, rows=None) -> StepArrays:
    n = ids.shape[0]
    zeros = np.zeros(n, dtype=np.int64)
    step = StepArrays(
        ids.numpy(), zeros, zeros - 1, np.arange(n + 1, dtype=np.int32), zeros + 1,
        np.zeros((n, 4), dtype=np.int32), np.arange(n), [1] * n,
    )  # fmt: skip
    if rows is not None:
        scale, keys = rows
        step.sample_params = np.stack([scale.numpy(), *np.zeros((3, n), dtype=np.float32)])
        step.sample_keys = keys.numpy()
    return step


def _run(runner: CUDAGraphRunner, ids: torch.Tensor, rows=None, draw_ids: bool = True, uniform: bool = False):
    bucket = runner.load(_step(ids, rows), None, draw=draw_ids)
    logits, got = runner.replay(bucket, ids.shape[0], uniform, draw_ids)
    return logits, got, bucket


def test_a_replay_draws_with_its_step_rows_and_a_greedy_step_after_it_takes_the_argmax() -> None:
    runner, table = _runner()
    ids = torch.tensor([3, 7, 11])
    scale = torch.tensor([LOG2E / 0.6, 0.0, LOG2E / 1.3])  # the middle row greedy
    draws = []
    for keys in (torch.tensor([[5, 6, 7], [10, 11, 12]]), torch.tensor([[8, 6, 9], [40, 41, 42]])):
        logits, got, bucket = _run(runner, ids, (scale, keys))
        assert bucket == 4 and logits.shape == (3, V)
        assert got.tolist() == draw.sample_ref(table[ids], scale, None, keys[0], keys[1]).tolist()
        draws.append(got.tolist())
    argmax = table[ids].argmax(-1).tolist()
    assert draws[0][1] == draws[1][1] == argmax[1]
    assert draws[0] != draws[1] and draws[0] != argmax  # the rows' keys and scales reached the draw
    _, got, _ = _run(runner, ids)  # greedy: the scales left by the last step are zeroed
    assert got.tolist() == argmax
    # a step that samples after the graph (a cut) leaves the graph's unread draw in its cheapest form,
    # and its rows where that sampling reads them
    _, got, _ = _run(runner, ids, (scale, keys), draw_ids=False)
    assert got is None and not runner.inputs[4].t.draw_scale.any()
    params, keys_back = runner.sample_rows(4, 3)
    assert torch.equal(params[0], scale) and torch.equal(keys_back, keys)


def test_a_replay_without_the_draw_gives_logits_only() -> None:
    runner, table = _runner()
    logits, got, bucket = _run(runner, torch.tensor([1, 2]), draw_ids=False)
    assert got is None and bucket == 2
    assert torch.equal(logits, table[torch.tensor([1, 2])])


def test_a_bucket_with_a_uniform_tiling_replays_the_graph_the_step_asks_for() -> None:
    # Bucket 4 takes other tiles for contexts of about one length (two graphs); bucket 2 does not (one).
    runner, table = _runner(uniform=lambda bs: bs == 4)
    assert runner.keys() == [(4, False), (4, True), (2, False)]
    ids = torch.tensor([3, 7, 11])
    for uniform in (False, True):
        logits, _, bucket = _run(runner, ids, draw_ids=False, uniform=uniform)
        assert bucket == 4 and torch.equal(logits, table[ids] + uniform)
    logits, _, bucket = _run(runner, ids[:2], draw_ids=False, uniform=True)
    assert bucket == 2 and torch.equal(logits, table[ids[:2]])  # no such graph: the one tiling there is


def test_filled_rows_take_the_last_samples_from_wherever_they_were_drawn() -> None:
    # Asynchronous scheduling: a row's token is the last step's sample, still on the device. Samples drawn
    # elsewhere (a prefill step's) are brought in; a graph's own draw is read where it left it.
    runner, table = _runner()
    prefill_ids = torch.tensor([9, 40, 17])  # sampled outside the graphs, rows in that step's order
    step = _step(torch.tensor([0, 5, 0]))  # rows 0 and 2 take samples 2 and 0; row 1 keeps its own token
    step.fill_rows, step.fill_src = np.array([0, 2]), np.array([2, 0])
    bucket = runner.load(step, prefill_ids, draw=True)
    logits, got = runner.replay(bucket, 3, draw=True)
    assert torch.equal(logits, table[torch.tensor([17, 5, 9])])
    assert got.data_ptr() == runner.last.data_ptr()  # the draw stays where the next graph reads it
    drawn = got.clone()
    step = _step(torch.tensor([0, 0]))  # the next step: two sequences, in the other order
    step.fill_rows, step.fill_src = np.array([0, 1]), np.array([1, 0])
    runner.last[2:].fill_(99)  # past the rows drawn: never read
    bucket = runner.load(step, got, draw=True)
    logits, _ = runner.replay(bucket, 2, draw=True)
    assert torch.equal(logits, table[drawn[[1, 0]]])
