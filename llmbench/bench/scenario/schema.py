"""The scenario schema: one YAML file = model + engine options + workload + arrivals + run settings.

Every model forbids unknown keys. A cross-field problem is raised as :class:`FieldIssue`, which names the
offending field, so the error printed to the user carries the full path (``workload.input_len.max``),
not just the enclosing mapping. Loading, ``extends:``, ``--set`` and profiles live in ``loader.py``;
this module only says what a valid scenario is.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from llmbench.bench.scenario.backend_registry import BACKENDS, BackendOptions, unsupported
from llmbench.bench.scenario.fields import FieldIssue, FieldIssues, StrictModel
from llmbench.bench.scenario.workload_schema import MAX_ARRIVAL_SPAN_S, MAX_REQUESTS, Workload

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # matched whole (re.fullmatch): no trailing newline
MAX_NAME = 100  # characters: with its time and variant, a results folder stays well inside a file name's 255
MAX_REPEATS = 1000  # each repeat runs the whole workload again; past this a count is a typo, not a plan
MAX_CPU_THREADS = 1024  # torch intra-op threads: past the cores of any one machine


def _one_point_each(values: list[float] | list[int], what: str) -> None:
    """A sweep's points are its values: one given twice would run twice under one label, and its two runs
    would be taken for repeats."""
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise ValueError(f"each {what} names one point of the sweep; {twice[0]:g} is given twice")


def rate_span_problem(rate: float, num_requests: int) -> str | None:
    """Why ``num_requests`` arrivals at ``rate`` requests/s are refused: their expected span,
    num_requests / rate, is past ``MAX_ARRIVAL_SPAN_S``; None when it is not."""
    span = num_requests / rate
    if span <= MAX_ARRIVAL_SPAN_S:
        return None
    return (
        f"{num_requests} requests at {rate:g} requests/s arrive over about {span / 3600:,.1f} hours "
        f"(num_requests / rate), past the limit of {MAX_ARRIVAL_SPAN_S / 3600:g} hours; a rate is requests "
        "per second"
    )


ArrivalKind = Literal["offline", "poisson", "gamma", "concurrency", "trace", "sweep"]
SWEEP_FRACTIONS = (0.25, 0.5, 0.75)  # a sweep's default: light, moderate and heavy load for the machine
# Fractions above 1 overload the machine on purpose; one past this is taken for a typo (50 for 0.5).
MAX_SWEEP_FRACTION = 4.0
MIN_TELEMETRY_PERIOD_MS = 10.0  # a sampler any faster would take a CPU from the run it measures
# A gamma arrival's cv, where its gaps (shape 1/cv^2, arrivals.py) stay finite and non-zero: cv=0.01 is
# all but evenly spaced and cv=100 all but every request at once; past them, 1/cv^2 overflows or vanishes.
MIN_CV, MAX_CV = 0.01, 100


def default_arrival_kind(workload: Any) -> ArrivalKind:
    """The arrival kind of a scenario that names none, from its (unvalidated) ``workload``: a trace's own
    times for a trace source (sending its rows all at once would drop what it records), else offline."""
    source = workload.get("source") if isinstance(workload, dict) else getattr(workload, "source", None)
    return "trace" if source == "trace" else "offline"


class Arrival(StrictModel):
    """When requests enter.

    offline: all at t=0. poisson: exponential gaps at ``rate`` requests/s. gamma: gamma-distributed gaps
    at ``rate`` with coefficient of variation ``cv`` (cv=1 is Poisson, >1 burstier, <1 smoother).
    concurrency: keep ``concurrency`` requests in flight. trace: the workload trace's own times.
    ``max_concurrency`` caps a schedule (offline, poisson, gamma, trace) as vLLM's ``--max-concurrency`` does: a
    due request waits in the client while that many are in flight, and its latencies count from when it
    is handed over (the wait is its client queue).
    Without a kind: trace for a trace source, offline for any other (``default_arrival_kind``).
    A list of rates or concurrencies is a sweep: one run per point.
    sweep: a load that fits the machine, found by measuring it: first ``sync`` (one request at a time),
    then ``throughput`` (all at once: the requests/s it reaches is the machine's capacity), then Poisson
    points at ``fractions`` of that capacity (default 0.25, 0.5, 0.75; above 1 overloads it on purpose,
    at most 4), labelled ``poisson@0.5x``.
    Rate arrivals spread over more than ``MAX_ARRIVAL_SPAN_S`` (num_requests / rate) are refused.
    """

    kind: ArrivalKind = "offline"
    rate: list[float] | None = None
    cv: float | None = Field(default=None, ge=MIN_CV, le=MAX_CV)
    concurrency: list[int] | None = None
    fractions: list[float] | None = None
    max_concurrency: int | None = Field(default=None, ge=1)

    @field_validator("rate", "concurrency", "fractions", mode="before")
    @classmethod
    def _scalar_to_list(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return [value]
        if isinstance(value, (str, bool, dict)):
            what = "an integer" if info.field_name == "concurrency" else "a number"
            raise ValueError(f"expected {what} or a list of them (a sweep), got {value!r}")
        if isinstance(value, list) and any(isinstance(v, bool) for v in value):
            raise ValueError(f"expected numbers, got {value!r}")
        return value

    @field_validator("rate")
    @classmethod
    def _positive_rates(cls, value: list[float] | None) -> list[float] | None:
        if value is not None:
            if not value:
                raise ValueError("needs at least one rate")
            bad = [r for r in value if not r > 0]
            if bad:
                raise ValueError(f"rates are requests per second and must be > 0, got {bad[0]}")
            _one_point_each(value, "rate")
        return value

    @field_validator("concurrency")
    @classmethod
    def _positive_concurrency(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if not value:
                raise ValueError("needs at least one concurrency")
            bad = [c for c in value if c < 1]
            if bad:
                raise ValueError(f"concurrency is requests in flight and must be >= 1, got {bad[0]}")
            _one_point_each(value, "concurrency")
        return value

    @field_validator("fractions")
    @classmethod
    def _positive_fractions(cls, value: list[float] | None) -> list[float] | None:
        if value is not None:
            if not value:
                raise ValueError("needs at least one fraction")
            bad = [f for f in value if not f > 0]
            if bad:
                raise ValueError(f"fractions of the measured capacity must be > 0, got {bad[0]}")
            bad = [f for f in value if f > MAX_SWEEP_FRACTION]
            if bad:
                raise ValueError(
                    f"fractions of the measured capacity must be at most {MAX_SWEEP_FRACTION:g} (above 1 "
                    f"overloads the machine on purpose; 0.5 is half its capacity, not 50), got {bad[0]:g}"
                )
            _one_point_each(value, "fraction")
        return value

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> Arrival:
        needs, optional = {
            "offline": (set(), {"max_concurrency"}),
            "poisson": ({"rate"}, {"max_concurrency"}),
            "gamma": ({"rate", "cv"}, {"max_concurrency"}),
            "concurrency": ({"concurrency"}, set()),
            "trace": (set(), {"max_concurrency"}),
            "sweep": (set(), {"fractions"}),
        }[self.kind]
        self._fields_fit("kind", needs, optional)
        return self

    @property
    def points(self) -> list[dict[str, Any]]:
        """The sweep: one arrival setting per run point (a sweep's fractions get their rate when run)."""
        cap = {"max_concurrency": self.max_concurrency} if self.max_concurrency else {}
        if self.kind in ("poisson", "gamma"):
            return [
                {"kind": self.kind, "rate": r, **({"cv": self.cv} if self.cv else {}), **cap}
                for r in self.rate or []
            ]
        if self.kind == "concurrency":
            return [{"kind": "concurrency", "concurrency": c} for c in self.concurrency or []]
        if self.kind == "sweep":
            return [
                {"kind": "concurrency", "concurrency": 1, "sweep": "sync"},
                {"kind": "offline", "sweep": "throughput"},
                *(
                    {"kind": "poisson", "sweep": "fraction", "fraction": f}
                    for f in self.fractions or SWEEP_FRACTIONS
                ),
            ]
        return [{"kind": self.kind, **cap}]

    @property
    def warmup_point(self) -> dict[str, Any]:
        """The arrivals warm-up runs under: the first point's, or a sweep's all-at-once point (every batch
        shape the sweep will see)."""
        points = self.points
        return points[1] if self.kind == "sweep" else points[0]


class Sampling(StrictModel):
    """How requests sample (SamplingParams says what each setting means). ``seed``: each sampled request's
    seed comes from the request id and this base (default: the scenario's ``seed``, which also draws the
    workload); ``engine``: requests carry none and the engine derives them from its own seed."""

    temperature: float = Field(default=0.0, ge=0)  # 0 = greedy, so variants' outputs can be compared
    top_k: int = Field(default=0, ge=-1)  # -1 and 0: no cut
    top_p: float = Field(default=1.0, gt=0, le=1)
    min_p: float = Field(default=0.0, ge=0, le=1)
    seed: int | Literal["engine"] | None = None
    ignore_eos: bool = True  # lengths follow output_len exactly (random weights would stop anywhere)


class SLO(StrictModel):
    """Service-level objectives; a request counts towards goodput when it meets every one given."""

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)

    @property
    def defined(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))


class Telemetry(StrictModel):
    enabled: bool = True
    period_ms: float = 200.0  # telemetry.py says why 200

    @field_validator("period_ms")
    @classmethod
    def _not_too_often(cls, value: float) -> float:
        if not value >= MIN_TELEMETRY_PERIOD_MS:
            raise ValueError(
                f"must be at least {MIN_TELEMETRY_PERIOD_MS:g} ms (a faster sampler takes a CPU from the run "
                f"it measures; default 200), got {value:g}"
            )
        return value


class Profile(StrictModel):
    """Overrides applied on top of the file: automatically ``when`` the run lands on a cpu/gpu, or by name."""

    when: Literal["cpu", "gpu", "manual"] = "manual"
    description: str = ""
    overrides: dict[str, Any] = Field(default_factory=dict)


class Scenario(StrictModel):
    name: str
    description: str = ""
    model: str = "qwen3-0.6b"
    backend: str | list[str] = "engine"  # who serves the workload; a list is compared by `ablate`
    backend_options: BackendOptions = Field(default_factory=BackendOptions)
    engine: dict[str, Any] = Field(default_factory=dict)  # EngineConfig's options, ``tuning`` nested
    workload: Workload
    arrival: Arrival = Field(default_factory=Arrival)
    sampling: Sampling = Field(default_factory=Sampling)
    # warm-up requests, run first (Arrival.warmup_point), discarded
    warmup: int = Field(default=0, ge=0, le=MAX_REQUESTS)
    repeats: int = Field(default=1, ge=1, le=MAX_REPEATS)
    seed: int = Field(default=0, ge=0)  # draws the workload (numpy wants a non-negative seed)
    slo: SLO = Field(default_factory=SLO)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    max_duration_s: float | None = Field(default=None, gt=0)  # per repeat; the rest is aborted
    # torch intra-op threads; None: torch's default
    cpu_threads: int | None = Field(default=None, ge=1, le=MAX_CPU_THREADS)
    profiles: dict[str, Profile] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                f"must be letters, digits, '.', '_' or '-' (it names a results folder), got {value!r}"
            )
        if len(value) > MAX_NAME:
            raise ValueError(f"at most {MAX_NAME} characters (it names a results folder), got {len(value)}")
        return value

    @field_validator("backend")
    @classmethod
    def _known_backends(cls, value: str | list[str]) -> str | list[str]:
        names = [value] if isinstance(value, str) else value
        if not names:
            raise ValueError(f"needs at least one backend; supported: {', '.join(BACKENDS)}")
        for name in names:
            if name not in BACKENDS:
                raise ValueError(unsupported(name))
        if len(set(names)) != len(names):
            raise ValueError(f"a backend is named twice: {', '.join(names)}")
        return value

    @property
    def backends(self) -> list[str]:
        """The backends named, in order (one for ``run``; several are compared by ``ablate``)."""
        return [self.backend] if isinstance(self.backend, str) else list(self.backend)

    @field_validator("engine")
    @classmethod
    def _valid_engine_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Types, ranges and choices of every option, checked by the engine itself; whether they can
        apply on the machine is the engine's to say when the run starts (before anything is written)."""
        from llmbench.engine.config import check_options

        _, problems = check_options(value)
        if problems:
            raise FieldIssues([(p.path, p.message) for p in problems])
        return value

    @model_validator(mode="before")
    @classmethod
    def _arrival_kind_by_default(cls, data: Any) -> Any:
        """An arrival without a kind (none at all, or one that leaves ``kind`` out) gets the workload's
        default (``default_arrival_kind``): decided here, once, so the resolved scenario says it."""
        if not isinstance(data, dict):
            return data
        arrival = data.get("arrival", {})
        if isinstance(arrival, dict) and "kind" not in arrival:
            return {**data, "arrival": {**arrival, "kind": default_arrival_kind(data.get("workload"))}}
        return data

    @model_validator(mode="after")
    def _workload_fits_arrival(self) -> Scenario:
        # Trace times exist only in a trace, so kind 'trace' needs that source; a trace under another kind
        # is its lengths on that kind's schedule, and time_scale, which stretches the times, has no effect.
        if self.arrival.kind == "trace" and self.workload.source != "trace":
            raise FieldIssue(
                "arrival", "kind 'trace' replays a trace's times: it needs workload.source 'trace'"
            )
        if self.workload.time_scale is not None and self.arrival.kind != "trace":
            raise FieldIssue(
                "workload.time_scale",
                "stretches the trace's timestamps, which only arrival.kind 'trace' replays; with "
                f"arrival.kind '{self.arrival.kind}' it would change nothing (drop it, or leave arrival.kind "
                "to its default, 'trace')",
            )
        if self.arrival.kind in ("poisson", "gamma") and self.workload.num_requests is not None:
            # (without num_requests a file's record count sets it: arrival_offsets checks it then)
            for rate in self.arrival.rate or []:
                if problem := rate_span_problem(rate, self.workload.num_requests):
                    raise FieldIssue("arrival.rate", problem)
        for name in self.backends:
            required = BACKENDS[name].required_option
            if required is not None and getattr(self.backend_options, name) is None:
                field, what = required
                raise FieldIssue(
                    f"backend_options.{name}.{field}",
                    f"required for backend '{name}'" + (f" ({what})" if what else ""),
                )
        return self
