"""Typed domain errors raised by services; the API maps them to HTTP at its boundary only."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """Base: a stable code, a message for people, structured details."""

    code = "error"
    status_code = 400

    def __init__(self, message: str, *, code: str | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.details = details


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
