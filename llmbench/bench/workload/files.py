"""Workloads read from files: prompt lists (JSON records or text) and arrival traces (ShareGPT
conversations: ``sharegpt.py``), and the check of every workload file before the backend starts.

Prompt files and JSON traces hold records as JSONL (one a line) or, in a ``.json`` file, also as one
JSON array (``reading.py``). Each reader returns :class:`RequestSpec`s in file order (a seeded draw of
prompts where ``num_requests`` asks for one; a trace's first rows); a malformed file is a
:class:`WorkloadError` naming the file, the line (or record) and what was expected. Token ids given in a
prompt file are checked against the model's vocabulary, and text prompts against a model folder's
tokenizer (its files exist and load: ``check_prompt_file`` does both before the backend starts).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from llmbench.bench.errors import WorkloadError
from llmbench.bench.scenario.workload_schema import MAX_ARRIVAL_SPAN_S, Workload
from llmbench.bench.workload.lengths import sample_lengths
from llmbench.bench.workload.reading import JSON_SUFFIXES, choose, read_records, read_text
from llmbench.bench.workload.sharegpt import conversations
from llmbench.bench.workload.spec import Built, Encoder, Fits, RequestSpec, byte_level_note, require_fit
from llmbench.models.errors import ModelError
from llmbench.models.tokenizer import has_tokenizer_files, load_tokenizer, text_needs_tokenizer


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


class _Prompt(NamedTuple):
    where: str  # file:line, or file: record N
    ids: list[int] | None  # token ids the file gives, checked against the vocabulary
    text: str | None  # or text, left for the tokenizer
    output_len: int | None


def _prompt_records(path: Path, vocab_size: int) -> list[_Prompt]:
    """A prompt file's records as read: token ids (checked against the vocabulary) or text, no tokenizer."""
    if path.suffix not in JSON_SUFFIXES:
        lines = read_text(path).splitlines()
        return [_Prompt(f"{path}:{i}", None, line, None) for i, line in enumerate(lines, 1) if line.strip()]
    prompts = []
    for where, rec in read_records(path, "prompt"):
        if not isinstance(rec, dict):
            raise WorkloadError(
                f"{where}: each record must be a JSON object with 'prompt' or 'prompt_token_ids'"
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


def tokenizer_problem(model: str, vocab_size: int) -> str | None:
    """Why the model cannot encode a text prompt: its folder has no tokenizer files, or its tokenizer cannot
    be loaded (loaded here as the backend will load it; a token-id run never needs it). None for a preset,
    or a model the backend names otherwise: the byte-level tokenizer, or the backend, decides."""
    from llmbench.models.registry import UnknownModelError, resolve_model

    try:
        folder = resolve_model(model)[1]
    except UnknownModelError:  # a served model only a remote server knows: its backend says what it needs
        return None
    if folder is None:
        return None
    if not has_tokenizer_files(folder):
        return text_needs_tokenizer(folder)
    try:
        load_tokenizer(folder, vocab_size)
    except ModelError as exc:
        return f"a text prompt needs the model's tokenizer: {exc}"
    return None


def check_prompt_file(workload: Workload, vocab_size: int, model: str | None = None) -> None:
    """Read a workload's file (prompts, ShareGPT, trace) and check it as its reader will, without a
    tokenizer: token ids against the vocabulary and, given the ``model``, that no text prompt (a prompt
    file's text, every ShareGPT prompt) meets a model folder without tokenizer files or whose tokenizer
    cannot be loaded. The runner calls it before the backend starts, so a bad file is an error before any
    cost."""
    text_at = None  # where the first text prompt is
    if workload.source == "trace":
        _trace_rows(workload)
    elif workload.source == "file":
        prompts = _prompt_records(Path(workload.path), vocab_size)
        text_at = next((p.where for p in prompts if p.text is not None), None)
    elif workload.source == "sharegpt":
        conversations(Path(workload.path))
        text_at = f"{workload.path} (ShareGPT prompts are text)"
    problem = tokenizer_problem(model, vocab_size) if text_at is not None and model is not None else None
    if problem is not None:
        raise WorkloadError(f"{text_at}: {problem}")


def prompt_file_requests(
    workload: Workload, encoder: Encoder, vocab_size: int, rng: np.random.Generator
) -> Built:
    """JSON records ``{"prompt": "text" | [ids], "prompt_token_ids": [ids], "output_len": N}`` (JSONL, or
    one array in a .json file), or plain text, one prompt a line. A text prompt that the model's tokenizer
    encodes to no token is left out and counted in a warning; all of them is an error."""
    path = Path(workload.path)
    prompts, empty = [], []
    records = _prompt_records(path, vocab_size)
    for p in records:
        ids = p.ids if p.text is None else encoder.encode(p.text)
        if ids:
            prompts.append((ids, p.output_len))
        else:
            empty.append(p.where)
    if not prompts and empty:
        raise WorkloadError(
            f"{path}: every one of its {len(records)} prompts encodes to no token with the model's tokenizer "
            f"(e.g. {empty[0]}): is the tokenizer the model's, and complete?"
        )
    if not prompts:
        raise WorkloadError(f"{path}: holds no prompt")
    if any(out is None for _, out in prompts) and workload.output_len is None:
        raise WorkloadError(f"{path}: some prompts give no output_len; set workload.output_len for them")
    chosen = choose(len(prompts), workload.num_requests, rng)
    fill = sample_lengths(workload.output_len, len(chosen), rng) if workload.output_len else None
    specs = []
    for k, idx in enumerate(chosen):
        ids, out = prompts[idx]
        specs.append(RequestSpec(str(k), ids, out if out is not None else int(fill[k])))
    left = (
        [f"{path}: {len(empty)} of its {len(records)} prompts encode to no token with the model's tokenizer and "
         f"are left out ({', '.join(empty[:3])}{', ...' if len(empty) > 3 else ''})"]
        if empty else []
    )  # fmt: skip
    if any(p.text is not None for p in records):
        left += byte_level_note(encoder, str(path))
    return Built(specs, left)


_TRACE_COLUMNS = ("timestamp", "input_len", "output_len")


def _trace_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, record) per row of a trace: JSON records (``read_records``: .jsonl, .json, .ndjson) or CSV
    with a header (where: file:line)."""
    if path.suffix in JSON_SUFFIXES:
        rows = []
        for where, rec in read_records(path, "trace"):
            if not isinstance(rec, dict):
                raise WorkloadError(f"{where}: each record must be a JSON object")
            rows.append((where, rec))
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
    """(timestamp, input_len, output_len) of the rows a trace replays (all, or the first
    ``num_requests``), checked: timestamps are seconds, at least 0 and never decreasing (a row out of order
    is an error, not sorted: a trace is a recording, and one out of order is not the recording it claims to
    be), spanning at most ``MAX_ARRIVAL_SPAN_S``; ``num_requests`` past the rows is an error (replayed
    again, the timestamps would go back: the trace's load cannot be extended that way)."""
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
    wanted = workload.num_requests
    if wanted is not None and wanted > len(parsed):
        rows = f"{len(parsed)} row{'s' if len(parsed) > 1 else ''}"
        raise WorkloadError(
            f"{path}: workload.num_requests is {wanted}, but the trace has {rows}; a trace replays its rows "
            f"once, in order (its timestamps cannot repeat): give num_requests <= {len(parsed)}, or leave it "
            "out to replay every row"
        )
    parsed = parsed[:wanted]
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
    from the first timestamp, stretched by ``time_scale`` (``arrival.kind: trace`` replays them; other
    arrivals keep only the lengths). ``fits`` (see ``build_workload``) sees each row's lengths before its
    tokens are drawn."""
    parsed = _trace_rows(workload)
    for k, (_, inp, out) in enumerate(parsed):
        require_fit(fits, str(k), inp, out)
    t0 = parsed[0][0]
    scale = workload.time_scale or 1.0
    return [
        RequestSpec(str(k), token_rng.integers(0, vocab_size, size=inp).tolist(), out, (t - t0) * scale)
        for k, (t, inp, out) in enumerate(parsed)
    ]
