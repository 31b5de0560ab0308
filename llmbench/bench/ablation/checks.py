"""Whether an ablation's variants can run, checked before anything runs: each variant's values (valid
whatever the machine), what this machine can run, and the workload each must serve; and, when one cannot
run here, which toggles this scenario can flip here instead."""

from __future__ import annotations

from pydantic import ValidationError

from llmbench.bench.ablation.plan import SAMPLING, BackendVariant, Toggle, Variant, plan
from llmbench.bench.errors import BenchError
from llmbench.bench.scenario.errors import problem_lines
from llmbench.bench.scenario.loader import ResolvedScenario
from llmbench.bench.scenario.schema import Sampling


def _variant_options(resolved: ResolvedScenario, variant: Variant) -> tuple[dict, dict]:
    """The variant's engine options (the scenario's, with its own) and its sampling settings."""
    from llmbench.engine.config import with_option

    options = dict(resolved.scenario.engine)
    for name, value in variant.options.items():
        if not name.startswith(SAMPLING):
            options = with_option(options, name, value)
    sampling = {k.removeprefix(SAMPLING): v for k, v in variant.options.items() if k.startswith(SAMPLING)}
    return options, {**resolved.scenario.sampling.model_dump(), **sampling}


def value_problem(resolved: ResolvedScenario, variant: Variant | BackendVariant) -> str | None:
    """What is wrong with the variant's values themselves (a negative temperature, a block size that is not
    a number), whatever machine would run them; None when they are valid."""
    from llmbench.engine.config import ConfigError, EngineConfig

    if isinstance(variant, BackendVariant):
        return None
    options, sampling = _variant_options(resolved, variant)
    try:
        EngineConfig.from_options(resolved.scenario.model, **options)
        Sampling.model_validate(sampling)
    except ConfigError as exc:
        return str(exc)
    except ValidationError as exc:
        return problem_lines(exc, ("sampling",))[0]
    return _greedy_problem(variant, sampling)


def _greedy_problem(variant: Variant, sampling: dict) -> str | None:
    """A sampling setting the variant sets that the scenario's greedy draw ignores: the variant would run
    as the baseline does under another name. (A variant that sets its temperature too is a cell of a
    design that varies the temperature: the greedy one is the other cells' reference.)"""
    from llmbench.engine.sampling_params import GREEDY_BELOW, greedy_ignores

    own = {k.removeprefix(SAMPLING) for k in variant.options if k.startswith(SAMPLING)}
    idle = [x for x in greedy_ignores(sampling) if x.partition("=")[0] in own - {"temperature"}]
    if "temperature" in own:
        return None
    if not idle:
        return None
    return (
        f"{', '.join(f'sampling.{x}' for x in idle)} {'changes' if len(idle) == 1 else 'change'} nothing at "
        f"temperature {sampling.get('temperature', 0):g}, which draws greedily (below {GREEDY_BELOW:g}): "
        "toggle sampling.temperature too, or set one to sample at (--set sampling.temperature=0.6)"
    )


def config_problem(resolved: ResolvedScenario, variant: Variant | BackendVariant) -> str | None:
    """The engine's (or the peer backend's) objection to this variant, if any: its values (``value_problem``),
    what this machine can run, or the workload it must serve."""
    from llmbench.engine.config import ConfigError, EngineConfig
    from llmbench.engine.resolve import resolve_here

    sc = resolved.scenario
    if isinstance(variant, BackendVariant):
        from llmbench.bench.backends import backend_problem

        return backend_problem(sc.model_copy(update={"backend": variant.backend}))
    if invalid := value_problem(resolved, variant):
        return invalid
    from llmbench.models.errors import ModelError
    from llmbench.models.registry import check_model_files

    try:
        config = resolve_here(EngineConfig.from_options(sc.model, **_variant_options(resolved, variant)[0]))
        check_model_files(sc.model)  # a checkpoint every variant would fail to load: before any starts
    except (ConfigError, ModelError) as exc:
        return str(exc)
    from llmbench.bench.workload_fits import fit_problem, longest_request

    longest = longest_request(resolved)
    return None if longest is None else fit_problem(config, longest)


def toggles_hint(resolved: ResolvedScenario) -> str:
    """``Toggles this scenario can flip here: ...``, said when a variant cannot run; "" when none can."""
    here = runnable_toggles(resolved)
    return f"Toggles this scenario can flip here: {', '.join(here)}." if here else ""


def runnable_toggles(resolved: ResolvedScenario) -> list[str]:
    """The on/off toggles whose flip this scenario can run on this machine."""
    from llmbench.bench.backends.engine import engine_config
    from llmbench.engine.config import toggle_names

    try:
        config = engine_config(resolved.scenario)
    except ValueError:  # the scenario itself cannot run: no toggle can
        return []
    names = []
    for name in toggle_names():
        try:
            variants = plan("flip", [Toggle(name, None)], config)
        except (BenchError, ValueError):  # ValueError: the engine's ConfigError
            continue
        if all(config_problem(resolved, v) is None for v in variants):
            names.append(name)
    return names
