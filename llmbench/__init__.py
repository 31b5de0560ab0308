"""llmbench: benchmark and profile LLM inference on a built-in engine whose every optimisation is a switch.

``LLM``, ``SamplingParams`` and the errors the API raises (``ConfigError`` for engine options, ``ModelError``
for a model, ``RequestError`` for a request the engine cannot serve) are imported on first use, so that
the command line, the scenario files and the peer backends load without the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmbench.engine.config import ConfigError
    from llmbench.engine.llm import LLM
    from llmbench.engine.llm_engine import RequestError
    from llmbench.engine.sampling_params import SamplingParams
    from llmbench.models.errors import ModelError

__all__ = ["LLM", "SamplingParams", "ConfigError", "ModelError", "RequestError"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from llmbench.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from llmbench.engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "ConfigError":
        from llmbench.engine.config import ConfigError

        return ConfigError
    if name == "ModelError":
        from llmbench.models.errors import ModelError

        return ModelError
    if name == "RequestError":
        from llmbench.engine.llm_engine import RequestError

        return RequestError
    raise AttributeError(f"module 'llmbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
