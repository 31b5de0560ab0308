"""What an ablation was asked for, checked whole before anything runs: the variants (engine options or
backends), the repeats and the ``--until-ci`` bound, and the ``--quality`` comparison. ``llmbench ablate``
parses its options into an ``AblationRequest``; ``settle`` gives back the ``AblationPlan`` it runs, or a
``BenchError`` that names what was wrong."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from llmbench.bench.ablation.plan import (
    BACKENDS_DESIGN,
    BackendVariant,
    Toggle,
    Variant,
    parse_toggles,
    plan,
    plan_backends,
)
from llmbench.bench.errors import BenchError
from llmbench.bench.scenario.loader import ResolvedScenario

DEFAULT_MAX_REPEATS = 10  # --until-ci's bound on each variant's repeats unless --max-repeats says


class AblationRequest(NamedTuple):
    toggles: list[str]  # --toggle, as given
    backends: list[str]  # --backend, as given
    design: str
    repeats: int | None  # None: the scenario's
    until_ci: float | None
    max_repeats: int | None
    quality: bool
    quality_text: Path | None


class AblationPlan(NamedTuple):
    variants: list[Variant | BackendVariant]  # the baseline first
    toggles: list[Toggle]
    design: str  # the request's, or BACKENDS_DESIGN
    repeats: int
    max_repeats: int  # what --until-ci may reach (``repeats`` without it)

    def describe(self) -> list[str]:
        """The plan in lines: its size, then each variant's options."""
        upto = (
            f", up to {len(self.variants) * self.max_repeats} with --until-ci"
            if self.max_repeats > self.repeats
            else ""
        )
        lines = [
            f"design {self.design} · {len(self.variants)} variants x {self.repeats} repeat(s) = "
            f"{len(self.variants) * self.repeats} runs{upto}"
        ]
        for v in self.variants:
            opts = ", ".join(f"{k}={val}" for k, val in v.options.items()) or (
                f"the {v.backend} backend"
                if isinstance(v, BackendVariant)
                else "the scenario's engine options"
            )
            lines.append(f"  {v.name}: {opts}")
        if self.design == "flip" and len(self.toggles) > 1:
            lines.append(
                f"  (design flip: the {len(self.toggles)} toggles change together in one variant; "
                "--design one-at-a-time gives each a variant of its own)"
            )
        return lines


def check_quality_text(path: Path, model: str) -> None:
    """What ``--quality-text`` needs before any variant starts: a UTF-8 file and a model that can encode it
    (its folder's tokenizer loads; a preset's byte-level one always does)."""
    from llmbench.bench.workload.files import tokenizer_problem
    from llmbench.models.registry import resolve_model

    try:
        path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BenchError(f"--quality-text {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"--quality-text {path}: cannot read it as UTF-8 text ({exc})") from None
    if problem := tokenizer_problem(model, resolve_model(model)[0].vocab_size):
        raise BenchError(f"--quality-text {path}: {problem}")


def settle(request: AblationRequest, resolved: ResolvedScenario) -> AblationPlan:
    """The plan ``request`` asks for on ``resolved``, every problem an error before anything runs."""
    from llmbench.bench.backends.engine import engine_config

    sc = resolved.scenario
    if request.toggles and request.backends:
        raise BenchError(
            "--toggle varies the engine's options and --backend compares backends: give one or the other"
        )
    if request.quality_text is not None and not request.quality:
        raise BenchError("--quality-text gives --quality a text for perplexity: add --quality")
    if request.quality_text is not None:
        check_quality_text(request.quality_text, sc.model)
    if request.toggles:
        if sc.backends != ["engine"]:
            raise BenchError(
                f"--toggle varies the engine's options, but this scenario is served by {', '.join(sc.backends)}; "
                "add --set backend=engine, or compare backends with --backend"
            )
        toggles = parse_toggles(request.toggles)  # every bad value at once, before anything starts
        config = engine_config(sc)  # the scenario itself must be runnable
        variants: list = plan(request.design, toggles, config, sc.sampling)
        design = request.design
    elif request.backends or len(sc.backends) > 1:
        if request.quality:
            raise BenchError(
                "--quality compares engine configurations on the engine's own distributions; it does not "
                "apply to --backend (peers do not return them)"
            )
        toggles = []
        variants = plan_backends(list(request.backends or sc.backends))
        design = BACKENDS_DESIGN
    else:
        raise BenchError(
            "give at least one --toggle (e.g. llmbench ablate --toggle cuda_graph) or two --backend "
            "(e.g. --backend engine --backend transformers)"
        )
    if sc.workload.source == "sharegpt" and any("max_model_len" in v.options for v in variants):
        raise BenchError(
            "max_model_len decides which ShareGPT conversations a run keeps (those its context holds), so "
            "variants that differ in it would not run the same requests: ablate it on a synthetic, file or "
            "trace workload"
        )
    n = request.repeats or sc.repeats
    bound = request.max_repeats
    if bound is not None and request.until_ci is None:
        raise BenchError(
            "--max-repeats bounds the repeats --until-ci adds: add --until-ci PCT, or leave it out"
        )
    if request.until_ci is not None and bound is not None and bound < n:
        raise BenchError(f"--max-repeats {bound} is fewer than the {n} repeats every variant runs first")
    if request.until_ci is None:
        bound = n
    elif bound is None:
        bound = max(n, DEFAULT_MAX_REPEATS)
    return AblationPlan(variants, toggles, design, n, bound)
