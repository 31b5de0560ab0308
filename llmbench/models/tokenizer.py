"""Tokenizers: a folder's own through transformers, or a byte-level one for presets.

The byte-level tokenizer maps each UTF-8 byte to its value (0-255) and reserves 256/257 for BOS/EOS,
so text prompts work with any preset whose vocabulary has at least 258 entries. A model with a smaller
vocabulary and no tokenizer files of its own takes token-id prompts only (``IdsOnly``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from llmbench.models.errors import ModelError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class Tokenizer(Protocol):
    eos_token_id: int | None
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    BOS = 256
    EOS = 257

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 258:
            raise ValueError(f"a byte-level tokenizer needs a vocabulary of at least 258, got {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_token_id: int | None = self.EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # Ids beyond the byte range (random-weight models emit them) show as U+FFFD.
        return b"".join(bytes([i]) if i < 256 else "\ufffd".encode() for i in ids).decode("utf-8", "replace")


class IdsOnly:
    """The tokenizer of a model with no tokenizer files and too small a vocabulary for the byte-level one:
    token-id prompts run; a text prompt is a clear error naming the model."""

    def __init__(self, vocab_size: int, model: str) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id: int | None = None
        self._model = model

    def encode(self, text: str) -> list[int]:
        raise ModelError(
            f"{self._model}: a text prompt needs a tokenizer, and the model has no tokenizer files "
            f"({', '.join(TOKENIZER_FILES)}) while its vocabulary of {self.vocab_size} ids is too small for "
            f"the byte-level one that stands in for them (at least {ByteTokenizer.EOS + 1}); add the model's "
            "tokenizer files, or give prompts as token ids"
        )

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


class HFTokenizer:
    def __init__(self, folder: str | Path) -> None:
        from transformers import AutoTokenizer

        try:
            self._tok = AutoTokenizer.from_pretrained(str(folder))
        except Exception as exc:  # transformers and tokenizers raise many kinds for a broken file
            present = [f for f in TOKENIZER_FILES if (Path(folder) / f).is_file()]
            raise ModelError(
                f"{folder}: its tokenizer ({', '.join(present)}) cannot be loaded by transformers: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self.eos_token_id = self._tok.eos_token_id
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def load_tokenizer(folder: str | Path | None, vocab_size: int, model: str | None = None) -> Tokenizer:
    """The folder's own tokenizer where it has tokenizer files, else the byte-level one, else (a vocabulary
    under 258 ids) ``IdsOnly``; ``model`` names the model in its errors (default: the folder)."""
    if folder is not None and any((Path(folder) / f).is_file() for f in TOKENIZER_FILES):
        tok = HFTokenizer(folder)
        if tok.vocab_size > vocab_size:  # its ids past the model's embedding could reach no token
            raise ModelError(
                f"{folder}: its tokenizer has {tok.vocab_size} ids but the model's vocabulary (config.json "
                f"vocab_size) has {vocab_size}: they belong to different models"
            )
        return tok
    if vocab_size <= ByteTokenizer.EOS:
        return IdsOnly(vocab_size, model or str(folder or "the model"))
    return ByteTokenizer(vocab_size)
