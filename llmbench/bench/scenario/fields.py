"""What every scenario model shares: unknown keys forbidden, values frozen, and complaints that name
the field they are about (``FieldIssue``), so that the error printed carries its full path
(``workload.input_len.max``) rather than the enclosing mapping's."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


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


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

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
