"""A step's host arrays to the device: its token ids, positions and the attention metadata the kernels read.

What the host can decide from the batch alone it decides here, so that no kernel has to: which rows the
decode kernel takes (every row of a decode step; a mixed step's leading decodes with
Tuning.mixed_step_decodes), whether it takes them longest first (Tuning.decode_longest_first, where the
order pays: a sort on the device cannot be captured in a CUDA Graph), and whether a decode batch gets the
tiles for contexts of about one length (Tuning.decode_uniform_tiling). Every array then goes to the device
in one copy (engine/staging.py), and the rows that take their token from the previous step's samples
(asynchronous scheduling) get it there, on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llmbench.engine.ranges import phase
from llmbench.engine.resolve import ResolvedConfig
from llmbench.engine.staging import Staging
from llmbench.engine.step_inputs import StepArrays
from llmbench.kernels import decode_config
from llmbench.kernels.kv_layout import by_token
from llmbench.layers.attention.kv import LayerKV
from llmbench.layers.attention.metadata import AttentionMetadata, leading_decodes


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # (N,) rows of the flat batch whose logits are sampled
    sample_rows: tuple[torch.Tensor, torch.Tensor] | None = None  # StepArrays.sample_params, sample_keys


class StepUploader:
    def __init__(self, config: ResolvedConfig, device: torch.device, kv_heads: int, head_dim: int) -> None:
        self.tuning = config.tuning
        self.device = device
        self.dtype = config.torch_dtype
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.kv: LayerKV | None = None  # a layer's cache, once the pool exists: its layout picks tiles
        self._staging = Staging(device, separate=config.torch_compile)
        self._uniform_tiles: dict[int, bool] = {}  # batch size: whether its one-length tiles differ

    def upload(self, step: StepArrays, last_ids: torch.Tensor | None) -> StepInputs:
        """The step's inputs on the device; ``last_ids``: the last step's samples, for the rows that take
        their token from them (``step.fill_rows``)."""
        decodes = self._decode_rows(step)
        ordered = self._orders(decodes)
        with phase("build_inputs"):
            arrays = self._host_arrays(step, decodes if ordered else 0, last_ids)
        with phase("copy_to_device"):
            return self._upload(step, arrays, ordered, decodes, last_ids)

    def _host_arrays(
        self, step: StepArrays, ordered_rows: int, last_ids: torch.Tensor | None
    ) -> list[np.ndarray]:
        arrays = [
            step.input_ids,
            step.positions,
            step.slot_mapping,
            step.query_start_loc,
            step.seq_lens.astype(np.int32),
            step.block_tables,
            step.logits_indices,
        ]
        if step.fill_rows is not None:
            assert step.fill_src is not None and last_ids is not None, "a fill needs the last samples"
            arrays += [step.fill_rows, step.fill_src]
        if step.sample_params is not None and step.sample_keys is not None:
            arrays += [step.sample_params, step.sample_keys]
        if ordered_rows:  # last: the decode rows by context length, longest first (ties in batch order)
            arrays.append(longest_first(step.seq_lens, ordered_rows))
        return arrays

    def _decode_rows(self, step: StepArrays) -> int:
        """The step's rows that the decode kernel takes: all of a decode-only step; a mixed step's leading
        decodes (the scheduler puts its running sequences first) with Tuning.mixed_step_decodes; else none."""
        lens = step.query_lens
        if max(lens) == 1:
            return len(lens)
        return leading_decodes(lens) if self.tuning.mixed_step_decodes else 0

    def _orders(self, decodes: int) -> bool:
        """Whether the step's decode attention takes its ``decodes`` rows longest first
        (Tuning.decode_longest_first): a batch large enough for the order to pay, decided and sorted here,
        on the host, which knows the lengths (a sort on the device cannot be captured in a CUDA Graph)."""
        return decodes > 0 and self.tuning.decode_longest_first and self.order_pays(decodes)

    def decode_order(self, step: StepArrays) -> np.ndarray | None:
        """A decode-only step's rows longest first (ties in batch order) where that pays, else None."""
        n = len(step.query_lens)
        return longest_first(step.seq_lens, n) if self._orders(n) else None

    def order_pays(self, batch: int) -> bool:
        """Whether a decode batch of this size takes its rows longest first (where that pays)."""
        return decode_config.order_pays(batch, self.kv_heads, self.device)

    def uniform(self, step: StepArrays) -> bool:
        """Whether the step's decode attention takes the tiles for contexts of about one length
        (Tuning.decode_uniform_tiling): a decode-only batch of such contexts, at a size where they differ."""
        return (
            self.tuning.decode_uniform_tiling
            and max(step.query_lens) == 1
            and self.uniform_differs(len(step.query_lens))
            and decode_config.is_uniform(int(step.seq_lens.min()), int(step.seq_lens.max()))
        )

    def uniform_differs(self, batch: int) -> bool:
        """Whether a decode batch of this size has tiles of its own for one-length contexts; the cache's
        layout is fixed for the run, so the answer is kept per batch size."""
        differs = self._uniform_tiles.get(batch)
        if differs is None:
            kv = self.kv
            assert kv is not None, "the tiles depend on the KV pool's layout: set kv once it exists"
            differs = self._uniform_tiles[batch] = decode_config.uniform_tiling_differs(
                batch, self.kv_heads, self.head_dim, self.dtype, kv.quantised, by_token(kv.v),
                self.device,
            )  # fmt: skip
        return differs

    def _upload(
        self,
        step: StepArrays,
        arrays: list[np.ndarray],
        ordered: bool,
        decodes: int,
        last_ids: torch.Tensor | None,
    ) -> StepInputs:
        fill = step.fill_rows is not None
        sampled = step.sample_params is not None and step.sample_keys is not None
        if self.device.type == "cuda":
            tensors = self._staging.upload(arrays)  # one host-to-device copy for all of them
        else:
            tensors = [torch.from_numpy(a) for a in arrays]
            if fill:  # filled in place below: leave the step's own array alone
                tensors[0] = tensors[0].clone()
        order = tensors.pop() if ordered else None
        input_ids, positions, slots, query_start, seq_lens, tables, logits_indices = tensors[:7]
        if fill:
            assert last_ids is not None
            input_ids[tensors[7]] = last_ids[tensors[8]]
        sample_rows = (tensors[-2], tensors[-1]) if sampled else None
        meta = AttentionMetadata(
            slot_mapping=slots,
            query_start_loc=query_start,
            seq_lens=seq_lens,
            block_tables=tables,
            max_query_len=max(step.query_lens),
            max_seq_len=int(step.seq_lens.max()),
            query_lens_cpu=step.query_lens,
            seq_lens_cpu=step.seq_lens.tolist(),
            decode_order=order,
            decode_uniform=self.uniform(step),
            num_decodes=decodes,
        )
        return StepInputs(input_ids, positions, meta, logits_indices, sample_rows)


def longest_first(seq_lens: np.ndarray, rows: int) -> np.ndarray:
    """The first ``rows`` rows by context length, longest first (ties in batch order)."""
    return np.argsort(-seq_lens[:rows], kind="stable")
