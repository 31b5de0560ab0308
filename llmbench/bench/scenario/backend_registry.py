"""Which backends exist: one entry per name a scenario's ``backend:`` may give, read by every layer that
needs to know about backends (the schema, ``make_backend``, the workload's context check, ``ablate``).

An entry says how the backend is built (a ``module:Class`` path, imported only when a run builds it, so
loading a scenario loads neither torch nor the engine), its options model (``backend_options.<name>``,
required in a scenario that names it when the model has a required field) and whether it measures a
server elsewhere (``remote``: no device, weights, start-up costs or context length known here). Nothing
else tests a backend's name for what it is: a new backend is an entry here and its module.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field, create_model

from llmbench.bench.scenario.backend_options import OpenAIOptions, TransformersOptions
from llmbench.bench.scenario.fields import StrictModel
from llmbench.suggest import did_you_mean


@dataclass(frozen=True)
class BackendEntry:
    builder: str  # "module:Class", the class taking the Scenario (bench/backends/base.py's Backend)
    options: type[BaseModel] | None = None  # backend_options.<name>; None: it takes none there
    remote: bool = False  # it measures a server elsewhere, through a client

    @property
    def required_option(self) -> tuple[str, str] | None:
        """The first field its options cannot do without, and what it is; None when every one has a
        default (the options then need not be given)."""
        if self.options is None:
            return None
        for name, field in self.options.model_fields.items():
            if field.is_required():
                return name, field.description or ""
        return None


BACKENDS: dict[str, BackendEntry] = {
    "engine": BackendEntry("llmbench.bench.backends.engine:EngineBackend"),  # its options are engine:
    "transformers": BackendEntry(
        "llmbench.bench.backends.transformers:TransformersBackend", TransformersOptions
    ),
    "openai": BackendEntry("llmbench.bench.backends.openai:OpenAIBackend", OpenAIOptions, remote=True),
}


def unsupported(name: str) -> str:
    """The complaint about a backend name that is not in the registry."""
    return f"Unsupported backend: {name!r}{did_you_mean(name, BACKENDS)}. Supported: {', '.join(BACKENDS)}"


def _options_field(options: type[BaseModel], required: bool) -> tuple[object, object]:
    """Options with a required field are None until a scenario gives them; the rest default to theirs."""
    if required:
        return options | None, None
    return options, Field(default_factory=options)


# ``backend_options:``: a key per backend that has options, holding that backend's model.
BackendOptions = create_model(
    "BackendOptions",
    __base__=StrictModel,
    **{
        name: _options_field(e.options, e.required_option is not None)
        for name, e in BACKENDS.items()
        if e.options is not None
    },
)
