"""The ``workload:`` section of a scenario: which requests are sent (a source and its token lengths)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from llmbench.bench.scenario.fields import FieldIssue, StrictModel

Dist = Literal["fixed", "uniform", "normal", "lognormal"]
MAX_LENGTH = 10_000_000  # tokens: past any model's context; a typo's length would exhaust memory first
MAX_REQUESTS = 1_000_000  # a workload is built in memory before it runs
# Arrivals spread over more than this (a trace's span, num_requests / rate) are, far more often, a unit
# mistake (a trace in milliseconds, a rate meant per minute or hour) than a benchmark anyone plans.
MAX_ARRIVAL_SPAN_S = 6 * 3600.0
# A trace's time_scale: 86400 reads a trace written in days as seconds; past it, a typo (and a span whose
# number would overflow).
MAX_TIME_SCALE = 86_400
_DIST_FIELDS: dict[str, tuple[set[str], set[str]]] = {  # dist -> (required, optional)
    "fixed": ({"value"}, set()),
    "uniform": ({"min", "max"}, set()),
    "normal": ({"mean", "std"}, {"min", "max"}),
    "lognormal": ({"mean", "std"}, {"min", "max"}),
}


MEAN_SHIFT = 0.1  # a declared mean the clipping moves by more than this share of it is an error


def _phi(x: float) -> float:  # the standard normal's distribution function
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _pdf(x: float) -> float:  # its density (0 at an infinite bound)
    return math.exp(-x * x / 2) / math.sqrt(2 * math.pi) if math.isfinite(x) else 0.0


def lognormal_params(mean: float, std: float) -> tuple[float, float]:
    """(mu, sigma) of the underlying normal for a lognormal with this mean and std."""
    sigma2 = math.log1p((std / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def clipped_mean(dist: str, mean: float, std: float, low: float, high: float) -> float:
    """The mean of a normal or lognormal (given the mean and std of the lengths themselves) clipped to
    [low, high], in closed form: low below it, high above it, the distribution's own values between."""
    if dist == "normal":
        a, b = (low - mean) / std, (high - mean) / std
        pa, pb = _phi(a), _phi(b)
        return (
            low * pa
            + (high * (1 - pb) if math.isfinite(high) else 0.0)
            + mean * (pb - pa)
            + std * (_pdf(a) - _pdf(b))
        )
    mu, sigma = lognormal_params(mean, std)
    la = (math.log(low) - mu) / sigma
    lb = (math.log(high) - mu) / sigma if math.isfinite(high) else math.inf
    inside = mean * (_phi(lb - sigma) - _phi(la - sigma))  # E[X; low < X < high]
    return low * _phi(la) + (high * (1 - _phi(lb)) if math.isfinite(high) else 0.0) + inside


class LengthDist(StrictModel):
    """A token-length distribution. A bare integer means ``{dist: fixed, value: N}``: exactly N tokens.

    normal and lognormal take the mean and standard deviation of the lengths themselves (lognormal's
    underlying mu/sigma are derived), are rounded to integers and clipped to [min, max] (min defaults
    to 1).
    """

    dist: Dist = "fixed"
    value: int | None = Field(default=None, ge=1, le=MAX_LENGTH)
    min: int | None = Field(default=None, ge=1, le=MAX_LENGTH)
    max: int | None = Field(default=None, ge=1, le=MAX_LENGTH)
    # The mean of lengths of at least one token is at least 1; a spread past the longest length is no
    # spread any clipping keeps (and with these bounds lognormal_params cannot overflow).
    mean: float | None = Field(default=None, ge=1, le=MAX_LENGTH)
    std: float | None = Field(default=None, ge=0, le=MAX_LENGTH)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, int) and not isinstance(data, bool):
            return {"dist": "fixed", "value": data}
        if not isinstance(data, dict | LengthDist):
            raise ValueError(
                f"expected a length in tokens (an integer) or a distribution such as {{dist: uniform, min: "
                f"100, max: 1024}}; dists: {', '.join(get_args(Dist))}; got {data!r}"
            )
        return data

    @model_validator(mode="after")
    def _fields_fit_dist(self) -> LengthDist:
        self._fields_fit("dist", *_DIST_FIELDS[self.dist])
        if self.min is not None and self.max is not None and self.max < self.min:
            raise FieldIssue("max", f"must be >= min ({self.min}), got {self.max}")
        if self.dist in ("normal", "lognormal") and self.mean is not None and self.std:
            low, high = self.min or 1, self.max or math.inf
            got = clipped_mean(self.dist, self.mean, self.std, low, high)
            if abs(got - self.mean) > MEAN_SHIFT * self.mean:
                bounds = f"[{low}, {self.max}]" if self.max is not None else f"at least {low}"
                raise FieldIssue(
                    "mean",
                    f"lengths {self.dist} with mean {self.mean:g} and std {self.std:g}, clipped to {bounds}, "
                    f"have a mean of {got:g}, not {self.mean:g}: narrow std, widen min/max, or declare the "
                    "mean the clipped lengths should have",
                )
        return self

    @property
    def upper_bound(self) -> int | None:
        """The largest length this distribution can produce, when it is bounded."""
        if self.dist == "fixed":
            return self.value
        return self.max


class TokenRange(StrictModel):
    """Where random prompt token ids are drawn from: uniformly in [min, max) (max excluded)."""

    min: int = Field(default=0, ge=0)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _not_empty(self) -> TokenRange:
        if self.max <= self.min:
            raise FieldIssue(
                "max", f"must be > min ({self.min}): ids are drawn from [min, max), got {self.max}"
            )
        return self


Source = Literal["synthetic", "shared_prefix", "file", "sharegpt", "trace"]
_SOURCE_FIELDS: dict[str, tuple[set[str], set[str]]] = {  # source -> (required, optional)
    "synthetic": ({"num_requests", "input_len", "output_len"}, {"token_ids"}),
    "shared_prefix": (
        {"num_requests", "input_len", "output_len", "prefix_len", "num_prefixes"},
        {"token_ids"},
    ),
    "file": ({"path"}, {"num_requests", "output_len"}),
    "sharegpt": ({"path"}, {"num_requests", "output_len"}),
    "trace": ({"path"}, {"num_requests", "time_scale"}),
}


class Workload(StrictModel):
    """Which requests are sent.

    - synthetic: random token ids, ``input_len`` / ``output_len`` distributions (exact token counts).
    - shared_prefix: ``num_prefixes`` random prefixes of ``prefix_len`` tokens; each request is one of
      them (round-robin) followed by a unique suffix of ``input_len`` tokens. ``num_prefixes`` must be
      below ``num_requests``, or no two requests would share a prefix.
    - file: JSON records, one object each (``prompt`` text or token-id list, or ``prompt_token_ids``;
      optional ``output_len``) as JSONL or, in a ``.json`` file, one JSON array; or plain text (one
      prompt a line). ``output_len`` fills in what a record does not say.
    - sharegpt: ShareGPT-style JSON, one list of conversations (or JSONL, one a line, in a ``.jsonl``
      file): ``conversations`` of ``from``/``value`` turns, or ``messages`` of ``role``/``content``;
      prompt = first user turn followed by a reply, output length = that reply's token count unless
      ``output_len`` is given. Conversations the backend's context cannot hold, with an empty prompt or
      no such pair are skipped, and a warning counts them.
    - trace: CSV, JSONL or (in a ``.json`` file) one JSON array of rows with ``timestamp`` (seconds,
      >= 0, never decreasing), ``input_len``, ``output_len``. With no ``arrival`` kind given, the
      scenario's arrivals are ``trace``: the rows are sent at their own times (offsets from the first
      timestamp), stretched by ``time_scale``; another arrival kind sends the trace's lengths on its
      own schedule, and refuses ``time_scale``.
    Files are read as UTF-8 text.
    ``num_requests``: file and sharegpt draw that many records at random (seeded), in shuffled passes
    over the file, so asking for more than it holds repeats records; trace replays its first
    ``num_requests`` rows, and asking for more rows than it has is an error (timestamps cannot repeat).
    Without it, every record, in file order.
    ``token_ids`` (synthetic, shared_prefix): the range random prompt ids come from; default: the whole
    vocabulary.
    """

    source: Source = "synthetic"
    num_requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    input_len: LengthDist | None = None
    output_len: LengthDist | None = None
    prefix_len: LengthDist | None = None
    num_prefixes: int | None = Field(default=None, ge=1)
    path: str | None = None
    time_scale: float | None = Field(default=None, gt=0, le=MAX_TIME_SCALE)
    token_ids: TokenRange | None = None

    @model_validator(mode="after")
    def _fields_fit_source(self) -> Workload:
        self._fields_fit("source", *_SOURCE_FIELDS[self.source])
        if self.path is not None and Path(self.path).is_dir():
            raise FieldIssue("path", f"{self.path} is a folder; give the file in it to read")
        if self.path is not None and not Path(self.path).is_file():
            raise FieldIssue("path", f"file not found: {self.path}")
        if self.source == "shared_prefix" and self.num_prefixes >= self.num_requests:
            raise FieldIssue(
                "num_prefixes",
                f"must be below num_requests ({self.num_requests}): request i takes prefix i % num_prefixes, "
                f"so with {self.num_prefixes} prefixes no two requests would share one",
            )
        return self
