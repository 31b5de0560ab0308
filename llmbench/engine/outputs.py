"""What the engine hands back: per-step statistics, token events and finished requests.

All times are host ``time.perf_counter()`` seconds, taken when the value became known to the host
(a token's time is read after its id was copied back from the device). The bench layer turns these into
metrics; the engine computes none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from pathlib import Path

    from llmbench.engine.model_runner import ModelRunner
    from llmbench.engine.resolve import ResolvedConfig
    from llmbench.engine.work import RankWeights
    from llmbench.models.config import ModelConfig


class TokenEvent(NamedTuple):
    request_id: str
    token_id: int
    time: float


@dataclass
class StepStats:
    step: int
    kind: str  # "prefill" | "decode" | "mixed"
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    graph_bucket: int | None  # CUDA Graph batch bucket replayed, None when eager
    graph_padding: int  # padded slots in that bucket
    kv_blocks_used: int
    kv_blocks_free: int
    prefix_cache_hit_tokens: (
        int  # prompt tokens served from the prefix cache by sequences first scheduled now
    )
    num_preemptions: int
    start_time: float
    end_time: float
    # What the step computed, summed over its sequences (the bench layer's derived figures count from these).
    num_logits_rows: int = 0  # rows whose logits were computed: the sequences that sample in this step
    # causal (query, key) pairs: a sequence with c tokens already in the cache and q new ones has
    # q*c + q(q+1)/2 (a decode: its context length)
    attention_pairs: int = 0
    context_tokens: int = 0  # keys each sequence attends over after the step (cached + new), summed
    # What happened in the step's time (engine/step_counters.py): what a slow step is explained by. Under
    # asynchronous scheduling from the delivery of the step before to this one's (the span its duration
    # covers); otherwise during the ``step()`` call that returned these stats.
    triton_compiles: int = 0
    graph_captures: int = 0
    recompiles: int = 0  # torch.compile graphs built
    memory_growth: int = 0  # bytes: device memory in use on CUDA, resident set on a CPU
    gc_time: float = 0.0  # seconds in Python's garbage collector
    # Seconds the host waited for the step's sampled ids with nothing else to do (with asynchronous
    # scheduling, after launching the next step): a step whose host waits is bound by the device, one
    # whose host never waits by the host's own work.
    device_wait: float = 0.0
    # What kept more work out of the step: "kv_blocks", "max_num_seqs", "max_num_batched_tokens",
    # "static_batch" or "none" (engine/scheduler.py)
    batch_limit: str = "none"

    @property
    def duration(self) -> float:
        return self.end_time - self.start_time


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens only
    token_times: list[float]  # one host time per generated token
    arrival_time: float
    first_scheduled_time: float | None
    finish_time: float | None
    finish_reason: str | None  # "length" | "stop" | "abort"
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first scheduling
    num_preemptions: int = 0
    text: str | None = None


@dataclass
class StepOutput:
    stats: StepStats
    tokens: list[TokenEvent] = field(default_factory=list)
    finished: list[RequestOutput] = field(default_factory=list)


@dataclass
class StartupStats:
    """One-off costs, kept apart from steady state."""

    load_time: float = 0.0
    weights_bytes: int = 0
    kv_num_blocks: int = 0
    kv_block_bytes: int = 0
    kv_cache_bytes: int = 0
    compile_time: float = 0.0
    kernel_warmup_time: float = 0.0  # JIT of every Triton kernel variant a step can need
    graph_capture_time: float = 0.0
    graph_memory_bytes: int = 0
    graph_buckets: list[int] = field(default_factory=list)
    all_reduce: str = ""  # tp > 1: "nccl", "gloo" or "symm_mem" (one-shot for small messages, NCCL above)
    all_reduce_norm: bool = False  # tp > 1: decode's all-reduces done with the norm after them (tp_fuse_norm)
    all_reduce_matmul: bool = False  # and with the product before them (tp_fuse_matmul)
    recompiles: int = 0  # torch.compile graphs built after the warm-up (kept current while the engine runs)
    kv_cache_dtype: str = ""  # what the KV pool holds: the model dtype's name, or "fp8_e4m3" / "fp8_e5m2"
    kv_bytes_per_token: int = 0  # KV bytes of one token on this rank (all layers, K and V)
    kv_capacity_tokens: int = 0  # tokens the KV pool holds: kv_num_blocks * block_size


@dataclass(frozen=True)
class ModelInfo:
    """The model as the engine runs it: what the bench layer's derived figures and results need."""

    name: str
    architecture: str
    num_params: int
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype: str
    weight_bytes: int
    kv_bytes_per_token: int  # in the KV pool's element type (a float8 cache's: one byte an element)
    max_model_len: int
    rank_weights: RankWeights | None = None  # rank 0's parameters by kind (every rank holds the same shapes)
    # the folder the weights were read from (a cached hub id's snapshot, whose name is its revision); None:
    # a preset's random weights
    folder: str | None = None

    @classmethod
    def of(
        cls, config: ResolvedConfig, model_config: ModelConfig, runner: ModelRunner, folder: Path | None
    ) -> ModelInfo:
        return cls(
            name=config.model,
            folder=None if folder is None else str(folder.resolve()),
            architecture=model_config.architecture,
            num_params=model_config.num_params(),
            num_layers=model_config.num_hidden_layers,
            hidden_size=model_config.hidden_size,
            num_heads=model_config.num_attention_heads,
            num_kv_heads=model_config.num_key_value_heads,
            head_dim=model_config.head_dim,
            vocab_size=model_config.vocab_size,
            dtype=config.dtype,
            weight_bytes=runner.startup.weights_bytes,
            kv_bytes_per_token=model_config.kv_bytes_per_token(runner.kv_dtype.itemsize),
            max_model_len=config.max_model_len,
            rank_weights=runner.rank_weights,
        )
