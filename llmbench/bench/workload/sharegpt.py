"""ShareGPT conversations as requests: the first user turn followed by a reply is the prompt, that reply's
token count the output length. Conversations that cannot be sent are skipped, as vLLM's benchmark skips
them, and counted in one warning line (``Built.warnings``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from llmbench.bench.errors import WorkloadError
from llmbench.bench.scenario.workload_schema import Workload
from llmbench.bench.workload.lengths import sample_lengths
from llmbench.bench.workload.reading import choose, read_jsonl, read_text
from llmbench.bench.workload.spec import Built, Encoder, Fits, RequestSpec, byte_level_note

_USER = ("human", "user")
_ASSISTANT = ("gpt", "assistant", "chatgpt", "bard", "bing", "model")


def _turns(conv: Any) -> list[tuple[str, str]]:
    """(speaker, text) turns of one conversation; speaker normalised to 'user' / 'assistant'."""
    raw = conv.get("conversations", conv.get("messages")) if isinstance(conv, dict) else None
    if not isinstance(raw, list):
        return []
    turns = []
    for t in raw:
        if not isinstance(t, dict):
            continue
        who = str(t.get("from", t.get("role", ""))).lower()
        text = t.get("value", t.get("content"))
        if isinstance(text, str):
            turns.append(("user" if who in _USER else "assistant" if who in _ASSISTANT else who, text))
    return turns


_SHAREGPT_FORMS = "a JSON list of conversations, or JSONL (one conversation a line) in a .jsonl file"


def conversations(path: Path) -> list[Any]:
    """A ShareGPT file's conversations: JSONL (.jsonl, .ndjson) one a line, else one JSON list."""
    if path.suffix in (".jsonl", ".ndjson"):
        return [conv for _, conv in read_jsonl(path)]
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        hint = f"; a ShareGPT file is {_SHAREGPT_FORMS}" if exc.msg == "Extra data" else ""
        raise WorkloadError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}){hint}") from None
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: a ShareGPT file is {_SHAREGPT_FORMS}; got one {type(data).__name__}")
    return data


def _first_exchange(turns: list[tuple[str, str]]) -> tuple[str, str] | None:
    """(prompt, reply) of the first user turn followed by an assistant's; None when there is none."""
    for (who, text), (next_who, reply) in zip(turns, turns[1:], strict=False):
        if who == "user" and next_who == "assistant":
            return text, reply
    return None


def sharegpt_requests(
    workload: Workload, encoder: Encoder, rng: np.random.Generator, fits: Fits | None = None
) -> Built:
    """One request per conversation kept (or ``num_requests`` drawn from them), output lengths from
    ``output_len`` when it is given. Skipped: no user turn followed by a reply, an empty prompt, or lengths
    ``fits`` refuses (ShareGPT_V3 holds conversations past any context): the prompt with the reply's
    length, or with the longest output ``output_len`` may draw (its max; 1 when it has none). Which are
    kept depends on the file and ``fits`` alone, so the draw stays a function of the seed; none kept is an
    error."""
    path = Path(workload.path)
    convs = conversations(path)
    if not convs:
        raise WorkloadError(f"{path}: holds no conversation")
    room = (workload.output_len.upper_bound or 1) if workload.output_len else None
    pairs: list[tuple[list[int], int]] = []
    no_reply = no_prompt = unfit = 0
    first_unfit = ""
    for n, conv in enumerate(convs, 1):
        exchange = _first_exchange(_turns(conv))
        if exchange is None:
            no_reply += 1
            continue
        prompt = encoder.encode(exchange[0])
        if not prompt:
            no_prompt += 1
            continue
        output = room if room is not None else max(1, len(encoder.encode(exchange[1])))
        if fits is not None and (problem := fits(len(prompt), output)) is not None:
            unfit += 1
            first_unfit = first_unfit or f"conversation {n}: {problem}"
            continue
        pairs.append((prompt, output))
    why = "; ".join(
        text
        for count, text in (
            (no_reply, f"{no_reply} without a user turn followed by a reply"),
            (no_prompt, f"{no_prompt} whose prompt is empty"),
            (unfit, f"{unfit} that cannot be served (the first, {first_unfit})"),
        )
        if count
    )
    if not pairs:
        raise WorkloadError(f"{path}: no conversation of {len(convs)} can be sent: {why}")
    skipped = len(convs) - len(pairs)
    warnings = (f"{path}: {skipped} of {len(convs)} conversations skipped: {why}",) if skipped else ()
    chosen = choose(len(pairs), workload.num_requests, rng)
    fill = sample_lengths(workload.output_len, len(chosen), rng) if workload.output_len else None
    requests = [
        RequestSpec(str(k), pairs[idx][0], int(fill[k]) if fill is not None else pairs[idx][1])
        for k, idx in enumerate(chosen)
    ]
    return Built(requests, (*warnings, *byte_level_note(encoder, str(path))))
