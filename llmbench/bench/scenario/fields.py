"""What every scenario model shares: unknown keys forbidden, values frozen, types taken strictly, and
complaints that name the field they are about (``FieldIssue``), so that the error printed carries its full
path (``workload.input_len.max``) rather than the enclosing mapping's.

Strict types, as the engine's own checks take its options: a number is never a boolean (``true`` is not 1)
or a string (``'0.5'``), a boolean is never a number or a string (``1``, ``'off'``). An integer is a
number; a whole float is an integer (``1e4``, as YAML writes a large count).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

# Floats past this are not all whole numbers a float holds exactly (2**53): left as floats, to be refused
# as what they were written as rather than turned into an integer the user never wrote.
_EXACT_FLOAT = 2**53


class FieldIssue(ValueError):
    """A validator's complaint about one field of the model being validated."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class FieldIssues(ValueError):
    """Several complaints about fields below the one being validated, reported together (the engine's
    options: each bad one with its path, ``tuning.skinny_fusion``)."""

    def __init__(self, issues: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in issues))
        self.issues = issues


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types a union annotation allows (the annotation itself when it is not a union)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def whole_floats_to_int(value: Any, annotation: Any) -> Any:
    """``value`` with its whole floats made integers where ``annotation`` takes an integer and no float
    (``1e4`` for ``int | None``, or in a list for ``list[int]``); anything else as it is."""
    members = _members(annotation)

    def whole(v: Any) -> bool:
        return isinstance(v, float) and v.is_integer() and abs(v) <= _EXACT_FLOAT

    if int in members and float not in members and whole(value):
        return int(value)
    takes_int_list = any(typing.get_origin(m) is list and typing.get_args(m) == (int,) for m in members)
    if takes_int_list and isinstance(value, list):
        return [int(v) if whole(v) else v for v in value]
    return value


class StrictModel(BaseModel):
    """A scenario or a section of one: unknown keys forbidden, values frozen and of the type each field
    says."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _whole_floats(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        return value if field is None else whole_floats_to_int(value, field.annotation)

    def _fields_fit(self, key: str, required: set[str], optional: set[str]) -> None:
        """Raise the first field that the value of ``key`` (a dist, a source, a kind) needs and lacks, or
        has and does not take; every field but ``key`` counts."""
        given = {name for name in type(self).model_fields if name != key and getattr(self, name) is not None}
        what = f"{key} '{getattr(self, key)}'"
        takes = ", ".join(sorted(required) + [f"{o} (optional)" for o in sorted(optional)]) or "nothing else"
        for name in sorted(required - given):
            raise FieldIssue(name, f"required for {what} (it takes: {takes})")
        for name in sorted(given - required - optional):
            raise FieldIssue(name, f"does not apply to {what} (it takes: {takes})")
