"""llmbench: benchmark and profile LLM inference on a built-in engine whose every optimisation is a switch.

``LLM`` and ``SamplingParams`` are imported when first used, so that the command line can answer
``--help`` without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmbench.engine.llm import LLM
    from llmbench.engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from llmbench.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from llmbench.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'llmbench' has no attribute {name!r}")
