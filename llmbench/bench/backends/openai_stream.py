"""What one streamed completions chunk says, and what a finished stream adds up to.

A chunk carries tokens only when it says so: its ``token_ids`` (vLLM's ``return_token_ids``), its logprobs'
``tokens``, or else non-empty text (counted as one token). A role-only chunk (``delta: {role: ...}``),
an empty text, or the closing usage-only chunk carries none, so it never stands in for a first token.
How a finished stream's tokens are counted is openai_counts.py's.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Chunk(NamedTuple):
    num_tokens: int  # tokens this chunk carries (0: role-only, empty, usage-only)
    text: str
    token_ids: list[int] | None  # when the server sent them
    finish_reason: str | None
    usage: dict[str, Any] | None
    error: str | None  # an error object in the stream


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err.get("type") or err)
    return str(err)


def parse_chunk(obj: Any) -> Chunk:
    if not isinstance(obj, dict):
        return Chunk(0, "", None, None, None, f"not a JSON object: {str(obj)[:80]}")
    if obj.get("error") is not None:
        return Chunk(0, "", None, None, None, _error_text(obj["error"]))
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    choices = obj.get("choices") or []
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Chunk(0, "", None, None, usage, None)
    choice = choices[0]
    ids = choice.get("token_ids")
    ids = [int(t) for t in ids] if isinstance(ids, list) else None
    logprobs = choice.get("logprobs")
    lp_tokens = None
    if isinstance(logprobs, dict):  # completions: {"tokens": [...]}; chat: {"content": [...]}
        lp_tokens = logprobs.get("tokens") or logprobs.get("content")
    text = choice.get("text")
    if text is None and isinstance(choice.get("delta"), dict):
        text = choice["delta"].get("content")
    if ids:
        n = len(ids)
    elif isinstance(lp_tokens, list) and lp_tokens:
        n = len(lp_tokens)
    else:
        n = 1 if text else 0
    return Chunk(n, text if isinstance(text, str) else "", ids, choice.get("finish_reason"), usage, None)
