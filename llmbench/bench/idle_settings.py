"""Settings a run was given that change nothing, or that the engine cannot keep, said before it starts:
each a warning, stored with the results (an ablation's variants refuse such a value instead:
bench/ablation/checks.py)."""

from __future__ import annotations

from llmbench.bench.scenario.backend_registry import BACKENDS
from llmbench.bench.scenario.loader import ResolvedScenario
from llmbench.bench.workload_fits import budget_warning, longest_request
from llmbench.engine.sampling_params import GREEDY_BELOW, greedy_ignores


def idle_settings(resolved: ResolvedScenario, config: object | None, in_ablation: bool) -> list[str]:
    """The warnings: prompts past the step budget without chunked prefill (``config``: the engine's resolved
    options, None for a peer backend), sampling settings a greedy draw ignores, options of a backend that
    does not serve the run (an ablation's variants share the scenario's options for every backend), a
    telemetry period with telemetry off."""
    scenario = resolved.scenario
    out = []
    longest = longest_request(resolved)
    if config is not None and longest is not None and (budget := budget_warning(config, longest)):
        out.append(budget)
    if ignored := greedy_ignores(scenario.sampling.model_dump()):
        out.append(
            f"{', '.join(f'sampling.{x}' for x in ignored)} {'changes' if len(ignored) == 1 else 'change'} "
            f"nothing: a temperature below {GREEDY_BELOW:g} draws greedily (set sampling.temperature >= "
            f"{GREEDY_BELOW:g} to sample)"
        )
    given = scenario.backend_options.model_fields_set  # a backend's options default when not given
    unused = [name for name in BACKENDS if name in given and name not in scenario.backends]
    if unused and not in_ablation:
        out.append(
            f"backend_options.{', backend_options.'.join(unused)} set, but backend {scenario.backends[0]!r} "
            f"serves the run: {'they change' if len(unused) > 1 else 'it changes'} nothing here"
        )
    if not scenario.telemetry.enabled and "period_ms" in scenario.telemetry.model_fields_set:
        out.append(
            f"telemetry.period_ms={scenario.telemetry.period_ms:g} set, but telemetry.enabled is false: it changes nothing"
        )
    return out
