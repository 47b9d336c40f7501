"""Webhook endpoints of a team and their delivery log (`/v1/webhooks`; docs/reference/webhooks.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from api.schemas import RequestBody
from api.schemas.evals import WebhookEvalData
from scheduler.domain.jobs import FailureReason, JobStatus


class WebhookCreate(RequestBody):
    url: str = Field(
        max_length=2000,
        description="An http:// or https:// URL that accepts POST; it receives JSON messages.",
    )
    event_types: list[str] | None = Field(
        None,
        max_length=50,
        description="Event types it receives (e.g. job.succeeded, job.failed) or whole groups (job.*); "
        "leave it out for every type.",
    )
    description: str | None = Field(None, max_length=200)
    team: str | None = Field(None, description="Admins: the team (name or id); default: yours.")


class WebhookUpdate(RequestBody):
    """What to change; the fields left out stay as they are."""

    url: str | None = Field(None, max_length=2000, description="A new http:// or https:// URL.")
    event_types: list[str] | None = Field(
        None, max_length=50, description="The new filter; null: every event type."
    )
    description: str | None = Field(None, max_length=200)
    disabled: bool | None = Field(
        None, description="true: no new deliveries, and pending ones fail at their next attempt."
    )


class WebhookPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    team_id: str
    url: str
    description: str | None
    event_types: list[str] | None = Field(description="null: every event type.")
    disabled: bool
    created_at: datetime
    created_by: str | None = Field(description="Id of the key that created it.")


class WebhookCreated(WebhookPublic):
    secret: str = Field(
        description="The signing secret (whsec_…), shown once: verify each message's webhook-signature with it."
    )


class WebhooksPage(BaseModel):
    data: list[WebhookPublic]


class WebhookJobData(BaseModel):
    """What a `job.*` message says of the job, as it was when its status changed."""

    id: str
    name: str
    team: str = Field(description="The team's id.")
    queue: str
    status: JobStatus
    previous_status: JobStatus | None
    reason: str | None = Field(description="Why it changed, as the job's events say.")
    failure_reason: FailureReason | None


class WebhookMessage(BaseModel):
    """The JSON body of a message (Standard Webhooks' shape: type, timestamp, data): `job.*` messages carry the
    job, `eval.completed` the eval and its verdict."""

    type: str = Field(description="The event type, e.g. job.succeeded, eval.completed.")
    timestamp: datetime = Field(description="When the event happened.")
    data: WebhookJobData | WebhookEvalData


class WebhookDeliveryPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str = Field(description="The message's webhook-id, the same on every attempt.")
    endpoint_id: str | None = Field(description="null: a message to one of its job's --notify-urls.")
    job_id: str | None
    url: str = Field(description="Where it is sent (an endpoint's URL when the message was made).")
    event_type: str
    payload: WebhookMessage = Field(description="The message's body, as sent.")
    state: Literal["pending", "delivered", "failed"]
    attempts: int
    next_attempt_at: datetime | None = Field(description="When a pending delivery is tried next.")
    last_attempt_at: datetime | None
    last_status_code: int | None = Field(description="The receiver's HTTP status at the last attempt.")
    last_error: str | None = Field(description="Why the last attempt failed (no answer, a non-2xx status).")
    created_at: datetime
    finished_at: datetime | None


class WebhookDeliveriesPage(BaseModel):
    data: list[WebhookDeliveryPublic]
    next_cursor: str | None = Field(None, description="Pass as `after` for the next page.")


class JobNotifications(BaseModel):
    """A job's `--notify-urls`: every status change of the job is POSTed to each, signed with the job's own
    secret."""

    job_id: str
    urls: list[str] = Field(description="The http(s) URLs of --notify-urls that get messages (at most 10).")
    secret: str = Field(
        description="The job's signing secret (whsec_…), derived from the platform's key: verify each message's "
        "webhook-signature with it, as for an endpoint's."
    )
