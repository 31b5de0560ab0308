"""Pydantic validation errors rewritten for people: one line per problem, full field path first.

``workload.input_len.max: must be >= min (100), got 50``; an unknown key lists the keys allowed there;
a wrong value shows what was given. Tests protect these messages.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from llmbench.bench.scenario.fields import FieldIssue, FieldIssues
from llmbench.bench.scenario.schema import Scenario
from llmbench.suggest import did_you_mean


def format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _unwrap(annotation: Any) -> list[Any]:
    """The candidate types behind an annotation (Optional/Union members)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def model_at(loc: tuple[Any, ...], root: type[BaseModel] = Scenario) -> type[BaseModel] | None:
    """The schema model that a location points into, or None when it is not a model."""
    current: Any = root
    i = 0
    while i < len(loc):
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(loc[i]))
        if field is None:
            return None
        current = None
        for cand in _unwrap(field.annotation):
            origin = typing.get_origin(cand)
            if origin in (dict, list) and i + 1 < len(loc):
                current = typing.get_args(cand)[-1]
                i += 1  # the key or index
                break
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                current = cand
                break
        i += 1
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def nested_path(name: str, model: type[BaseModel], depth: int = 2) -> str | None:
    """The dotted path, from ``model``, of a field ``name`` that belongs one or two sections further in
    (``temperature`` -> ``sampling.temperature``), or None when no section holds exactly one such field."""
    found: list[str] = []
    if model is Scenario:  # the engine's options are a mapping the engine checks itself
        from llmbench.engine.config import ENGINE_CHECKS, TUNING_CHECKS

        found += [f"engine.{name}"] if name in ENGINE_CHECKS else []
        found += [f"engine.tuning.{name}"] if name in TUNING_CHECKS else []
        found += ["engine.tuning"] if name == "tuning" else []
    for field in model.model_fields:
        sub = model_at((field,), model)
        if sub is None or sub is model:
            continue
        if name in sub.model_fields:
            found.append(f"{field}.{name}")
        elif depth > 1 and (deeper := nested_path(name, sub, depth - 1)):
            found.append(f"{field}.{deeper}")
    return found[0] if len(found) == 1 else None


# A bound pydantic reports -> the attribute of the field's bounds on the other side, and pydantic's words.
_OTHER_BOUND = {
    "greater_than": (("le", "less than or equal to"), ("lt", "less than")),
    "greater_than_equal": (("le", "less than or equal to"), ("lt", "less than")),
    "less_than": (("ge", "greater than or equal to"), ("gt", "greater than")),
    "less_than_equal": (("ge", "greater than or equal to"), ("gt", "greater than")),
}


def _both_bounds(loc: tuple[Any, ...], kind: str, message: str) -> str:
    """A bound's message with the field's other bound too, lower bound first, so it gives the whole range:
    ``Input should be greater than or equal to 0 and less than or equal to 1000000``. As it is when the
    field has no bound on the other side."""
    if kind not in _OTHER_BOUND or not loc:
        return message
    model = model_at(loc[:-1])
    field = model.model_fields.get(str(loc[-1])) if model is not None else None
    if field is None:
        return message
    for constraint in field.metadata:
        for attr, words in _OTHER_BOUND[kind]:
            bound = getattr(constraint, attr, None)
            if bound is not None:
                other = f"{words} {bound:g}" if isinstance(bound, float) else f"{words} {bound}"
                if kind.startswith("greater"):
                    return f"{message} and {other}"
                return f"{message.replace('Input should be ', f'Input should be {other} and ', 1)}"
    return message


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(error: dict[str, Any]) -> tuple[str, str]:
    """(path, message) for one pydantic error."""
    loc = tuple(error.get("loc", ()))
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, FieldIssue):
        return format_loc((*loc, cause.field)), str(cause)
    if isinstance(cause, Exception):
        return format_loc(loc), str(cause)
    if kind == "extra_forbidden":
        model = model_at(loc[:-1])
        allowed = ", ".join(model.model_fields) if model is not None else "see the scenario reference"
        near = did_you_mean(str(loc[-1]), model.model_fields) if model is not None and loc else ""
        if model is not None and loc and not near:  # a key set in the wrong section
            inner = nested_path(str(loc[-1]), model)
            where = format_loc((*loc[:-1], *inner.split("."))) if inner else None
            where = where or (nested_path(str(loc[-1]), Scenario) if model is not Scenario else None)
            near = f" (did you mean {where!r}?)" if where else ""
        return format_loc(loc), f"unknown key{near}; allowed here: {allowed}"
    if kind == "missing":
        return format_loc(loc), "required"
    message = _both_bounds(loc, kind, str(error.get("msg", "invalid value")))
    if "input" in error and kind not in ("missing",):
        message += f" (got {_show(error['input'])})"
    return format_loc(loc), message


def describe_all(error: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, message) for each problem one pydantic error stands for (several for ``FieldIssues``)."""
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, FieldIssues):
        loc = tuple(error.get("loc", ()))
        return [(format_loc((*loc, *field.split("."))), message) for field, message in cause.issues]
    return [describe(error)]


_REASON = re.compile(r", (unable|got|input) .*$")


def _union_member(loc: tuple[Any, ...]) -> bool:
    """Whether the last part of ``loc`` is the tag pydantic gives one member of a union field (``int``,
    ``literal['engine']``), not a field or an index."""
    if len(loc) < 2 or not isinstance(loc[-1], str):
        return False
    model = model_at(loc[:-2])
    field = model.model_fields.get(str(loc[-2])) if model is not None else None
    return field is not None and len(_unwrap(field.annotation)) > 1


def _merge_unions(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One error per union field that no member accepted: ``Input should be a valid integer or 'engine'
    (got 'abc')`` rather than one line per member, each under a type's name."""
    out: list[dict[str, Any]] = []
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for err in errors:
        loc = tuple(err.get("loc", ()))
        msg = str(err.get("msg", ""))
        if not _union_member(loc) or not msg.startswith("Input should be "):
            out.append(err)
            continue
        head = loc[:-1]
        msg = _REASON.sub("", msg)  # "a valid integer, unable to parse ...": what it should be is enough
        if head in merged:
            merged[head]["msg"] += f" or {msg.removeprefix('Input should be ')}"
        else:
            merged[head] = {**err, "loc": head, "type": "union", "msg": msg}
            out.append(merged[head])
    return out


def problem_lines(exc: ValidationError, section: tuple[str, ...] = ()) -> list[str]:
    """``path: message`` for each problem, each once; ``section``: where in a scenario the model that
    raised ``exc`` sits (``("sampling",)`` for a :class:`Sampling` validated alone)."""
    lines: list[str] = []
    errors = [{**e, "loc": (*section, *e.get("loc", ()))} for e in exc.errors(include_url=False)]
    for err in _merge_unions(errors):
        for path, message in describe_all(err):
            if (line := f"{path}: {message}") not in lines:
                lines.append(line)
    return lines


def format_validation_error(exc: ValidationError, origin: str) -> str:
    return "\n".join([f"Invalid scenario {origin}:", *(f"  {line}" for line in problem_lines(exc))])
