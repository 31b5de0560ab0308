"""Workloads read from files: prompt lists (JSONL or text), ShareGPT conversations, arrival traces.

Each reader returns :class:`RequestSpec`s in file order; a malformed file is a :class:`WorkloadError`
naming the file, the line (or record) and what was expected. Token ids given in a prompt file are checked
against the model's vocabulary (``check_prompt_file`` does it before the backend starts).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from llmbench.bench.errors import WorkloadError
from llmbench.bench.scenario.workload_schema import Workload
from llmbench.bench.workload.lengths import sample_lengths
from llmbench.bench.workload.spec import Encoder, RequestSpec
from llmbench.bench.workload.synthetic import Fits


def _positive_int(value: Any, where: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 1:
        raise WorkloadError(f"{where}: {what} must be a positive integer, got {value!r}")
    return int(value)


def _token_ids(value: Any, where: str, vocab_size: int) -> list[int]:
    if not value or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise WorkloadError(f"{where}: token ids must be a non-empty list of non-negative integers")
    outside = next((t for t in value if t >= vocab_size), None)
    if outside is not None:
        raise WorkloadError(
            f"{where}: token id {outside} is outside the model's vocabulary of {vocab_size} ids "
            f"(0 to {vocab_size - 1})"
        )
    return list(value)


def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    records = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return records


def _prompt_records(
    path: Path, encoder: Encoder | None, vocab_size: int
) -> list[tuple[list[int], int | None]]:
    """(prompt ids, output_len or None) per record; token ids are checked against the vocabulary. Without
    an ``encoder`` text prompts are read but not encoded (their ids list is empty)."""
    encode = encoder.encode if encoder is not None else (lambda text: [])
    if path.suffix not in (".jsonl", ".json", ".ndjson"):
        return [
            (encode(line), None) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    prompts: list[tuple[list[int], int | None]] = []
    for lineno, rec in _read_jsonl(path):
        where = f"{path}:{lineno}"
        if not isinstance(rec, dict):
            raise WorkloadError(
                f"{where}: each line must be a JSON object with 'prompt' or 'prompt_token_ids'"
            )
        if "prompt_token_ids" in rec:
            ids = _token_ids(rec["prompt_token_ids"], where, vocab_size)
        elif isinstance(rec.get("prompt"), list):
            ids = _token_ids(rec["prompt"], where, vocab_size)
        elif isinstance(rec.get("prompt"), str) and rec["prompt"]:
            ids = encode(rec["prompt"])
        else:
            raise WorkloadError(f"{where}: needs 'prompt' (text or token ids) or 'prompt_token_ids'")
        out = rec.get("output_len", rec.get("max_tokens"))
        prompts.append((ids, None if out is None else _positive_int(out, where, "output_len")))
    return prompts


def check_prompt_file(workload: Workload, vocab_size: int) -> None:
    """Read a ``file`` workload's records and check their token ids against the vocabulary, without a
    tokenizer: the runner calls it before the backend starts, so a bad file is an error before any cost."""
    if workload.source == "file":
        _prompt_records(Path(workload.path), None, vocab_size)


def prompt_file_requests(
    workload: Workload, encoder: Encoder, vocab_size: int, rng: np.random.Generator
) -> list[RequestSpec]:
    """JSONL records ``{"prompt": "text" | [ids], "prompt_token_ids": [ids], "output_len": N}``, or plain text."""
    path = Path(workload.path)
    prompts = [(ids, out) for ids, out in _prompt_records(path, encoder, vocab_size) if ids]
    if not prompts:
        raise WorkloadError(f"{path}: holds no prompt")
    if any(out is None for _, out in prompts) and workload.output_len is None:
        raise WorkloadError(f"{path}: some prompts give no output_len; set workload.output_len for them")
    chosen = _choose(len(prompts), workload.num_requests, rng)
    fill = sample_lengths(workload.output_len, len(chosen), rng) if workload.output_len else None
    specs = []
    for k, idx in enumerate(chosen):
        ids, out = prompts[idx]
        specs.append(RequestSpec(str(k), ids, out if out is not None else int(fill[k])))
    return specs


def _choose(available: int, wanted: int | None, rng: np.random.Generator) -> list[int]:
    """All records in order, or ``wanted`` of them at random (cycling when more are wanted)."""
    if wanted is None:
        return list(range(available))
    reps = -(-wanted // available)
    order = np.concatenate([rng.permutation(available) for _ in range(reps)])
    return order[:wanted].tolist()


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


def sharegpt_requests(workload: Workload, encoder: Encoder, rng: np.random.Generator) -> list[RequestSpec]:
    """First user turn as the prompt; the first reply's token count as the output length."""
    path = Path(workload.path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}: not valid JSON at line {exc.lineno} ({exc.msg})") from None
    if not isinstance(data, list):
        raise WorkloadError(
            f"{path}: a ShareGPT file is a JSON list of conversations, got {type(data).__name__}"
        )
    pairs: list[tuple[list[int], int]] = []
    for conv in data:
        turns = _turns(conv)
        for i in range(len(turns) - 1):
            if turns[i][0] == "user" and turns[i + 1][0] == "assistant":
                prompt = encoder.encode(turns[i][1])
                reply = len(encoder.encode(turns[i + 1][1]))
                if prompt:
                    pairs.append((prompt, max(1, reply)))
                break
    if not pairs:
        raise WorkloadError(f"{path}: no conversation with a user turn followed by a reply")
    chosen = _choose(len(pairs), workload.num_requests, rng)
    fill = sample_lengths(workload.output_len, len(chosen), rng) if workload.output_len else None
    return [
        RequestSpec(str(k), pairs[idx][0], int(fill[k]) if fill is not None else pairs[idx][1])
        for k, idx in enumerate(chosen)
    ]


_TRACE_COLUMNS = ("timestamp", "input_len", "output_len")


MAX_TRACE_SPAN_S = 24 * 3600.0  # a longer replay is, far more often, timestamps in milliseconds


def trace_requests(
    workload: Workload,
    vocab_size: int,
    token_rng: np.random.Generator,
    fits: Fits | None = None,
) -> list[RequestSpec]:
    """Rows of ``timestamp, input_len, output_len``; arrivals are offsets from the first timestamp.
    ``fits`` (see ``build_requests``) sees each row's lengths before its tokens are drawn."""
    path = Path(workload.path)
    rows: list[tuple[str, dict[str, Any]]] = []
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        for lineno, rec in _read_jsonl(path):
            if not isinstance(rec, dict):
                raise WorkloadError(f"{path}:{lineno}: each line must be a JSON object")
            rows.append((f"{path}:{lineno}", rec))
    else:
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in _TRACE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise WorkloadError(
                    f"{path}: a trace CSV needs the columns {', '.join(_TRACE_COLUMNS)}; missing: {', '.join(missing)}"
                )
            rows = [(f"{path}:{i + 2}", r) for i, r in enumerate(reader)]
    parsed = []
    for where, rec in rows:
        missing = [c for c in _TRACE_COLUMNS if rec.get(c) in (None, "")]
        if missing:
            raise WorkloadError(
                f"{where}: missing {', '.join(missing)} (a trace row has {', '.join(_TRACE_COLUMNS)})"
            )
        try:
            t = float(rec["timestamp"])
            lens = [float(rec["input_len"]), float(rec["output_len"])]
        except (TypeError, ValueError):
            raise WorkloadError(f"{where}: timestamp, input_len and output_len must be numbers") from None
        if not math.isfinite(t):
            raise WorkloadError(
                f"{where}: timestamp must be a finite number of seconds, got {rec['timestamp']!r}"
            )
        parsed.append(
            (t, _positive_int(lens[0], where, "input_len"), _positive_int(lens[1], where, "output_len"))
        )
    if not parsed:
        raise WorkloadError(f"{path}: the trace holds no row")
    parsed.sort(key=lambda r: r[0])
    if workload.num_requests is not None:
        parsed = parsed[: workload.num_requests]
    t0 = parsed[0][0]
    scale = workload.time_scale or 1.0
    span = (parsed[-1][0] - t0) * scale
    if span > MAX_TRACE_SPAN_S:
        raise WorkloadError(
            f"{path}: its arrivals span {span / 3600:,.0f} hours; timestamps are seconds (if these are "
            "milliseconds, set workload.time_scale: 0.001), or replay a part of it with workload.num_requests"
        )
    for k, (_, inp, out) in enumerate(parsed):
        if fits is not None:
            fits(str(k), inp, out)
    return [
        RequestSpec(str(k), token_rng.integers(0, vocab_size, size=inp).tolist(), out, (t - t0) * scale)
        for k, (t, inp, out) in enumerate(parsed)
    ]
