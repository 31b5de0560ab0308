"""Workloads read from files: prompt lists (JSONL or text), ShareGPT conversations, arrival traces.

Each reader returns :class:`RequestSpec`s in file order; a malformed file is a :class:`WorkloadError`
naming the file, the line (or record) and what was expected. Every file is read as UTF-8 text through
``read_text``. Token ids given in a prompt file are checked against the model's vocabulary, and text
prompts against a model folder's tokenizer files (``check_prompt_file`` does both before the backend
starts).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from llmbench.bench.errors import WorkloadError
from llmbench.bench.scenario.workload_schema import MAX_ARRIVAL_SPAN_S, Workload
from llmbench.bench.workload.lengths import sample_lengths
from llmbench.bench.workload.spec import Encoder, RequestSpec
from llmbench.bench.workload.synthetic import Fits
from llmbench.models.tokenizer import has_tokenizer_files, text_needs_tokenizer


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


def read_text(path: Path) -> str:
    """The whole file as UTF-8 text (a leading byte-order mark dropped: spreadsheets write one). A file
    that cannot be read, or is not UTF-8, is a WorkloadError naming it, the line and the offending byte."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        line = data.count(b"\n", 0, at) + 1
        raise WorkloadError(
            f"{path}:{line}: not a UTF-8 text file (byte 0x{data[at]:02x} at position {at}); "
            "workload files are read as UTF-8"
        ) from None


def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    records = []
    # newline=None: lines end at \n, \r\n or \r, as a file opened in text mode reads them
    for lineno, line in enumerate(io.StringIO(read_text(path), newline=None), 1):
        if not line.strip():
            continue
        try:
            records.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return records


class _Prompt(NamedTuple):
    where: str  # file:line
    ids: list[int] | None  # token ids the file gives, checked against the vocabulary
    text: str | None  # or text, left for the tokenizer
    output_len: int | None


def _prompt_records(path: Path, vocab_size: int) -> list[_Prompt]:
    """A prompt file's records as read: token ids (checked against the vocabulary) or text, no tokenizer."""
    if path.suffix not in (".jsonl", ".json", ".ndjson"):
        lines = read_text(path).splitlines()
        return [_Prompt(f"{path}:{i}", None, line, None) for i, line in enumerate(lines, 1) if line.strip()]
    prompts = []
    for lineno, rec in _read_jsonl(path):
        where = f"{path}:{lineno}"
        if not isinstance(rec, dict):
            raise WorkloadError(
                f"{where}: each line must be a JSON object with 'prompt' or 'prompt_token_ids'"
            )
        ids = text = None
        if "prompt_token_ids" in rec:
            ids = _token_ids(rec["prompt_token_ids"], where, vocab_size)
        elif isinstance(rec.get("prompt"), list):
            ids = _token_ids(rec["prompt"], where, vocab_size)
        elif isinstance(rec.get("prompt"), str) and rec["prompt"]:
            text = rec["prompt"]
        else:
            raise WorkloadError(f"{where}: needs 'prompt' (text or token ids) or 'prompt_token_ids'")
        out = rec.get("output_len", rec.get("max_tokens"))
        prompts.append(
            _Prompt(where, ids, text, None if out is None else _positive_int(out, where, "output_len"))
        )
    return prompts


def _folder_without_tokenizer(model: str) -> Path | None:
    """The model's folder when it has no tokenizer files (a preset, or a model the backend names
    otherwise, gives None: the byte-level tokenizer, or the backend, decides)."""
    from llmbench.models.registry import UnknownModelError, resolve_model

    try:
        folder = resolve_model(model)[1]
    except UnknownModelError:  # a served model only a remote server knows: its backend says what it needs
        return None
    return folder if folder is not None and not has_tokenizer_files(folder) else None


def check_prompt_file(workload: Workload, vocab_size: int, model: str | None = None) -> None:
    """Read a workload's file (prompts, ShareGPT, trace) and check it as its reader will, without a
    tokenizer: token ids against the vocabulary and, given the ``model``, that no text prompt (a prompt
    file's text, every ShareGPT prompt) meets a model folder without tokenizer files. The runner calls it
    before the backend starts, so a bad file is an error before any cost."""
    text_at = None  # where the first text prompt is
    if workload.source == "trace":
        _trace_rows(workload)
    elif workload.source == "file":
        prompts = _prompt_records(Path(workload.path), vocab_size)
        text_at = next((p.where for p in prompts if p.text is not None), None)
    elif workload.source == "sharegpt":
        _conversations(Path(workload.path))
        text_at = f"{workload.path} (ShareGPT prompts are text)"
    folder = _folder_without_tokenizer(model) if text_at is not None and model is not None else None
    if folder is not None:
        raise WorkloadError(f"{text_at}: {text_needs_tokenizer(folder)}")


def prompt_file_requests(
    workload: Workload, encoder: Encoder, vocab_size: int, rng: np.random.Generator
) -> list[RequestSpec]:
    """JSONL records ``{"prompt": "text" | [ids], "prompt_token_ids": [ids], "output_len": N}``, or plain text."""
    path = Path(workload.path)
    prompts = []
    for p in _prompt_records(path, vocab_size):
        ids = p.ids if p.text is None else encoder.encode(p.text)
        if ids:
            prompts.append((ids, p.output_len))
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


_SHAREGPT_FORMS = "a JSON list of conversations, or JSONL (one conversation a line) in a .jsonl file"


def _conversations(path: Path) -> list[Any]:
    """A ShareGPT file's conversations: JSONL (.jsonl, .ndjson) one a line, else one JSON list."""
    if path.suffix in (".jsonl", ".ndjson"):
        return [conv for _, conv in _read_jsonl(path)]
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        hint = f"; a ShareGPT file is {_SHAREGPT_FORMS}" if exc.msg == "Extra data" else ""
        raise WorkloadError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}){hint}") from None
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: a ShareGPT file is {_SHAREGPT_FORMS}; got one {type(data).__name__}")
    return data


def sharegpt_requests(workload: Workload, encoder: Encoder, rng: np.random.Generator) -> list[RequestSpec]:
    """First user turn as the prompt; the first reply's token count as the output length."""
    path = Path(workload.path)
    pairs: list[tuple[list[int], int]] = []
    for conv in _conversations(path):
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


def _trace_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file:line, record) per row of a trace: JSONL (.jsonl, .json, .ndjson) or CSV with a header."""
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        rows = []
        for lineno, rec in _read_jsonl(path):
            if not isinstance(rec, dict):
                raise WorkloadError(f"{path}:{lineno}: each line must be a JSON object")
            rows.append((f"{path}:{lineno}", rec))
        return rows
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))  # newline="": as csv reads files
    header = reader.fieldnames or []
    missing = [c for c in _TRACE_COLUMNS if c not in header]
    if missing:
        raise WorkloadError(
            f"{path}: a trace CSV needs the columns {', '.join(_TRACE_COLUMNS)}; missing: {', '.join(missing)}"
        )
    rows = []
    for rec in reader:
        where = f"{path}:{reader.line_num}"  # the line the row ends on (blank lines are skipped)
        if None in rec:  # DictReader files fields past the header's under None
            raise WorkloadError(
                f"{where}: {len(header) + len(rec[None])} fields, but the header names {len(header)} "
                f"({', '.join(header)})"
            )
        rows.append((where, rec))
    return rows


def _trace_rows(workload: Workload) -> list[tuple[float, int, int]]:
    """(timestamp, input_len, output_len) of the rows a trace replays, checked: timestamps are seconds,
    at least 0 and never decreasing (a row out of order is an error, not sorted: a trace is a recording,
    and one out of order is not the recording it claims to be), spanning at most ``MAX_ARRIVAL_SPAN_S``."""
    path = Path(workload.path)
    parsed: list[tuple[float, int, int]] = []
    for where, rec in _trace_lines(path):
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
        if not math.isfinite(t) or t < 0:
            raise WorkloadError(
                f"{where}: timestamp must be a finite number of seconds >= 0, got {rec['timestamp']!r}"
            )
        if parsed and t < parsed[-1][0]:
            raise WorkloadError(
                f"{where}: timestamp {t:g} comes before the previous row's {parsed[-1][0]:g}; a trace is a "
                "recording, its timestamps never decrease: sort the file by timestamp"
            )
        parsed.append(
            (t, _positive_int(lens[0], where, "input_len"), _positive_int(lens[1], where, "output_len"))
        )
    if not parsed:
        raise WorkloadError(f"{path}: the trace holds no row")
    if workload.num_requests is not None:
        parsed = parsed[: workload.num_requests]
    span = (parsed[-1][0] - parsed[0][0]) * (workload.time_scale or 1.0)
    if span > MAX_ARRIVAL_SPAN_S:
        raise WorkloadError(
            f"{path}: its arrivals span {span / 3600:,.0f} hours; timestamps are seconds (if these are "
            "milliseconds, set workload.time_scale: 0.001), or replay a part of it with "
            f"workload.num_requests (the limit is {MAX_ARRIVAL_SPAN_S / 3600:g} hours)"
        )
    return parsed


def trace_requests(
    workload: Workload,
    vocab_size: int,
    token_rng: np.random.Generator,
    fits: Fits | None = None,
) -> list[RequestSpec]:
    """Rows of ``timestamp, input_len, output_len`` in file order (``_trace_rows``); arrivals are offsets
    from the first timestamp. ``fits`` (see ``build_requests``) sees each row's lengths before its tokens
    are drawn."""
    parsed = _trace_rows(workload)
    for k, (_, inp, out) in enumerate(parsed):
        if fits is not None:
            fits(str(k), inp, out)
    t0 = parsed[0][0]
    scale = workload.time_scale or 1.0
    return [
        RequestSpec(str(k), token_rng.integers(0, vocab_size, size=inp).tolist(), out, (t - t0) * scale)
        for k, (t, inp, out) in enumerate(parsed)
    ]
