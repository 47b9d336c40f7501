"""Routes of a team's webhooks: endpoints, their delivery log, a manual retry (docs/reference/webhooks.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from api.deps import AuditDep, PrincipalDep, SessionDep, SettingsDep
from api.schemas import ERROR_RESPONSES
from api.schemas.webhooks import (
    JobNotifications,
    WebhookCreate,
    WebhookCreated,
    WebhookDeliveriesPage,
    WebhookDeliveryPublic,
    WebhookPublic,
    WebhooksPage,
    WebhookUpdate,
)
from scheduler.services import webhooks

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], responses=ERROR_RESPONSES)


# The query of a delivery log (an endpoint's, a job's --notify-urls')
DeliveryState = Literal["pending", "delivered", "failed"] | None
DeliveryCursor = Annotated[
    str | None, Query(max_length=40, description="Id of the last delivery of the previous page.")
]
PageLimit = Annotated[int, Query(ge=1, le=500)]


def _delivery_query(
    state: DeliveryState = None, after: DeliveryCursor = None, limit: PageLimit = 50
) -> webhooks.DeliveryQuery:
    return webhooks.DeliveryQuery(state=state, after=after, limit=limit)


DeliveryQuery = Annotated[webhooks.DeliveryQuery, Depends(_delivery_query)]


@router.post("", status_code=201, response_model=WebhookCreated)
def create_webhook(
    body: WebhookCreate, session: SessionDep, principal: PrincipalDep, settings: SettingsDep, audit: AuditDep
) -> WebhookCreated:
    """A URL that receives the team's events, signed as Standard Webhooks specifies. The answer holds the
    signing secret, once."""
    audit.note(team=body.team, event_types=body.event_types)
    endpoint = webhooks.create_endpoint(
        session,
        principal,
        url=body.url,
        event_types=body.event_types,
        description=body.description,
        team=body.team,
        max_per_team=settings.webhooks.max_endpoints_per_team,
    )
    audit.note(target=endpoint.id, team=endpoint.team_id)
    return WebhookCreated(**WebhookPublic.model_validate(endpoint).model_dump(), secret=endpoint.secret)


@router.get("", response_model=WebhooksPage)
def list_webhooks(
    session: SessionDep,
    principal: PrincipalDep,
    team: Annotated[str | None, Query(description="Admins: only this team's (name or id).")] = None,
) -> WebhooksPage:
    """The team's endpoints (an admin: every team's), without their secrets."""
    rows = webhooks.list_endpoints(session, principal, team=team)
    return WebhooksPage(data=[WebhookPublic.model_validate(r) for r in rows])


# A job's --notify-urls (declared before /{webhook_id}/... so that `jobs` is never read as an endpoint's id)
@router.get("/jobs/{job_id}", response_model=JobNotifications)
def get_job_notifications(
    job_id: str, session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> JobNotifications:
    """The URLs of a job's --notify-urls that get its status changes, and the job's secret that signs them."""
    job, urls, secret = webhooks.job_notifications(
        session, principal, job_id, signing_key=settings.signing_key()
    )
    return JobNotifications(job_id=job.id, urls=urls, secret=secret)


@router.get("/jobs/{job_id}/deliveries", response_model=WebhookDeliveriesPage)
def list_job_notification_deliveries(
    job_id: str, session: SessionDep, principal: PrincipalDep, query: DeliveryQuery
) -> WebhookDeliveriesPage:
    """The messages to the job's --notify-urls, newest first: each one's URL, payload, attempts and how it
    ended."""
    rows, cursor = webhooks.list_job_deliveries(session, principal, job_id, query)
    return _deliveries_page(rows, cursor)


@router.get("/{webhook_id}", response_model=WebhookPublic)
def get_webhook(webhook_id: str, session: SessionDep, principal: PrincipalDep) -> WebhookPublic:
    return WebhookPublic.model_validate(webhooks.get_endpoint(session, principal, webhook_id))


@router.patch("/{webhook_id}", response_model=WebhookPublic)
def update_webhook(
    webhook_id: str, body: WebhookUpdate, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> WebhookPublic:
    """Change the URL, the event types, the description, or disable (enable) the endpoint."""
    changes = body.model_dump(exclude_unset=True)
    if "url" in changes and changes["url"] is None:
        del changes["url"]
    audit.note(fields=sorted(changes), disabled=changes.get("disabled"))
    endpoint = webhooks.update_endpoint(session, principal, webhook_id, changes=changes)
    audit.note(team=endpoint.team_id)
    return WebhookPublic.model_validate(endpoint)


@router.delete("/{webhook_id}", response_model=WebhookPublic)
def delete_webhook(
    webhook_id: str, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> WebhookPublic:
    """Remove an endpoint and its delivery log; what it had pending is not sent."""
    endpoint = webhooks.delete_endpoint(session, principal, webhook_id)
    audit.note(team=endpoint.team_id)
    return WebhookPublic.model_validate(endpoint)


@router.get("/{webhook_id}/deliveries", response_model=WebhookDeliveriesPage)
def list_webhook_deliveries(
    webhook_id: str, session: SessionDep, principal: PrincipalDep, query: DeliveryQuery
) -> WebhookDeliveriesPage:
    """The endpoint's messages, newest first: each one's payload, attempts and how it ended."""
    rows, cursor = webhooks.list_deliveries(session, principal, webhook_id, query)
    return _deliveries_page(rows, cursor)


@router.post(
    "/{webhook_id}/deliveries/{delivery_id}/retry", status_code=202, response_model=WebhookDeliveryPublic
)
def retry_webhook_delivery(
    webhook_id: str, delivery_id: str, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> WebhookDeliveryPublic:
    """Send a delivered or failed message once more (the same webhook-id), within a tick of the scheduler."""
    delivery = webhooks.retry_delivery(session, principal, webhook_id, delivery_id)
    audit.note(endpoint=webhook_id)
    return WebhookDeliveryPublic.model_validate(delivery)


def _deliveries_page(rows: list, cursor: str | None) -> WebhookDeliveriesPage:  # type: ignore[type-arg]
    return WebhookDeliveriesPage(
        data=[WebhookDeliveryPublic.model_validate(r) for r in rows], next_cursor=cursor
    )
