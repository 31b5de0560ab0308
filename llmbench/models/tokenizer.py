"""Tokenizers: a folder's own through transformers, or a byte-level one for presets.

The byte-level tokenizer maps each UTF-8 byte to its value (0-255) and reserves 256/257 for BOS/EOS,
so text prompts work with any preset whose vocabulary has at least 258 entries. It never stands in for a
model folder's missing tokenizer files: a real checkpoint's ids mean its own tokens (its id 257 is no
EOS), so such a folder, like a preset with a smaller vocabulary, takes token-id prompts only (``IdsOnly``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from llmbench.models.errors import ModelError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class Tokenizer(Protocol):
    """``encode`` a prompt as transformers, vLLM and SGLang do by default: with the tokenizer's special
    tokens (a Llama tokenizer's BOS); ``special=False`` for a piece of text in the middle of a sequence
    (an output's text, counted again)."""

    eos_token_id: int | None
    vocab_size: int

    def encode(self, text: str, special: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    BOS = 256
    EOS = 257

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 258:
            raise ValueError(f"a byte-level tokenizer needs a vocabulary of at least 258, got {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_token_id: int | None = self.EOS

    def encode(self, text: str, special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))  # no BOS: the byte-level tokenizer of presets adds none

    def decode(self, ids: list[int]) -> str:
        # Ids beyond the byte range (random-weight models emit them) show as U+FFFD.
        return b"".join(bytes([i]) if i < 256 else "\ufffd".encode() for i in ids).decode("utf-8", "replace")


class IdsOnly:
    """The tokenizer of a model that has none to use (a model folder without tokenizer files, a preset's
    vocabulary too small for the byte-level one): token-id prompts run; a text prompt is a ModelError
    with ``reason``, which names the model."""

    def __init__(self, vocab_size: int, reason: str) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id: int | None = None
        self._reason = reason

    @property
    def reason(self) -> str:
        return self._reason

    def encode(self, text: str, special: bool = True) -> list[int]:
        raise ModelError(self._reason)

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def has_tokenizer_files(folder: str | Path) -> bool:
    return any((Path(folder) / f).is_file() for f in TOKENIZER_FILES)


def text_needs_tokenizer(folder: str | Path) -> str:
    """Why a text prompt cannot run on a model folder without tokenizer files (used here and by the
    workload check that refuses such prompts before a backend starts)."""
    return (
        f"a text prompt needs the model's tokenizer, and the model folder {folder} has no tokenizer files "
        f"({', '.join(TOKENIZER_FILES)}): add its tokenizer.json / tokenizer_config.json, or give prompts as "
        "token ids (the byte-level tokenizer stands in for presets only)"
    )


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

    def encode(self, text: str, special: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=special))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def load_tokenizer(folder: str | Path | None, vocab_size: int, model: str | None = None) -> Tokenizer:
    """The folder's own tokenizer where it has tokenizer files; else, for a preset (no folder), the
    byte-level one; else ``IdsOnly``. ``model`` names the model in its errors (default: the folder)."""
    if folder is not None and has_tokenizer_files(folder):
        tok = HFTokenizer(folder)
        if tok.vocab_size > vocab_size:  # its ids past the model's embedding could reach no token
            raise ModelError(
                f"{folder}: its tokenizer has {tok.vocab_size} ids but the model's vocabulary (config.json "
                f"vocab_size) has {vocab_size}: they belong to different models"
            )
        return tok
    if vocab_size <= ByteTokenizer.EOS:
        return IdsOnly(
            vocab_size,
            f"{model or folder or 'the model'}: a text prompt needs a tokenizer, and the model has no "
            f"tokenizer files ({', '.join(TOKENIZER_FILES)}) while its vocabulary of {vocab_size} ids is too "
            f"small for the byte-level one that stands in for a preset's (at least {ByteTokenizer.EOS + 1}); "
            "add the model's tokenizer files, or give prompts as token ids",
        )
    if folder is not None:
        return IdsOnly(vocab_size, text_needs_tokenizer(folder))
    return ByteTokenizer(vocab_size)


def serving_tokenizer(folder: str | Path | None, vocab_size: int, model: str | None = None) -> Tokenizer:
    """The engine's tokenizer: ``load_tokenizer``'s, or, where that cannot serve (a broken tokenizer.json,
    one that needs sentencepiece or remote code, more ids than the model's vocabulary), ``IdsOnly`` carrying
    its error: token-id prompts need no tokenizer and still run, a text prompt raises the error."""
    try:
        return load_tokenizer(folder, vocab_size, model)
    except ModelError as error:
        return IdsOnly(vocab_size, str(error))
