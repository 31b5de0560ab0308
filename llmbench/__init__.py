"""llmbench: benchmark and profile LLM inference on a built-in engine whose every optimisation is a switch."""

from llmbench.engine.llm import LLM
from llmbench.engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"
