"""The engine's tokenizer: the model's own where it can serve, else one that takes token ids only.

Token-id prompts need no tokenizer, so a model folder whose tokenizer cannot be loaded (a broken
tokenizer.json, one that needs sentencepiece or remote code, more ids than the model's vocabulary) still
runs them: its tokenizer is ``IdsOnly`` carrying the loading error, which a text prompt raises. The
tokenizer is still loaded at start-up where it can be, for its end-of-sequence id.
"""

from __future__ import annotations

from pathlib import Path

from llmbench.models.errors import ModelError
from llmbench.models.tokenizer import IdsOnly, Tokenizer, load_tokenizer


def engine_tokenizer(folder: Path | None, vocab_size: int, model: str) -> Tokenizer:
    """The model's tokenizer (``load_tokenizer``); one that cannot serve is ``IdsOnly`` with its error."""
    try:
        return load_tokenizer(folder, vocab_size, model)
    except ModelError as error:
        return IdsOnly(vocab_size, str(error))
