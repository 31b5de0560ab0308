"""The one exception a model folder or checkpoint that cannot be used raises.

Its message stands on its own for the person who chose the model: it names the file (config.json, a
``.safetensors`` file, the shard index) and what is wrong with it. Callers treat it as bad input, not
as a crash; the CLI prints it and exits 2, the Python API lets it through unchanged.
"""

from __future__ import annotations


class ModelError(ValueError):
    """A model folder, its config.json or its checkpoint cannot be used; the message names the file."""
