"""Which engine configurations an ablation runs.

A toggle is one of the engine's ``toggle_names()`` or on/off tuning knobs (``tuning.tp_fuse_norm``),
optionally with the values to compare (``attention_backend=sdpa,torch``); any other option is varied by
giving its values (``max_num_seqs=128,256``, ``tuning.skinny_matmul_rows=0,1``). Values are checked by
the engine's own option checks when parsed, so a bad one fails before anything runs. A toggle's
baseline value is what the scenario's engine options resolve to on this machine; its alternatives are:
booleans flipped; ``attention_backend`` every other backend; ``tp`` 1 vs 2; ``kv_cache_dtype`` fp8_e4m3
vs the model's dtype. For the designs that speak of on/off, "on" is True / the best backend / tp=2 /
fp8_e4m3 and "off" is False / the ``torch`` reference / tp=1 / auto.

Designs:
- flip (default): the baseline, and every toggle switched to an alternative at once (one variant per
  combination of alternatives; with one boolean toggle, plain A/B).
- one-at-a-time: the baseline, and each alternative of each toggle alone.
- leave-one-out: baseline = every toggle on; each variant turns one toggle off. A toggle given values
  needs exactly two, read as ON,OFF (``attention_backend=sdpa,torch``); more or fewer have no on and off.
- factorial: every combination of the toggles' levels (a toggle's given values, or its on and off); the
  one equal to the scenario's configuration is the baseline.

A plan that compares nothing is an error: a toggle whose only value is the baseline's own
(``block_size=16`` where the scenario runs 16), or a value given twice (``max_num_seqs=4,4,8``).

A toggle may also be a sampling setting of the scenario, with the values to compare
(``sampling.temperature=0,0.6``, ``sampling.top_k=0,50``, ``sampling.top_p=1,0.9``, ``sampling.min_p=...``,
``sampling.seed=...``); its baseline is the scenario's own value.

Values are read as ``--set`` reads them (YAML 1.2 numbers: ``1e-3`` is a number) and checked where they
are parsed: engine options by the engine's checks, sampling settings by the scenario's schema; a value
that is not a finite number (``.nan``, ``.inf``) is refused for every toggle.

A variant is engine options (and ``sampling.*`` settings) on top of the scenario's, or (``backends``)
another backend serving the same scenario: ``backend=engine``, ``backend=transformers``, ... with the
first one named as the baseline.
Whether a variant can run is checked separately (``resolve`` raises ConfigError, e.g. CUDA Graphs on a
CPU; a peer backend says what it lacks).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, NamedTuple

from llmbench.bench.errors import BenchError
from llmbench.suggest import did_you_mean

DESIGNS = ("flip", "one-at-a-time", "leave-one-out", "factorial")
SAMPLING = "sampling."
SAMPLING_TOGGLES = tuple(SAMPLING + f for f in ("temperature", "top_k", "top_p", "min_p", "seed"))
BACKENDS_DESIGN = "backends"
BASELINE = "baseline"


class Toggle(NamedTuple):
    name: str
    values: tuple[Any, ...] | None  # explicit values to compare, or None for the defaults


class Variant(NamedTuple):
    name: str
    options: dict[str, Any]  # engine options set on top of the scenario's, by dotted name


class BackendVariant(NamedTuple):
    """The same scenario served by another backend (its options come from the scenario's backend_options)."""

    name: str
    options: dict[str, Any]  # always empty: nothing is set on the engine
    backend: str


def parse_toggle(text: str) -> Toggle:
    """``cuda_graph``, ``attention_backend=sdpa,torch``, ``tuning.tp_fuse_norm``, or any other engine
    option with the values to compare, ``max_num_seqs=128,256`` (values parsed as YAML scalars and
    checked as the engine, or for ``sampling.*`` the scenario, checks them)."""
    import yaml

    from llmbench.bench.scenario.loader import parse_yaml
    from llmbench.engine.config import check_option, flippable_knobs, knob_names, toggle_names

    name, sep, raw = text.partition("=")
    name = name.strip()
    switches = (*toggle_names(), *flippable_knobs())
    knobs = [k for k in knob_names() if k not in switches]
    if name.startswith(SAMPLING) and name not in SAMPLING_TOGGLES:
        raise BenchError(
            f"Unknown sampling toggle: {name!r}{did_you_mean(name, SAMPLING_TOGGLES)}. "
            f"Supported: {', '.join(SAMPLING_TOGGLES)}"
        )
    if name in SAMPLING_TOGGLES and not sep:
        raise BenchError(f"--toggle {name} needs the values to compare, e.g. {name}=A,B")
    if name not in switches and name not in SAMPLING_TOGGLES and not (sep and name in knobs):
        if name in knobs:
            raise BenchError(
                f"--toggle {name} is a knob, not an on/off toggle: give its values, e.g. {name}=A,B"
            )
        several = [n.strip() for n in name.split(",")]
        if not sep and len(several) > 1 and all(n in switches for n in several):
            raise BenchError(
                f"--toggle {text!r}: one toggle a --toggle; give each its own: "
                + " ".join(f"--toggle {n}" for n in several)
            )
        raise BenchError(
            f"Unknown toggle: {name!r}{did_you_mean(name, [*switches, *knobs, *SAMPLING_TOGGLES])}. "
            f"Toggles: {', '.join(switches)}; "
            f"knobs, with values (NAME=A,B): {', '.join(knobs)}, {', '.join(SAMPLING_TOGGLES)}"
        )
    if not sep:
        return Toggle(name, None)
    pieces = [v.strip() for v in raw.split(",")]
    if not any(pieces):
        raise BenchError(f"--toggle {text!r}: no values after '='")
    if not all(pieces):
        raise BenchError(
            f"--toggle {text}: an empty value between the commas; give each value, e.g. {name}=A,B"
        )
    values, problems = [], []
    for piece in pieces:
        try:
            value = parse_yaml(piece)
        except yaml.YAMLError:
            value = piece  # not YAML: the string the user typed
        if name in SAMPLING_TOGGLES:  # alone here; with the scenario's other settings in ablation/checks.py
            checked, found = value, _sampling_problems(name, value)
        else:
            checked, found = check_option(name, value, prefix="engine.")
        if not found and isinstance(value, float) and not math.isfinite(value):
            found = [f"{piece} is not a finite number"]  # (NaN would also never equal itself below)
        values.append(checked)
        problems += [f"--toggle {text}: {p}" for p in found]
    if problems:
        raise BenchError("\n".join(problems))
    for j, value in enumerate(values):
        i = next((i for i, v in enumerate(values) if _same(v, value)), j)
        if i < j:
            again = "is given twice" if pieces[i] == pieces[j] else f"is the same value as {pieces[i]}"
            raise BenchError(f"--toggle {text}: {pieces[j]} {again}; give each value once")
    return Toggle(name, tuple(values))


def _sampling_problems(name: str, value: Any) -> list[str]:
    """What the scenario's schema says of ``value`` for the sampling setting ``name``: ``sampling.top_p:
    Input should be a finite number (got nan)``; none when it takes it."""
    from pydantic import ValidationError

    from llmbench.bench.scenario.errors import problem_lines
    from llmbench.bench.scenario.schema import Sampling

    try:
        Sampling.model_validate({name.removeprefix(SAMPLING): value})
    except ValidationError as exc:
        return problem_lines(exc, ("sampling",))
    return []


def _same(a: Any, b: Any) -> bool:
    """Equal values of one option (``4`` and ``4.0``), but never a boolean and a number (True == 1)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def parse_toggles(texts: list[str]) -> list[Toggle]:
    """Every ``--toggle``, with every problem among them reported at once."""
    toggles, problems = [], []
    for text in texts:
        try:
            toggles.append(parse_toggle(text))
        except BenchError as exc:
            problems.append(str(exc))
    if problems:
        raise BenchError("\n".join(problems))
    return toggles


def option_value(resolved: Any, name: str) -> Any:
    """The value of a (dotted) option in a resolved config: ``tuning.skinny_matmul_rows``."""
    for part in name.split("."):
        resolved = getattr(resolved, part)
    return resolved


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def current(name: str, resolved: Any, sampling: Any = None) -> Any:
    """The scenario's value of a toggle: the resolved engine option, or the scenario's sampling setting."""
    if name.startswith(SAMPLING):
        return getattr(sampling, name.removeprefix(SAMPLING)) if sampling is not None else None
    return option_value(resolved, name)


def levels(toggle: Toggle, resolved: Any, sampling: Any = None) -> tuple[Any, list[Any]]:
    """(baseline value, alternatives) for one toggle against the resolved engine config."""
    from llmbench.engine.option_checks import ATTENTION_BACKENDS

    base = current(toggle.name, resolved, sampling)
    if toggle.values is not None:
        return base, [v for v in toggle.values if _canonical(toggle.name, v, resolved) != base]
    if isinstance(base, bool):
        return base, [not base]
    if toggle.name == "attention_backend":
        return base, [b for b in ATTENTION_BACKENDS if b != base]
    if toggle.name == "tp":
        return base, [2 if base == 1 else 1]
    if toggle.name == "kv_cache_dtype":  # resolved: the model's dtype, or a float8 format
        return base, ["fp8_e4m3" if base == resolved.dtype else "auto"]
    raise BenchError(
        f"toggle {toggle.name!r} has no default alternatives; give them: --toggle {toggle.name}=A,B"
    )


def _canonical(name: str, value: Any, resolved: Any) -> Any:
    """A value as the resolved config would hold it, where that differs from how it is written: a KV cache
    of dtype "auto" holds the model's dtype."""
    if name == "kv_cache_dtype" and value in ("auto", None):
        return resolved.dtype
    return value


def on_off(toggle: Toggle, resolved: Any) -> tuple[Any, Any]:
    """The (on, off) values of a toggle for the leave-one-out design: two values given are ON,OFF; a
    toggle given any other number of values has no on and off."""
    if toggle.values is not None:
        if len(toggle.values) != 2:
            raise BenchError(
                f"--design leave-one-out turns each toggle off from all of them on, and {_spelled(toggle)} "
                f"has no on and off: give two values, ON,OFF ({toggle.name}=A,B), or compare its values with "
                "--design one-at-a-time or factorial"
            )
        return toggle.values[0], toggle.values[1]
    if toggle.name == "attention_backend":
        best = resolved.attention_backend
        return (best if best != "torch" else "sdpa"), "torch"
    if toggle.name == "tp":
        return 2, 1
    if toggle.name == "kv_cache_dtype":
        return "fp8_e4m3", "auto"
    return True, False


def factorial_levels(toggle: Toggle, resolved: Any) -> list[Any]:
    """A toggle's levels in the factorial design: the values given, else its on and off."""
    if toggle.values is not None:
        return list(toggle.values)
    return list(on_off(toggle, resolved))


def _spelled(toggle: Toggle) -> str:
    """The toggle as typed: ``max_num_seqs=2,4,8``."""
    if toggle.values is None:
        return toggle.name
    written = (
        "auto" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for v in toggle.values
    )
    return f"{toggle.name}={','.join(written)}"


def _check_compares(toggle: Toggle, resolved: Any, sampling: Any) -> None:
    """A toggle given values must give something besides the baseline's own value (``block_size=16``
    where the scenario runs 16 compares nothing)."""
    if toggle.values is None:
        return
    base = current(toggle.name, resolved, sampling)
    if all(_same(_canonical(toggle.name, v, resolved), base) for v in toggle.values):
        raise BenchError(
            f"{_spelled(toggle)} is the baseline's own value: nothing to compare; give another value"
        )


def _name(options: dict[str, Any]) -> str:
    return "+".join(f"{k}={_text(v)}" for k, v in options.items())


def plan(design: str, toggles: list[Toggle], resolved: Any, sampling: Any = None) -> list[Variant]:
    """The variants to run, the baseline first (``sampling``: the scenario's, for ``sampling.*`` toggles)."""
    if design not in DESIGNS:
        raise BenchError(f"Unsupported design: {design!r}. Supported: {', '.join(DESIGNS)}")
    if not toggles:
        raise BenchError("an ablation needs at least one --toggle")
    names = [t.name for t in toggles]
    if len(set(names)) != len(names):
        raise BenchError(f"a toggle is named twice: {', '.join(names)}")
    for t in toggles:
        _check_compares(t, resolved, sampling)
    variants = [Variant(BASELINE, {})]
    if design == "flip":
        alts = [levels(t, resolved, sampling)[1] for t in toggles]
        for combo in itertools.product(*alts):
            options = dict(zip(names, combo, strict=True))
            variants.append(Variant(_name(options), options))
    elif design == "one-at-a-time":
        for t in toggles:
            for alt in levels(t, resolved, sampling)[1]:
                variants.append(Variant(_name({t.name: alt}), {t.name: alt}))
    elif design == "leave-one-out":
        all_on = {t.name: on_off(t, resolved)[0] for t in toggles}
        variants = [Variant(BASELINE, all_on)]
        for t in toggles:
            options = {**all_on, t.name: on_off(t, resolved)[1]}
            variants.append(Variant(f"{t.name}={_text(options[t.name])}", options))
    else:  # factorial
        grid = [factorial_levels(t, resolved) for t in toggles]
        now = {t.name: current(t.name, resolved, sampling) for t in toggles}
        variants = []
        for combo in itertools.product(*grid):
            options = dict(zip(names, combo, strict=True))
            same = all(_same(_canonical(k, v, resolved), now[k]) for k, v in options.items())
            variants.append(Variant(BASELINE if same else _name(options), options))
        variants.sort(key=lambda v: v.name != BASELINE)
        if variants[0].name != BASELINE:  # the scenario's own configuration is not in the grid
            variants.insert(0, Variant(BASELINE, {}))
    seen: set[str] = set()
    unique = []
    for v in variants:
        if v.name not in seen:
            seen.add(v.name)
            unique.append(v)
    if len(unique) < 2:
        raise BenchError(
            f"--design {design} of {', '.join(_spelled(t) for t in toggles)} gives no variant but the "
            "baseline: nothing to compare"
        )
    return unique


def plan_backends(backends: list[str]) -> list[BackendVariant]:
    """One variant per backend (``backend=transformers``), the first the baseline."""
    from llmbench.bench.scenario.backend_registry import BACKENDS, unsupported

    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise BenchError(unsupported(unknown[0]))
    if len(set(backends)) != len(backends):
        raise BenchError(f"a backend is named twice: {', '.join(backends)}")
    if len(backends) < 2:
        raise BenchError(
            f"comparing backends needs at least two (got {', '.join(backends) or 'none'}), "
            "e.g. --backend engine --backend transformers"
        )
    return [BackendVariant(f"backend={b}", {}, b) for b in backends]
