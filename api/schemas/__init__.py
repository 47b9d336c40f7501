"""Request and response models of the HTTP API (named <Thing>Create / <Thing>Public / <Things>Page)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

#: Labels of a job or a node: a few short names and values (they are shown, filtered on, stored as JSON).
Labels = Annotated[
    dict[Annotated[str, Field(max_length=100)], Annotated[str, Field(max_length=1000)]], Field(max_length=64)
]


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. spec.invalid, job.not_found.")
    message: str
    details: Any = Field(None, description="For validation errors: {issues: [{code, field, message, hint}]}.")
    request_id: str | None


class ErrorEnvelope(BaseModel):
    """Every error response has this shape."""

    error: ErrorBody


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorEnvelope, "description": "The body is not JSON where JSON is expected."},
    401: {"model": ErrorEnvelope, "description": "Missing or unknown API key."},
    403: {"model": ErrorEnvelope, "description": "The key may not do this."},
    404: {"model": ErrorEnvelope, "description": "No such object (or not visible to the key)."},
    409: {"model": ErrorEnvelope, "description": "Conflicts with the object's current state."},
    413: {"model": ErrorEnvelope, "description": "The request body is over the API's limit."},
    422: {
        "model": ErrorEnvelope,
        "description": "Invalid request or job spec; details.issues names each field.",
    },
    503: {
        "model": ErrorEnvelope,
        "description": "service.unavailable: the database or the broker (details.service) cannot be reached "
        "now; retry after the Retry-After header's seconds.",
    },
}
