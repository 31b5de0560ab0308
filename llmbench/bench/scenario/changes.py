"""What a scenario profile changed, in one line a person reads before the run starts.

``profile_changes`` compares the scenario as written (with ``--set`` applied) against the same with the
profile merged in, over the paths the profile sets: the model (and whether the one it runs is a preset
with random weights), the number of requests and the arrivals get their own words, the rest is named.
A path whose value the profile leaves as it was (a ``--set`` said the same) is not listed.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from llmbench.bench.scenario.schema import SWEEP_FRACTIONS, Arrival, Scenario, default_arrival_kind

_MISSING = object()


def arrival_text(arrival: Arrival) -> str:
    """``poisson 24/s``, ``gamma 4/8/s cv 2``, ``concurrency 1/8``, ``sweep 0.25/0.5/0.75x``, ``offline``."""
    kind = arrival.kind
    if kind in ("poisson", "gamma"):
        cv = f" cv {arrival.cv:g}" if arrival.cv else ""
        return f"{kind} {'/'.join(f'{r:g}' for r in arrival.rate or [])}/s{cv}"
    if kind == "concurrency":
        return f"concurrency {'/'.join(str(c) for c in arrival.concurrency or [])}"
    if kind == "sweep":
        return f"sweep {'/'.join(f'{f:g}' for f in arrival.fractions or SWEEP_FRACTIONS)}x"
    return kind


def _leaves(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for key, value in tree.items():
        path = (*prefix, str(key))
        out += _leaves(value, path) if isinstance(value, dict) and value else [path]
    return out


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return _MISSING
        tree = tree[key]
    return tree


def _arrival_before(before: dict[str, Any]) -> str:
    raw = before.get("arrival")
    arrival = raw if isinstance(raw, dict) else {}
    try:
        return arrival_text(
            Arrival.model_validate({"kind": default_arrival_kind(before.get("workload")), **arrival})
        )
    except ValidationError:
        return str(raw)


def profile_changes(
    before: dict[str, Any], after_raw: dict[str, Any], overrides: dict[str, Any], after: Scenario
) -> str:
    """e.g. ``model qwen3-0.6b -> qwen3-tiny (random weights), 300 -> 64 requests, arrival poisson 24/s ->
    sweep 0.25/0.5/0.75x; also warmup, repeats, workload.input_len``; "" when nothing changed."""
    from llmbench.models.presets import PRESETS

    changed = [p for p in _leaves(overrides) if _get(before, p) != _get(after_raw, p)]
    said: list[str] = []
    rest: list[str] = []
    if any(p == ("model",) for p in changed):
        was = _get(before, ("model",))
        was = Scenario.model_fields["model"].default if was is _MISSING else was
        weights = " (random weights)" if after.model in PRESETS else ""
        said.append(f"model {was} -> {after.model}{weights}")
    if any(p == ("workload", "num_requests") for p in changed):
        was = _get(before, ("workload", "num_requests"))
        said.append(f"{'(all)' if was is _MISSING else was} -> {after.workload.num_requests} requests")
    if any(p[0] == "arrival" for p in changed):
        said.append(f"arrival {_arrival_before(before)} -> {arrival_text(after.arrival)}")
    for p in changed:
        if p[0] in ("model", "arrival") or p == ("workload", "num_requests"):
            continue
        name = ".".join(p[:2])  # workload.input_len, not each of its fields
        if name not in rest:
            rest.append(name)
    text = ", ".join(said)
    if rest:
        text += ("; also " if text else "") + ", ".join(rest)
    return text
