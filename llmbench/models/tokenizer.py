"""Tokenizers: a folder's own through transformers, or a byte-level one for presets.

The byte-level tokenizer maps each UTF-8 byte to its value (0-255) and reserves 256/257 for BOS/EOS,
so text prompts work with any preset whose vocabulary has at least 258 entries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


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


class HFTokenizer:
    def __init__(self, folder: str | Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(folder))
        self.eos_token_id = self._tok.eos_token_id
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def load_tokenizer(folder: str | Path | None, vocab_size: int) -> Tokenizer:
    if folder is not None and any(
        (Path(folder) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return HFTokenizer(folder)
    return ByteTokenizer(vocab_size)
