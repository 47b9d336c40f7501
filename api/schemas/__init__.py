"""Request and response models of the HTTP API (named <Thing>Create / <Thing>Public / <Things>Page)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from jobspec.issues import SpecIssue
from wire.jobs import JobStatus

#: Labels of a job or a node: a few short names and values (they are shown, filtered on, stored as JSON).
Labels = Annotated[
    dict[Annotated[str, Field(max_length=100)], Annotated[str, Field(max_length=1000)]], Field(max_length=64)
]


class RequestBody(BaseModel):
    """A request's body, or an object inside one: a field it does not declare is refused (422), not ignored."""

    model_config = ConfigDict(extra="forbid")


class ErrorDetails(BaseModel):
    """What an error adds to its message: the issues of an invalid request or spec, and keys of the error's own
    (the service that is unavailable, the state that conflicts ...). No `extra="allow"` here, though other keys
    come: a dataclass inside takes its model's config, and `SpecIssue` would become an open object everywhere."""

    issues: list[SpecIssue] | None = Field(
        None,
        description="For validation errors: each problem, naming its field. A job spec's issues carry all six "
        "keys; a request's carry code, field, message and hint.",
    )


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. spec.invalid, job.not_found.")
    message: str
    details: ErrorDetails | None = None
    request_id: str | None


class ErrorEnvelope(BaseModel):
    """Every error response has this shape."""

    error: ErrorBody


def error_responses(model: type[BaseModel], descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """A router's `responses`: each error status with its description, answered in `model`'s shape."""
    return {status: {"model": model, "description": text} for status, text in descriptions.items()}


ERROR_RESPONSES = error_responses(
    ErrorEnvelope,
    {
        400: "The body is not JSON where JSON is expected.",
        401: "Missing or unknown API key.",
        403: "The key may not do this.",
        404: "No such object (or not visible to the key).",
        409: "Conflicts with the object's current state.",
        413: "The request body is over the API's limit.",
        422: "Invalid request or job spec; details.issues names each field.",
        503: "service.unavailable: the database or the broker (details.service) cannot be reached now; retry "
        "after the Retry-After header's seconds.",
    },
)

#: Components the OpenAPI document lists beside those the routes name: sets of the domain's values that the
#: dashboard reads as lists (web/scripts/gen-api.sh generates each as `<name>Values`), taken from their one
#: declaration (docs/adr/0012).
EXTRA_COMPONENTS: dict[str, dict[str, Any]] = {
    "TerminalJobStatus": {
        "description": "The statuses a job ends in (`wire.jobs.TERMINAL`): no transition leaves them.",
        "enum": [s.value for s in JobStatus if s.is_terminal()],
        "title": "TerminalJobStatus",
        "type": "string",
    },
    "SlotHoldingJobStatus": {
        "description": "The statuses in which a job holds its slots on a pool (`wire.jobs.HOLDING_SLOTS`).",
        "enum": [s.value for s in JobStatus if s.holds_slots()],
        "title": "SlotHoldingJobStatus",
        "type": "string",
    },
}
