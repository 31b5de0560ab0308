"""How many tokens a streamed completion produced, and what its counts say is wrong.

A finished request's output token count is settled once, here, from what the server gave (the first that
applies wins):

1. **ids**: every chunk that carried tokens carried their ``token_ids`` (vLLM's ``return_token_ids``,
   ``backend_options.openai.token_ids``). Exact: the ids are the tokens. A ``usage`` that disagrees is
   noted (a server that counts an EOS or special tokens it did not stream) but does not win.
2. **usage**: the server's own ``usage.completion_tokens`` (``stream_options.include_usage``). It sees the
   tokens that one chunk of text merges (``--stream-interval``, speculative decoding), which the client
   cannot. It never counts below what the stream showed: each chunk with text carried at least one token
   (source **chunks** when the stream showed more).
3. **finish_reason**: no ids and no usage, and the server says ``"length"``: it reached ``max_tokens``
   (vLLM and SGLang refuse a prompt that leaves less room than that), so the count is ``max_tokens`` --
   or what the stream showed, if more. A stream that showed fewer had several tokens per chunk.
4. **text**: no ids, no usage, a stop before ``max_tokens``, and the scenario's ``model`` is the served
   model's folder (or hub id): the streamed text re-tokenised with its tokenizer, as vLLM's benchmark
   does. Close, not exact (text re-tokenised can merge or split tokens), and never below what the stream
   showed. A preset's byte-level stand-in tokenizer is not the server's, so it never counts.
5. **chunks**: nothing else: one token per chunk with text (or as many as its logprobs list). Exact only
   at one token per chunk; a lower bound otherwise.

A count that rests on the chunks alone, on ``finish_reason`` alone, or on a stream and a server that
disagree is flagged. Per-token times follow the settled count: a chunk's tokens share its time, and tokens
counted beyond those the chunks showed are shared out evenly over the chunks, so TPOT, ITL and the
throughputs all use the one count.

Three different problems are kept apart, each in its own field of the request's record:

- ``output_check``: the output is not the length asked for (more than ``max_tokens``; or, when EOS is
  ignored, not exactly it). Only these count as output length mismatches.
- ``count_check``: the stream and the server disagree on how many tokens there were, or the count rests on
  the chunks or on ``finish_reason`` alone.
- ``prompt_check``: the server counted the prompt differently (a different tokenizer or a chat template).
"""

from __future__ import annotations

from typing import NamedTuple


class Counted(NamedTuple):
    n: int  # output tokens
    source: str  # "ids" | "usage" | "finish_reason" | "text" | "chunks"
    output_check: str | None
    count_check: str | None
    prompt_check: str | None


class Streamed(NamedTuple):
    """What one finished request's stream and its server said about its lengths."""

    asked: int  # max_tokens
    finish_reason: str | None
    shown: int  # tokens the stream showed (ids, logprobs tokens, or one per chunk with text)
    ids: int | None  # tokens the ids named, when every token-carrying chunk had them (and there were some)
    usage: int | None  # the server's usage.completion_tokens
    text_tokens: int | None  # the streamed text re-tokenised with the served model's tokenizer
    prompt_len: int
    usage_prompt: int | None  # the server's usage.prompt_tokens
    ids_asked: bool  # backend_options.openai.token_ids was on


def _settle(s: Streamed) -> tuple[int, str]:
    if s.ids is not None:
        return s.ids, "ids"
    if s.usage is not None:
        return max(s.usage, s.shown), "usage" if s.usage >= s.shown else "chunks"
    if s.finish_reason == "length":
        return max(s.asked, s.shown), "chunks" if s.shown >= s.asked else "finish_reason"
    if s.text_tokens is not None:
        return max(s.text_tokens, s.shown), "text"
    return s.shown, "chunks"


def _count_problem(s: Streamed, n: int, source: str) -> str | None:
    ids_hint = (
        "the server sent no token ids although asked"
        if s.ids_asked
        else "token ids (backend_options.openai.token_ids) would settle it"
    )
    if source == "ids":
        if s.usage is not None and s.usage != n:
            return f"the stream carried {n} token ids, the server's usage counted {s.usage}: {n} is used"
        if s.finish_reason == "length" and n < s.asked:
            return (
                f"finish_reason length after {n} token ids of max_tokens {s.asked} "
                "(the server's context limit?)"
            )
        return None
    if s.usage is not None and s.usage > s.shown:
        return (
            f"the stream showed {s.shown} tokens, the server's usage counted {s.usage}: several tokens "
            f"per chunk (they share its time), or tokens the server counts but did not stream; {ids_hint}"
        )
    if s.usage is not None and s.usage < s.shown:
        return (
            f"the server's usage counted {s.usage}, fewer than the {s.shown} the stream showed: {n} is used; "
            f"{ids_hint}"
        )
    if source == "finish_reason":
        return (
            f"finish_reason length after {s.shown} tokens shown of max_tokens {s.asked} and no usage: counted "
            f"as {n} (several tokens per chunk); {ids_hint}"
        )
    if source == "chunks" and s.usage is None and s.finish_reason != "length":  # "length" says it is all
        return f"no usage and no token ids: counted {n} from the chunks, too few if chunks merge tokens; {ids_hint}"
    if s.usage is not None and s.finish_reason == "length" and n < s.asked:
        return f"finish_reason length after {n} tokens (usage) of max_tokens {s.asked}"
    return None


def settle(s: Streamed, ignore_eos: bool) -> Counted:
    """The output token count of a finished request, where it came from, and what is wrong with it."""
    n, source = _settle(s)
    output = None
    if n > s.asked or (ignore_eos and n != s.asked):
        output = f"asked for {s.asked} tokens, got {n} ({source})"
    prompt = None
    if s.usage_prompt is not None and s.usage_prompt != s.prompt_len:
        prompt = f"the prompt has {s.prompt_len} tokens, the server counted {s.usage_prompt}"
    return Counted(n, source, output, _count_problem(s, n, source), prompt)


def spread(chunks: list[tuple[float, int]], n: int) -> list[float]:
    """Per-token times: each chunk's (time, tokens) at its time, and the tokens beyond those the chunks
    showed (``n`` minus their sum) shared out evenly over the chunks."""
    extra = n - sum(k for _, k in chunks)
    times: list[float] = []
    c = len(chunks)
    for j, (t, k) in enumerate(chunks):
        more = (j + 1) * extra // c - j * extra // c if extra > 0 else 0
        times += [t] * (k + more)
    return times
