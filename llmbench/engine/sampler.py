"""Turn the last-position logits of a step's sampling rows into token ids, on the device, for the whole
batch at once: no loop over rows, no launch per row, and no wait for the device.

Every request in the engine has a row in a host table (``add`` / ``forget``): its scale = log2(e) / T
(0 for greedy), top_k, top_p, min_p and the 32-bit key of its seed. A step that samples takes its rows'
columns from that table plus the position of each sampled token (``attach``: two small arrays that
travel in the step's single host-to-device upload, ``StepArrays.sample_params`` / ``sample_keys``). Then:

1. top-k: the k-th largest logit of each row from one ``torch.topk`` with the batch's largest k.
2. top-p and min-p: a per-row threshold search (``kernels/sample_cut.py``), no sort of the vocabulary.
3. the draw: the Gumbel-max race over the tokens at or above the cut, with uniforms hashed from (seed,
   position, token) (``kernels/sample.py``), greedy rows taking the plain argmax in the same kernel.

Which of steps 1-2 run is decided on the host from counts of the requests in the engine (never a wait
for the device); a row without a cut gets -inf, so running a step for another row changes nothing in it.
While no request in the engine samples, a step outside a CUDA Graph is one argmax.

A decode step replayed from a CUDA Graph draws inside the graph when its rows need no cut
(``draws_in_graph``; Tuning.graph_sampling, engine/cuda_graph.py): the draw then costs the host no
launches. A step whose requests ask for a cut samples here, from the graph's logits.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from llmbench.engine.async_scheduling import sampling_rows
from llmbench.engine.sampling_params import SamplingParams
from llmbench.engine.scheduler import ScheduledBatch
from llmbench.engine.sequence import Sequence
from llmbench.engine.step_inputs import StepArrays
from llmbench.kernels import sample as draw
from llmbench.kernels import sample_cut

LOG2E = 1.4426950408889634
SCALE, TOP_K, TOP_P, MIN_P = range(4)  # rows of ``sample_params``


def top_k_floor(logits: torch.Tensor, top_k: torch.Tensor, largest_k: int) -> torch.Tensor:
    """(N,) float32: each row's k-th largest logit, -inf where k is 0, -1 or at least the vocabulary."""
    # logits: (N, V); top_k: (N,) float32 holding integers; largest_k: >= every k < V among the rows.
    V = logits.shape[-1]
    vals = logits.topk(min(largest_k, V), dim=-1).values  # (N, K), largest first
    k = top_k.long()
    kth = vals.gather(1, (k.clamp(1, vals.shape[1]) - 1)[:, None]).squeeze(1).float()
    return torch.where((k > 0) & (k < V), kth, float("-inf"))


class Sampler:
    def __init__(self, device: torch.device, use_triton: bool = False, seed: int = 0) -> None:
        self.device = device
        self.seed = seed
        self._draw = draw.sample if use_triton else draw.sample_ref
        self._cut = sample_cut.cut_threshold if use_triton else sample_cut.cut_threshold_ref
        self._params = np.zeros((4, 64), dtype=np.float32)  # (4, slots): scale, top_k, top_p, min_p
        self._keys = np.zeros(64, dtype=np.int64)  # (slots,) seed keys
        self._slot: dict[str, int] = {}
        self._free = list(range(63, -1, -1))
        self._num_added = 0
        # Over the requests in the engine: how many sample, and which cuts they ask for.
        self._num_sampled = 0
        self._top_k: Counter[int] = Counter()
        self._num_top_p = 0
        self._num_min_p = 0

    # -- the table ----------------------------------------------------------------------------------

    def add(self, request_id: str, params: SamplingParams) -> None:
        if not self._free:
            n = self._keys.shape[0]
            self._params = np.concatenate([self._params, np.zeros_like(self._params)], axis=1)
            self._keys = np.concatenate([self._keys, np.zeros_like(self._keys)])
            self._free = list(range(2 * n - 1, n - 1, -1))
        slot = self._slot[request_id] = self._free.pop()
        seed = params.seed
        if seed is None:  # reproducible runs: the engine's seed and the order requests came in
            seed = (self.seed % 2**32) << 32 | (self._num_added % 2**32)
        self._num_added += 1
        self._keys[slot] = draw.seed_key(seed)
        sampled = not params.greedy
        self._params[:, slot] = (
            LOG2E / params.temperature if sampled else 0.0,
            max(params.top_k, 0),
            params.top_p,
            params.min_p,
        )
        self._count(params, +1)

    def forget(self, request_id: str, params: SamplingParams) -> None:
        slot = self._slot.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)
            self._count(params, -1)

    def _count(self, params: SamplingParams, sign: int) -> None:
        if params.greedy:
            return
        self._num_sampled += sign
        if params.top_k > 0:
            self._top_k[params.top_k] += sign
            if self._top_k[params.top_k] == 0:
                del self._top_k[params.top_k]
        self._num_top_p += sign * (params.top_p < 1.0)
        self._num_min_p += sign * (params.min_p > 0.0)

    @property
    def active(self) -> bool:
        """Whether any request in the engine samples (otherwise every step is an argmax)."""
        return self._num_sampled > 0

    @property
    def draws_in_graph(self) -> bool:
        """Whether a step's draw may be the CUDA Graph's: none of the engine's requests asks for a cut
        (top-k, top-p, min-p), which needs a shape (the batch's largest k) or a kernel the graph has not."""
        return not (self._top_k or self._num_top_p or self._num_min_p)

    def attach(
        self, arrays: StepArrays, batch: ScheduledBatch, sampling: list[Sequence] | None = None
    ) -> None:
        """Put the rows of a step's sampling sequences (``sampling``, else found from ``batch``) into its
        upload; nothing while no request samples."""
        if self.active:
            c = batch.counts()
            arrays.sample_params, arrays.sample_keys = self.rows(
                sampling_rows(batch) if sampling is None else sampling, c.total[c.samples]
            )

    def rows(
        self, seqs: list[Sequence], positions: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Host arrays for a step whose sampling rows are ``seqs`` (before their new tokens are added):
        (4, N) float32 settings and (2, N) int64 seed keys and positions (``positions``: the sequences'
        lengths, when already read)."""
        n = len(seqs)
        slot = self._slot
        slots = np.fromiter((slot[s.request_id] for s in seqs), dtype=np.int64, count=n)
        if positions is None:
            positions = np.fromiter((s.num_tokens for s in seqs), dtype=np.int64, count=n)
        return np.ascontiguousarray(self._params[:, slots]), np.stack([self._keys[slots], positions])

    # -- the step -----------------------------------------------------------------------------------

    def sample(
        self, logits: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """The sampled ids as a (N,) int64 tensor on the logits' device, without waiting for them.

        ``rows``: the device copies of ``rows()``'s arrays; None when no request samples (greedy)."""
        # logits: (N, V) in the model dtype: an upcast copy would hold the same values.
        if rows is None:
            return logits.argmax(dim=-1)
        params, keys = rows  # (4, N) float32, (2, N) int64
        scale = params[SCALE]
        V = logits.shape[-1]
        largest_k = max((k for k in self._top_k if k < V), default=0)
        threshold = top_k_floor(logits, params[TOP_K], largest_k) if largest_k else None
        if self._num_top_p or self._num_min_p:
            threshold = self._cut(
                logits,
                scale,
                threshold,
                params[TOP_P] if self._num_top_p else None,
                params[MIN_P] if self._num_min_p else None,
            )
        return self._draw(logits, scale, threshold, keys[0], keys[1])

    def warm_up(self, vocab_size: int, dtype: torch.dtype) -> None:
        """Compile every Triton variant a step can need (one row and many; with and without each cut)."""
        if self.device.type != "cuda" or self._draw is not draw.sample:
            return
        # A row split over many programs, and a row one program reads whole: rows are read so once
        # they outnumber the programs the draw aims for (SampleConfig); the variants depend on neither
        # the number of rows nor the vocabulary, so a one-block vocabulary stands in for that batch.
        for n, vocab in ((1, vocab_size), (1, min(vocab_size, draw.DEFAULT_CONFIG.block))):
            logits = torch.randn(n, vocab, device=self.device).to(dtype)
            scale = torch.full((n,), LOG2E, device=self.device)
            keys = torch.zeros(n, dtype=torch.int64, device=self.device)
            half = torch.full((n,), 0.5, device=self.device)
            floor = top_k_floor(logits, torch.full((n,), 2.0, device=self.device), 2)
            for cut in (None, floor):
                self._draw(logits, scale, cut, keys, keys)
                for top_p, min_p in ((half, None), (None, half), (half, half)):
                    self._cut(logits, scale, cut, top_p, min_p)
