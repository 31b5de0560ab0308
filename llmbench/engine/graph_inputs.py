"""The inputs of one bucket's decode CUDA Graphs: fields of one device byte buffer that a step fills with one
copy.

A graph reads its inputs from tensors at fixed addresses. Here they are the fields of one byte buffer per
bucket (``FIELDS``), and a step writes its values into a pinned host mirror of that buffer with numpy and
sends it in one asynchronous copy: no device copy per field and no tensor made per step. That matters for
small batches, where the host's part of a decode step is most of what the device waits for: every torch
call costs the host microseconds, and making a step's input views and copying each into the graph's
tensors took about a third of a one-sequence decode step's host time.

Padded rows (the bucket's rows past the step's) get their values on the host: no K/V written (slot -1),
one token of context, their own place in the order, no fill, greedy. Their block-table rows are not sent:
they read one token of whatever block their row last held, a block of the pool (allocated zeroed, written
only with finite K/V), and their logits are dropped.

The block tables come last, in rows ``max_blocks`` wide (the graph's stride). A step whose rows are few
enough bytes (``INLINE_TABLE_BYTES``) sends them whole in the same copy; a larger one sends its (n, width)
tables in a second copy, which torch stages through a narrower device buffer.

Two pinned mirrors alternate, so that writing step N+1 never changes the bytes of step N's copy while it may
still be in flight (the engine waits for step N before it writes step N+2; engine/staging.py does the same).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llmbench.engine.staging import ALIGN, TORCH_DTYPES, host_buffer
from llmbench.engine.step_inputs import StepArrays

INLINE_TABLE_BYTES = 64 * 1024  # past this, a step's table rows are cheaper sent at their own width
NO_FILL = -1  # a row of ``fill`` that keeps its own token id

# name, dtype, leading dimension (the bucket's rows are the last one); the block tables follow them.
FIELDS = (
    ("input_ids", np.int64, None),
    ("positions", np.int64, None),
    ("slot_mapping", np.int64, None),
    ("order", np.int64, None),  # the rows in the order the decode kernel takes them
    ("fill", np.int64, None),  # per row: its token's place among the last step's samples, or NO_FILL
    ("logits_rows", np.int64, None),  # the rows that sample, when not every row does
    ("sample_keys", np.int64, 2),  # seed key and position of the sampled token
    ("seq_lens", np.int32, None),
    ("sample_params", np.float32, 4),  # scale, top_k, top_p, min_p (engine/sampler.py)
    ("draw_scale", np.float32, None),  # the graph's draw: the rows' scales, or 0 (argmax) when unread
)
_PAD = {"slot_mapping": -1, "seq_lens": 1, "fill": NO_FILL}  # every other field pads with zeros


@dataclass
class Fields:
    """Views of one buffer's fields (torch tensors on the device, or numpy arrays over a pinned mirror)."""

    input_ids: torch.Tensor | np.ndarray  # (bs,)
    positions: torch.Tensor | np.ndarray  # (bs,)
    slot_mapping: torch.Tensor | np.ndarray  # (bs,)
    order: torch.Tensor | np.ndarray  # (bs,)
    fill: torch.Tensor | np.ndarray  # (bs,)
    logits_rows: torch.Tensor | np.ndarray  # (bs,)
    sample_keys: torch.Tensor | np.ndarray  # (2, bs)
    seq_lens: torch.Tensor | np.ndarray  # (bs,)
    sample_params: torch.Tensor | np.ndarray  # (4, bs)
    draw_scale: torch.Tensor | np.ndarray  # (bs,)
    block_tables: torch.Tensor | np.ndarray  # (bs, max_blocks)


class GraphInputs:
    def __init__(self, bs: int, max_blocks: int, device: torch.device) -> None:
        self.bs = bs
        self.max_blocks = max_blocks
        self.row_bytes = max_blocks * 4
        offsets, at = {}, 0
        for name, dtype, lead in FIELDS:
            offsets[name] = at
            at += _aligned((lead or 1) * bs * np.dtype(dtype).itemsize)
        self.tables_offset = at
        self.nbytes = at + bs * self.row_bytes
        self._offsets = offsets
        self.buffer = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        self.t = Fields(**self._views(self.buffer, torch_views=True))  # what the graphs read
        pin = device.type == "cuda"  # a CPU "device" (tests) needs, and may have, no pinning
        # each mirror: the buffer's bytes, then room for a step's tables at their own width
        self._pinned = [host_buffer(2 * self.nbytes, pin) for _ in range(2)]
        self._pinned_np = [p.numpy() for p in self._pinned]
        self._host = [Fields(**self._views(p[: self.nbytes], torch_views=False)) for p in self._pinned]
        self._identity = np.arange(bs)
        for h in self._host:
            self._pad(h, 0)
        self._padded_from = [0, 0]  # per mirror: the rows from here on hold their padding values
        self._turn = 0
        self._sends: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def _views(self, buf: torch.Tensor, torch_views: bool) -> dict[str, torch.Tensor | np.ndarray]:
        bs = self.bs
        raw = buf if torch_views else buf.numpy()
        out: dict[str, torch.Tensor | np.ndarray] = {}
        for name, dtype, lead in FIELDS:
            shape = (lead, bs) if lead else (bs,)
            out[name] = _field(raw, self._offsets[name], dtype, shape, torch_views)
        out["block_tables"] = _field(raw, self.tables_offset, np.int32, (bs, self.max_blocks), torch_views)
        return out

    def load(self, step: StepArrays, order: np.ndarray | None, draw: bool) -> None:
        """Write ``step`` (a decode step of at most ``bs`` rows) into the graph's buffer.
        ``order``: the rows the decode kernel takes first to last, or None for the batch's order;
        ``draw``: whether the graph's draw is the step's (else it takes the argmax, its cheapest form)."""
        n = len(step.query_lens)
        turn = self._turn
        self._turn ^= 1
        h = self._host[turn]
        h.input_ids[:n] = step.input_ids
        h.positions[:n] = step.positions
        h.slot_mapping[:n] = step.slot_mapping
        h.seq_lens[:n] = step.seq_lens
        h.order[:n] = order if order is not None else self._identity[:n]
        h.fill[:n] = NO_FILL
        if step.fill_rows is not None:
            h.fill[step.fill_rows] = step.fill_src
        if len(step.logits_indices) != n:
            h.logits_rows[: len(step.logits_indices)] = step.logits_indices
        if step.sample_params is not None and step.sample_keys is not None:
            k = step.sample_params.shape[1]
            h.sample_params[:, :k] = step.sample_params
            h.sample_keys[:, :k] = step.sample_keys
            h.sample_params[:, k:n] = 0.0
            h.draw_scale[:k] = step.sample_params[0] if draw else 0.0
            h.draw_scale[k:n] = 0.0
        else:
            h.sample_params[:, :n] = 0.0
            h.draw_scale[:n] = 0.0
        if n < self._padded_from[turn]:  # rows a larger step wrote: pad them again
            self._pad(h, n)
        self._padded_from[turn] = n
        tables = step.block_tables  # (n, width)
        width = tables.shape[1]
        inline = n * self.row_bytes <= INLINE_TABLE_BYTES
        if inline:
            h.block_tables[:n, :width] = tables
        end = self.tables_offset + (n * self.row_bytes if inline else 0)
        dev, host = self._send(turn, end)
        dev.copy_(host, non_blocking=True)
        if not inline:
            compact = np.ascontiguousarray(tables, dtype=np.int32)
            start, end = self.nbytes, self.nbytes + compact.nbytes
            self._pinned_np[turn][start:end] = compact.view(np.uint8).reshape(-1)
            src = self._pinned[turn][start:end].view(torch.int32).view(n, width)
            self.t.block_tables[:n, :width].copy_(src, non_blocking=True)

    def _pad(self, h: Fields, n: int) -> None:
        """Give a mirror's rows from ``n`` on their padding values (module docstring)."""
        for name, _, lead in FIELDS:
            arr = getattr(h, name)
            value = _PAD.get(name, 0)
            if lead:
                arr[:, n:] = value
            else:
                arr[n:] = value
        h.order[n:] = self._identity[n:]

    def _send(self, turn: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The device and host byte ranges a step sends (kept: a view is a torch call each time)."""
        pair = self._sends.get((turn, end))
        if pair is None:
            pair = self._sends[(turn, end)] = (self.buffer[:end], self._pinned[turn][:end])
        return pair


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _field(raw, offset: int, dtype, shape: tuple[int, ...], torch_views: bool):
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    chunk = raw[offset : offset + size]
    if torch_views:
        return chunk.view(TORCH_DTYPES[np.dtype(dtype)]).view(shape)
    return chunk.view(dtype).reshape(shape)
