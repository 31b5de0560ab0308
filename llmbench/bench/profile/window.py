"""Which measured engine steps ``llmbench profile`` records, decided step by step while the run goes on.

The window opens at the first measured step (after the warm-up requests, and after the engine's own
start-up: compilation, kernel warm-up, CUDA Graph capture) of the first sweep point, or with
``reference_repeat`` at the first step of that point's last repeat, and closes once it
holds at least twice ``steps_per_kind`` steps and every kind of step seen so far (prefill, decode, mixed)
has ``steps_per_kind`` of them, or after ``WINDOW_CAP`` times that many steps, or when the point's
requests are all served. Kinds that show up only later are not in it; kinds with fewer steps than asked
are named in the profile's notes.

With ``reference_repeat`` the steps before the window (the point's earlier repeats, run untraced) are the
reference the traced ones are compared with: the profiler's own cost falls on the host, so a step that the
host holds up runs slower traced, and the summary says by how much.

With ``slow_steps`` the profiler keeps recording until the run ends, in chunks of ``chunk`` steps; a chunk
is written out when it holds steps of the window or a slow step, and dropped otherwise.

A traced step is slow when it took over ``factor`` times the running median of the traced steps of its kind
before it (from ``MIN_STEPS_OF_KIND`` of them on): the profiler slows every traced step, so an untraced
step is no measure of a traced one (against the reference repeat, a kind that tracing slows by more than
``factor`` would be slow whole). The run's own ``slow`` flag (steps.parquet) is judged once the repeat is
over, against the median of the whole repeat; the window must decide as it records, so the two can
differ on steps near the threshold and on a kind's first steps, and without ``slow_steps`` the traced
repeat's steps after the window run untraced, which puts the run's median below the traced steps'.

The window talks to the engine only through ``start_trace``/``stop_trace`` between steps (and
``has_unfinished`` once the run is over); each recorded chunk is one trace file per rank,
``trace-steps<first>-<last>-rank<r>.json.gz``. ``record()`` is what the analysis needs to pair the trace's
step ranges with the engine's step statistics. A trace's step range is one ``step()`` call, and a call is
described by the step whose work it launched: under asynchronous scheduling a call launches the next step
while it delivers the one before, so its record waits for the next call's statistics (a prompt's forward
is in the call before the one that returns its first token).
A chunk full after such a call stays open for one call more, the one that delivers its last step: that
call's range ends the trace but belongs to no chunk (the step it launched is delivered after the trace,
and absorbs the cost of writing it), so every call of a chunk is described. The run's last call launches
no step ("idle"); only an interrupted run leaves a call's step undelivered ("unrecorded").
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from llmbench.bench.slow_steps import MIN_STEPS_OF_KIND, SLOW_FACTOR, causes_of
from llmbench.interrupts import held_interrupts

WINDOW_CAP = 6  # at most this many times steps_per_kind steps in the window
SLOW_CHUNK = 16  # steps per chunk when recording around slow steps


class _Observed:
    """The engine as the driver sees it, with every ``step()`` reported to the window."""

    def __init__(self, engine: Any, window: ProfileWindow) -> None:
        self._engine = engine
        self._window = window

    def step(self) -> Any:
        self._window.before_step(self._engine)
        start = time.perf_counter()
        out = self._engine.step()
        self._window.after_step(self._engine, out.stats, time.perf_counter() - start)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class ProfileWindow:
    def __init__(
        self,
        folder: Path,
        steps_per_kind: int,
        slow_steps: bool = False,
        factor: float = SLOW_FACTOR,
        chunk: int = SLOW_CHUNK,
        reference_repeat: bool = False,
    ) -> None:
        if steps_per_kind < 1:
            raise ValueError("steps_per_kind must be at least 1")
        self.folder = Path(folder)
        self.steps_per_kind = steps_per_kind
        self.slow_steps = slow_steps
        self.factor = factor
        self.chunk_len = chunk
        self.calls: list[dict[str, Any]] = []  # every step recorded, in order
        self.chunks: list[dict[str, Any]] = []  # every chunk written: its file and its calls
        self.counts: dict[str, int] = {}  # window steps per kind
        self.window_done = False
        self.closed = False
        self._open: int | None = None  # index in ``calls`` where the open chunk starts
        self._seen: dict[str, list[tuple[float, int]]] = {}  # (duration, tokens) of the traced steps, by kind
        self._armed = not reference_repeat  # whether the window may open (the reference repeat is over)
        self.repeat_traced = False  # whether the profiler ran during the repeat under way
        self.reference: dict[str, list[float]] = {}  # engine step times of the untraced steps before it
        # ... and how long the host waited on the device in each of them (device_wait)
        self.reference_waits: dict[str, list[float]] = {}
        self._launches_ahead = False  # asynchronous scheduling: a call's work is the next call's step
        self._pending: dict[str, Any] | None = None  # such a call's record, until that step is delivered

    def observe(self, engine: Any) -> _Observed:
        self._launches_ahead = bool(getattr(getattr(engine, "config", None), "async_scheduling", False))
        return _Observed(engine, self)

    def _wanted(self) -> bool:
        return self._armed and not self.closed and (self.slow_steps or not self.window_done)

    def begin_repeat(self, point: int, repeat: int, last: bool) -> None:
        """A repeat of a sweep point starts: the first point's last one is where the window may open."""
        if point == 0 and last:
            self._armed = True
        self.repeat_traced = self._open is not None  # a chunk left open by the last repeat goes on

    def before_step(self, engine: Any) -> None:
        if self._open is None and self._wanted():
            engine.start_trace()
            self._open = len(self.calls)
        self.repeat_traced = self.repeat_traced or self._open is not None

    def after_step(self, engine: Any, stats: Any, call_time: float) -> None:
        if stats.kind != "idle" and self._open is not None:  # delivered while the profiler recorded
            tokens = stats.num_prefill_tokens + stats.num_decode_tokens
            self._seen.setdefault(stats.kind, []).append((stats.duration, tokens))
        if self._open is None:
            if not self._armed and stats.kind != "idle":
                self.reference.setdefault(stats.kind, []).append(stats.duration)
                self.reference_waits.setdefault(stats.kind, []).append(stats.device_wait)
            return
        pending, self._pending = self._pending, None
        if pending is not None:  # the step the call before launched is delivered now
            self._describe(pending, stats)
            if self._full():  # this call only delivered the chunk's last step: the trace's tail, no member
                self._close(engine)
                return
        # the whole step() call, what the trace's step range covers; the chunk's first pays for the start
        record = {"call": len(self.calls), "call_time": call_time, "first": len(self.calls) == self._open}
        self.calls.append(record)
        if self._launches_ahead:
            self._pending = record  # the chunk stays open until its step is delivered, by the next call
        else:
            self._describe(record, stats)
            if self._full():
                self._close(engine)

    def _full(self) -> bool:
        """Whether the open chunk holds all it should: the window's steps, or ``chunk_len`` calls."""
        if not self.slow_steps:
            return self.window_done
        return self._open is not None and len(self.calls) - self._open >= self.chunk_len

    def _describe(self, record: dict[str, Any], stats: Any) -> None:
        """Fill a call's record with the statistics of the step it launched; count it into the window."""
        in_window = not self.window_done and stats.kind != "idle"
        record.update(
            step=stats.step,
            kind=stats.kind,
            num_seqs=stats.num_seqs,
            prefill_tokens=stats.num_prefill_tokens,
            decode_tokens=stats.num_decode_tokens,
            graph_bucket=stats.graph_bucket,
            engine_time=stats.duration,  # the engine's step time: until its tokens reached the host
            window=in_window,
            **self._slow(stats, record.pop("first")),
        )
        if in_window:
            self.counts[stats.kind] = self.counts.get(stats.kind, 0) + 1
            recorded = sum(self.counts.values())
            # at least twice the steps asked, so that a second kind has had its chance to show up
            enough = recorded >= 2 * self.steps_per_kind and all(
                n >= self.steps_per_kind for n in self.counts.values()
            )
            self.window_done = enough or recorded >= WINDOW_CAP * self.steps_per_kind

    def _slow(self, stats: Any, first_of_chunk: bool) -> dict[str, Any]:
        """Whether a step is slow against the running median of the traced steps of its kind, and why."""
        seen = self._seen.get(stats.kind, [])
        if stats.kind == "idle" or len(seen) < MIN_STEPS_OF_KIND:
            return {"slow": False, "causes": []}
        median = statistics.median(d for d, _ in seen)
        if median <= 0 or stats.duration <= self.factor * median:
            return {"slow": False, "causes": []}
        tokens = statistics.median(n for _, n in seen)
        causes = [c for c in causes_of(stats, median, tokens) if c != "unexplained"]
        if first_of_chunk and self.slow_steps:
            causes.append("trace start")
        return {"slow": True, "ratio": stats.duration / median, "causes": causes or ["unexplained"]}

    def _close(self, engine: Any) -> None:
        """End the open chunk: write it if it holds window or slow steps, else drop it."""
        start, self._open = self._open, None
        if start is None:
            return
        if self._pending is not None:  # the run ended after this call: it launched no step, or was cut off
            self._pending.pop("first")
            self._pending.update(
                step=None, kind="unrecorded" if engine.has_unfinished() else "idle", num_seqs=0,
                prefill_tokens=0, decode_tokens=0, graph_bucket=None, engine_time=None, window=False,
                slow=False, causes=[],
            )  # fmt: skip
            self._pending = None
        members = self.calls[start:]
        keep = any(c["window"] or c["slow"] for c in members)
        if not keep or not members:
            engine.stop_trace(None)
            del self.calls[start:]
            return
        steps = [c["step"] for c in members if c["step"] is not None]
        name = f"trace-steps{min(steps)}-{max(steps)}-rank{{rank}}.json.gz"
        # A trace cut short is no trace: an interrupt waits for it to be written, and for the chunk to be
        # recorded (a trace on disk that the record does not name is lost to the profile).
        with held_interrupts():
            engine.stop_trace(str(self.folder / name))
            self.chunks.append({"file": name, "calls": [c["call"] for c in members]})

    def end_of_run(self, engine: Any) -> None:
        """The sweep point is over (or was interrupted): write what is open, record nothing more; the end
        of a reference repeat changes nothing."""
        if not self._armed:
            return
        self._close(engine)
        self.window_done = True
        self.closed = True

    def record(self) -> dict[str, Any]:
        return {
            "steps_per_kind": self.steps_per_kind,
            "slow_steps": self.slow_steps,
            "slow_factor": self.factor,
            "window_counts": dict(self.counts),
            "calls": self.calls,
            "chunks": self.chunks,
            "reference": self.reference,
            "reference_waits": self.reference_waits,
        }
