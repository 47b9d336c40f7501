"""A team's webhook endpoints and their delivery log (`/v1/webhooks`), and the messages a job's status change
makes: one delivery row per endpoint of the job's team that wants the event, and one per `--notify-urls` URL of
the job (an ad-hoc endpoint of that job alone, signed with the job's own secret, `wh.job_secret`), written in the
transaction that changes the status (so none is lost) and sent once it commits
(scheduler/services/webhook_delivery.py; the beat's tick sends whatever is still due).

Who may: the writers of a team (admin, team admin, member) manage and read its endpoints: an endpoint's URL may
carry a token of the receiver. Another team's endpoint is answered as missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import Job, WebhookDelivery, WebhookEndpoint, utcnow
from scheduler.domain import webhooks as wh
from scheduler.domain.errors import Conflict, InvalidRequest, NotFound
from scheduler.domain.ids import new_id
from scheduler.domain.jobs import JobStatus
from scheduler.domain.roles import Action
from scheduler.services.auth import Principal, team_for
from scheduler.transactions import after_commit

_Row = TypeVar("_Row", WebhookEndpoint, Job)

log = logging.getLogger("relax.webhooks")

#: Who may manage and read a team's webhooks: its writers (a URL may carry the receiver's token).
MANAGE = Action.JOB_SUBMIT
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
MAX_NOTIFY_URLS = 10

_CACHE = "relax_webhook_endpoints"  # session.info: team id -> its enabled endpoints, read once a transaction
_sender: Callable[[str], None] | None = None


def set_sender(send: Callable[[str], None] | None) -> None:
    """How this process hands a delivery (by id) to a worker once its row is committed: the worker process sets
    it (scheduler/tasks.py). Without one (the API process) the beat's next tick sends it."""
    global _sender
    _sender = send


def _kick(ids: list[str]) -> None:
    send = _sender
    if send is None:
        return
    for delivery_id in ids:
        try:
            send(delivery_id)
        except Exception:  # noqa: BLE001 - the broker is away: the beat's tick sends it later
            log.warning("could not hand webhook delivery %s to a worker; the next tick will", delivery_id)
            return


def _invalid(message: str, field: str, hint: str, code: str = "webhook.invalid") -> InvalidRequest:
    return InvalidRequest.naming(field, message, hint, code=code)


def check_url(url: str, field: str = "url") -> None:
    problem = wh.url_problem(url)
    if problem is not None:
        raise _invalid(
            f"{field} {url[:200]!r} {problem}",
            field,
            "give an http:// or https:// URL of a server that accepts POST, e.g. https://ci.example.com/hooks",
            code="webhook.bad_url",
        )


# Endpoints -------------------------------------------------------------------------------------------------
def create_endpoint(
    session: Session,
    principal: Principal,
    *,
    url: str,
    event_types: list[str] | None,
    description: str | None,
    team: str | None,
    max_per_team: int,
) -> WebhookEndpoint:
    """A new endpoint of the caller's team (an admin: of `team`); its `secret` is shown to the caller once."""
    principal.require(MANAGE)
    target = team_for(session, principal, team)
    check_url(url)
    event_types = _checked_event_types(event_types)
    count = session.scalar(
        sa.select(sa.func.count()).select_from(WebhookEndpoint).where(WebhookEndpoint.team_id == target.id)
    )
    if (count or 0) >= max_per_team:
        raise Conflict(
            f"team {target.name!r} has {count} webhook endpoints, the most a team may have",
            code="webhook.too_many",
            details={
                "field": "url",
                "limit": max_per_team,
                "hint": "delete one it no longer needs (DELETE /v1/webhooks/{id}); one endpoint may take "
                "several event types",
            },
        )
    endpoint = WebhookEndpoint(
        id=new_id("wh"),
        team_id=target.id,
        url=url,
        description=description,
        event_types=event_types,
        secret=wh.new_secret(),
        disabled=False,
        created_by=principal.key_id,
    )
    session.add(endpoint)
    session.flush()
    session.info.pop(_CACHE, None)
    return endpoint


def list_endpoints(
    session: Session, principal: Principal, *, team: str | None = None
) -> list[WebhookEndpoint]:
    """The caller's team's endpoints; an admin's: every team's, or `team`'s."""
    principal.require(MANAGE)
    q = sa.select(WebhookEndpoint).order_by(WebhookEndpoint.id)
    if team is not None or not principal.is_admin:
        q = q.where(WebhookEndpoint.team_id == team_for(session, principal, team).id)
    return list(session.scalars(q))


def _managed(session: Session, principal: Principal, model: type[_Row], row_id: str, what: str) -> _Row:
    """The `model` row `row_id` of a team the caller manages webhooks of; else `<what>.not_found`."""
    principal.require(MANAGE)
    row = session.get(model, row_id)
    if row is None or not principal.can_see_team(row.team_id):
        raise NotFound(f"{what} {row_id} not found", code=f"{what}.not_found")
    return row


def get_endpoint(session: Session, principal: Principal, endpoint_id: str) -> WebhookEndpoint:
    return _managed(session, principal, WebhookEndpoint, endpoint_id, "webhook")


def update_endpoint(
    session: Session,
    principal: Principal,
    endpoint_id: str,
    *,
    changes: dict[str, Any],
) -> WebhookEndpoint:
    """Change an endpoint's URL, event types, description or disabled flag (`changes` holds those given). A
    disabled endpoint gets no new deliveries, and what it has pending fails at its next attempt."""
    endpoint = get_endpoint(session, principal, endpoint_id)
    if "url" in changes:
        check_url(changes["url"])
        endpoint.url = changes["url"]
    if "event_types" in changes:
        endpoint.event_types = _checked_event_types(changes["event_types"])
    if "description" in changes:
        endpoint.description = changes["description"]
    if changes.get("disabled") is not None:
        endpoint.disabled = bool(changes["disabled"])
    session.flush()
    session.info.pop(_CACHE, None)
    return endpoint


def _checked_event_types(event_types: list[str] | None) -> list[str] | None:
    if event_types is None:
        return None
    unknown = wh.unknown_event_types(event_types)
    if unknown:
        raise _invalid(
            f"unknown event types {unknown}",
            "event_types",
            f"use types of {sorted(wh.EVENT_TYPES)}, a group as 'job.*', or leave it out for every type",
            code="webhook.unknown_event_type",
        )
    return sorted(set(event_types)) or None


def delete_endpoint(session: Session, principal: Principal, endpoint_id: str) -> WebhookEndpoint:
    """Remove an endpoint, with its delivery log: what it had pending is not sent."""
    endpoint = get_endpoint(session, principal, endpoint_id)
    session.execute(sa.delete(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id))
    session.delete(endpoint)
    session.flush()
    session.info.pop(_CACHE, None)
    return endpoint


@dataclass(frozen=True)
class DeliveryQuery:
    """A page of a delivery log: its deliveries of `state` (all, if None), newest first, older than the id
    `after` (the last of the previous page), at most `limit`."""

    state: str | None = None
    after: str | None = None
    limit: int = 50


def list_deliveries(
    session: Session, principal: Principal, endpoint_id: str, query: DeliveryQuery = DeliveryQuery()
) -> tuple[list[WebhookDelivery], str | None]:
    """A page of an endpoint's deliveries, and the next page's cursor."""
    endpoint = get_endpoint(session, principal, endpoint_id)
    return _deliveries_page(session, WebhookDelivery.endpoint_id == endpoint.id, query)


def _deliveries_page(
    session: Session, where: sa.ColumnElement[bool], query: DeliveryQuery
) -> tuple[list[WebhookDelivery], str | None]:
    """The `query`'s page of the deliveries `where` picks, and the next page's cursor."""
    limit = query.limit
    q = sa.select(WebhookDelivery).where(where).order_by(WebhookDelivery.id.desc()).limit(limit + 1)
    if query.state is not None:
        q = q.where(WebhookDelivery.state == query.state)
    if query.after is not None:
        q = q.where(WebhookDelivery.id < query.after)
    rows = list(session.scalars(q))
    return rows[:limit], rows[limit - 1].id if len(rows) > limit else None


def retry_delivery(
    session: Session, principal: Principal, endpoint_id: str, delivery_id: str
) -> WebhookDelivery:
    """Send a delivered or failed message once more, now (same `webhook-id`, a new timestamp and signature)."""
    endpoint = get_endpoint(session, principal, endpoint_id)
    delivery = session.get(WebhookDelivery, delivery_id)
    if delivery is None or delivery.endpoint_id != endpoint.id:
        raise NotFound(f"delivery {delivery_id} not found", code="webhook_delivery.not_found")
    if delivery.state == PENDING:
        raise Conflict(
            f"delivery {delivery_id} is still being tried (attempt {delivery.attempts})",
            code="webhook_delivery.pending",
            details={"hint": "wait until it is delivered or failed; its next attempt is at next_attempt_at"},
        )
    now = utcnow()
    delivery.state = PENDING
    delivery.next_attempt_at = now
    delivery.dispatched_at = None
    delivery.finished_at = None
    delivery.url = endpoint.url
    session.flush()
    after_commit(session, lambda: _kick([delivery_id]))
    return delivery


# Events ----------------------------------------------------------------------------------------------------
Endpoints = list[tuple[str, str, list[Any] | None]]  # a team's enabled endpoints: (id, url, event types)


def _enabled_endpoints(session: Session, team_id: str) -> Endpoints:
    cache: dict[str, Endpoints] = session.info.setdefault(_CACHE, {})
    if team_id not in cache:
        cache[team_id] = [
            tuple(r)  # type: ignore[misc]
            for r in session.execute(
                sa.select(WebhookEndpoint.id, WebhookEndpoint.url, WebhookEndpoint.event_types).where(
                    WebhookEndpoint.team_id == team_id, WebhookEndpoint.disabled.is_(False)
                )
            )
        ]
    return cache[team_id]


def notify_urls(spec: dict[str, Any] | None) -> list[str]:
    """The URLs of a spec's `--notify-urls` (comma-separated)."""
    raw = (spec or {}).get("notify_urls")
    if not isinstance(raw, str):
        return []
    return [u.strip() for u in raw.split(",") if u.strip()]


def _notified_job(session: Session, principal: Principal, job_id: str) -> Job:
    return _managed(session, principal, Job, job_id, "job")


def job_notifications(
    session: Session, principal: Principal, job_id: str, *, signing_key: bytes
) -> tuple[Job, list[str], str]:
    """(the job, its `--notify-urls` that get messages, the secret that signs them) for the writers of its
    team: the secret is the job's own (`wh.job_secret`), the same whenever it is read."""
    job = _notified_job(session, principal, job_id)
    urls = [url for url in notify_urls(job.spec)[:MAX_NOTIFY_URLS] if wh.url_problem(url) is None]
    return job, urls, wh.job_secret(signing_key, job.id)


def list_job_deliveries(
    session: Session, principal: Principal, job_id: str, query: DeliveryQuery = DeliveryQuery()
) -> tuple[list[WebhookDelivery], str | None]:
    """A page of the messages to a job's `--notify-urls`, and the next page's cursor."""
    job = _notified_job(session, principal, job_id)
    where = sa.and_(WebhookDelivery.job_id == job.id, WebhookDelivery.endpoint_id.is_(None))
    return _deliveries_page(session, where, query)


def job_payload(job: Job, event_type: str, at: datetime, previous: JobStatus | None) -> dict[str, Any]:
    return {
        "type": event_type,
        "timestamp": at.isoformat().replace("+00:00", "Z"),
        "data": {
            "id": job.id,
            "name": job.name,
            "team": job.team_id,
            "queue": job.queue,
            "status": str(job.status),
            "previous_status": str(previous) if previous is not None else None,
            "reason": job.status_reason,
            "failure_reason": job.failure_reason,
        },
    }


def record_job_transition(
    session: Session, job: Job, previous: JobStatus | None, *, endpoints: Endpoints | None = None
) -> list[str]:
    """The deliveries a job's new status makes, added to the session (sent after it commits). Returns their
    ids. `endpoints`: the team's enabled endpoints when the caller read them already in this transaction
    (a submission reads them with the platform's small tables: a round trip less)."""
    event_type = wh.job_event_type(job.status)
    return _record(
        session, job, event_type, lambda now: job_payload(job, event_type, now, previous), endpoints
    )


def record_eval_completed(session: Session, job: Job, data: dict[str, Any]) -> list[str]:
    """The `eval.completed` deliveries of an eval's result (`data`: what the message says of the eval), added to
    the session (sent after it commits): one per enabled endpoint of the team that wants the type, and one per
    `--notify-urls` URL of the eval's job (signed with the job's secret, as its status changes are)."""
    event_type = wh.EVAL_COMPLETED

    def payload(now: datetime) -> dict[str, Any]:
        return {"type": event_type, "timestamp": now.isoformat().replace("+00:00", "Z"), "data": data}

    return _record(session, job, event_type, payload, None)


def _record(
    session: Session,
    job: Job,
    event_type: str,
    payload_at: Callable[[datetime], dict[str, Any]],
    endpoints: Endpoints | None,
) -> list[str]:
    """A delivery of the message `payload_at(now)` gives for each enabled endpoint of the job's team that wants
    `event_type` and for each of the job's `--notify-urls`, added to the session; sent after it commits."""
    if endpoints is None:
        endpoints = _enabled_endpoints(session, job.team_id)
    targets: list[tuple[str | None, str]] = [
        (endpoint_id, url) for endpoint_id, url, patterns in endpoints if wh.matches(patterns, event_type)
    ]
    targets += [(None, url) for url in notify_urls(job.spec)[:MAX_NOTIFY_URLS] if wh.url_problem(url) is None]
    if not targets:
        return []
    now = utcnow()
    payload = payload_at(now)
    ids = []
    for endpoint_id, url in targets:
        delivery_id = new_id("msg")
        ids.append(delivery_id)
        session.add(
            WebhookDelivery(
                id=delivery_id,
                endpoint_id=endpoint_id,
                team_id=job.team_id,
                job_id=job.id,
                url=url,
                event_type=event_type,
                payload=payload,
                state=PENDING,
                attempts=0,
                next_attempt_at=now,
                created_at=now,
            )
        )
    after_commit(session, lambda: _kick(ids))
    return ids


def _forget_endpoints(session: Session) -> None:
    """The endpoints read for one transaction are read again in the next (another may have changed them)."""
    session.info.pop(_CACHE, None)
