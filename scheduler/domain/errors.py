"""Typed domain errors raised by services; the API maps them to HTTP at its boundary only."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Self

from jobspec.issues import SpecIssue


def request_issue(issue: SpecIssue) -> dict[str, Any]:
    """`issue` as a refused request lists it in `details.issues` (`api.schemas.ErrorDetails`): its code, field,
    message and hint. A request's issue names one field and is an error, so `fields` and `severity` would add
    nothing; a job spec's issues carry all six keys (`SpecIssue.to_dict`)."""
    return {"code": issue.code, "field": issue.field, "message": issue.message, "hint": issue.hint}


class DomainError(Exception):
    """Base: a stable code, a message for people, structured details. `issues`: what the request got wrong,
    each a `SpecIssue` naming its field, listed first in `details` (as `request_issue` writes them)."""

    code = "error"
    status_code = 400

    def __init__(
        self, message: str, *, code: str | None = None, details: Any = None, issues: Iterable[SpecIssue] = ()
    ) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        listed = [request_issue(i) for i in issues]
        self.details = {"issues": listed, **(details or {})} if listed else details

    @classmethod
    def naming(cls, field: str, message: str, hint: str, *, code: str | None = None) -> Self:
        """This error for one field of a request: `message`, and the one issue naming `field` with the error's
        code, message and `hint`."""
        code = code or cls.code
        return cls(message, code=code, issues=[SpecIssue(code, field, message, hint)])


class NotFound(DomainError):
    code = "not_found"
    status_code = 404


class Conflict(DomainError):
    code = "conflict"
    status_code = 409


class InvalidTransition(Conflict):
    code = "job.invalid_transition"


class PermissionDenied(DomainError):
    code = "permission_denied"
    status_code = 403


class Unauthenticated(DomainError):
    code = "unauthenticated"
    status_code = 401


class InvalidRequest(DomainError):
    """A request that is well-formed JSON but asks for something that cannot be."""

    code = "request.invalid"
    status_code = 422


class InvalidSpec(DomainError):
    """The job spec (or a reference inside it) is wrong; details lists every issue. `understood` carries
    what the rest of the spec says (`jobspec.SpecError.understood`) for the dry run; it is not part of
    the error body."""

    code = "spec.invalid"
    status_code = 422
    understood: Any = None

    def renamed(self, name: Callable[[str], str]) -> InvalidSpec:
        """This refusal for a request that names the spec's fields its own way: each issue's field is
        `name(flag)`, of the flag it names (`hf-checkpoint`; "" for an issue of no field)."""
        details = dict(self.details) if isinstance(self.details, dict) else {}
        details["issues"] = [
            {**issue, "field": name(str(issue.get("field") or "").lstrip("-").replace("_", "-"))}
            for issue in details.get("issues") or []
        ]
        return InvalidSpec(self.message, code=self.code, details=details)
