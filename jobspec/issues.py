"""Spec issues: the one shape every validation problem is reported in, and the error that carries them."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class SpecIssue:
    """One problem found in a job spec.

    `code` is a stable dotted identifier (``spec.*`` for single-field problems, ``argv.*`` for
    command-line syntax, ``rule.*`` for cross-field rules, ``demand.*`` for GPU topology);
    `field` is the Relax flag name with hyphens (``rollout-batch-size``), and `fields` lists every
    flag a multi-field rule involves (it always contains `field` when `field` is set).
    """

    code: str
    field: str | None
    message: str
    hint: str = ""
    severity: Severity = "error"
    fields: list[str] = dc_field(default_factory=list)

    def __post_init__(self) -> None:
        if self.field and self.field not in self.fields:
            object.__setattr__(self, "fields", [self.field, *self.fields])

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "field": self.field,
            "fields": list(self.fields),
            "message": self.message,
            "hint": self.hint,
            "severity": self.severity,
        }

    def __str__(self) -> str:
        hint = f" (hint: {self.hint})" if self.hint else ""
        return f"[{self.severity}] {self.code}: {self.message}{hint}"


@dataclass(frozen=True)
class Understood:
    """What a spec with errors still says (see `SpecError.understood`): every field as understood (values
    that failed their check at their defaults), their flags as `JobSpec.to_argv()` writes them, what the
    rules derived, and the resource demand when a layout can be computed."""

    spec: dict[str, Any]
    argv: list[str]
    derived: dict[str, Any] = dc_field(default_factory=dict)
    demand: dict[str, Any] | None = None


class SpecError(Exception):
    """Raised by `normalize` when a spec has at least one error.

    `issues` holds every issue found (errors first, then warnings), not just the first one, one per
    mistake; `understood` what the rest of the spec says, when anything of it was understood.
    """

    def __init__(self, issues: list[SpecIssue], understood: Understood | None = None):
        ordered = [i for i in issues if i.is_error] + [i for i in issues if not i.is_error]
        self.issues: list[SpecIssue] = ordered
        self.understood = understood
        errors = [i for i in ordered if i.is_error]
        head = f"{len(errors)} error(s) in job spec"
        super().__init__(head + ":\n" + "\n".join(f"  {i}" for i in errors))

    @property
    def errors(self) -> list[SpecIssue]:
        return [i for i in self.issues if i.is_error]

    def to_dict(self) -> dict[str, Any]:
        return {"issues": [i.to_dict() for i in self.issues]}
