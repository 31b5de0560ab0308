"""A request as the engine tracks it: tokens, how many have KV in the cache, its blocks and timings."""

from __future__ import annotations

import enum

from llmbench.engine.outputs import RequestOutput
from llmbench.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
        stop_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.max_len = self.num_prompt_tokens + params.max_tokens  # its length when it ends by max_tokens
        self.stop_ids = frozenset() if params.ignore_eos else stop_ids  # ids that end it (the model's EOS)
        self.arrival_time = arrival_time
        self.status = SequenceStatus.WAITING
        # Tokens whose K/V are in the cache; the rest of token_ids is still to be computed.
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # served by the prefix cache at first scheduling
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # hash chain of the full blocks, filled lazily
        self.num_committed_blocks = 0  # leading blocks registered in the prefix cache
        self.token_times: list[float] = []
        self.first_scheduled_time: float | None = None
        self.finish_time: float | None = None
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        # Asynchronous scheduling: where the placeholder of a sampled-but-unread token sits in
        # token_ids, and its row among the sampled ids on the device.
        self.pending_pos: int | None = None
        self.pending_src: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def to_output(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.token_ids[: self.num_prompt_tokens],
            token_ids=self.output_token_ids,
            token_times=list(self.token_times),
            arrival_time=self.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            finish_time=self.finish_time,
            finish_reason=self.finish_reason,
            num_cached_tokens=self.num_cached_tokens,
            num_preemptions=self.num_preemptions,
        )
