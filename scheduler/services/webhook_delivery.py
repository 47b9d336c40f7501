"""Sending webhook messages: one attempt of one delivery (`deliver`, the Celery task's body) and the beat's sweep
of what is due (`sweep`). docs/reference/webhooks.md is the user's side of it.

An attempt claims its row first (compare-and-set on the attempt count, pushing `next_attempt_at` a lease ahead),
commits, POSTs with a short timeout, then records the answer: 2xx delivered; anything else waits the next step of
`retry_seconds`, and after the last one the delivery is failed. Two tasks for the same delivery (the commit's
hand-off and a sweep) make one attempt; a worker that dies mid-attempt leaves a row that falls due again when its
lease ends, and the sweep sends it again.

A URL is a team's input, hence hostile: only http and https; its host is resolved once and the connection goes to
that address (checked first: no loopback, private, link-local, multicast or reserved address unless the platform
allows them), so a second resolution cannot point it elsewhere; redirects are never followed (a 3xx is a failed
attempt); the answer's body is never read.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import httpx
import sqlalchemy as sa

from runtime.redaction import redact
from scheduler.db.engine import Database
from scheduler.db.models import WebhookDelivery, WebhookEndpoint, utcnow
from scheduler.domain import webhooks as wh
from scheduler.services.webhooks import DELIVERED, FAILED, PENDING
from scheduler.settings import WebhookSettings

log = logging.getLogger("relax.webhooks")

TASK_DELIVER = "relax.deliver_webhook"
USER_AGENT = "relax-platform-webhooks/1"


def lease_seconds(settings: WebhookSettings) -> float:
    """How long an attempt (or a task sent for one) may take before it counts as lost."""
    return max(60.0, 3 * settings.timeout_seconds + 30.0)


@dataclass(frozen=True)
class Outcome:
    delivery_id: str
    attempt: int
    state: str  # delivered | pending (will retry) | failed
    status_code: int | None
    error: str | None


class Refused(Exception):
    """The URL may not be reached (its scheme, its address)."""


def body_of(payload: dict) -> bytes:  # type: ignore[type-arg]
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def _pinned(url: str, *, allow_private: bool) -> tuple[str, str, str]:
    """(the URL with its host replaced by the address it resolves to, the Host header, the TLS server name)."""
    problem = wh.url_problem(url)
    if problem is not None:
        raise Refused(f"the URL {problem}")
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise Refused(f"cannot resolve {host}: {err}") from err
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not allow_private:
        for address in addresses:
            why = wh.address_problem(address)
            if why is not None:
                raise Refused(
                    f"{host} resolves to {address}, which {why} (the platform setting "
                    "RELAX_WEBHOOK_ALLOW_PRIVATE_ADDRESSES allows it)"
                )
    address = addresses[0]
    netloc = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    shown = f"[{host}]" if ":" in host else host  # an IPv6 literal keeps its brackets in Host
    host_header = shown if parts.port is None else f"{shown}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, "")), host_header, host


def post(
    url: str, body: bytes, headers: dict[str, str], settings: WebhookSettings
) -> tuple[int | None, str | None]:
    """One POST: (status code, None) on any answer, (code or None, why) when it is not a 2xx."""
    try:
        target, host_header, server_name = _pinned(url, allow_private=settings.allow_private_addresses)
    except Refused as err:
        return None, str(err)
    headers = {
        **headers,
        "host": host_header,
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }
    extensions = {"sni_hostname": server_name} if target.startswith("https:") else {}
    try:
        with (
            httpx.Client(timeout=settings.timeout_seconds, follow_redirects=False, trust_env=False) as client,
            client.stream("POST", target, content=body, headers=headers, extensions=extensions) as r,
        ):
            code = r.status_code
    except httpx.HTTPError as err:
        return None, redact(f"{type(err).__name__}: {err}")[:500]
    if 200 <= code < 300:
        return code, None
    if 300 <= code < 400:
        return code, f"answered {code} (redirects are not followed; register the final URL)"
    return code, f"answered {code}"


def deliver(
    db: Database, settings: WebhookSettings, delivery_id: str, *, signing_key: bytes
) -> Outcome | None:
    """One attempt of a delivery that is due; None when it is not (delivered, failed, not due yet, or another
    task took this attempt). An endpoint's message is signed with the endpoint's secret, a `--notify-urls`
    message with its job's (derived from the platform's `signing_key`)."""
    now = utcnow()
    with db.session() as s:
        d = s.get(WebhookDelivery, delivery_id)
        if d is None or d.state != PENDING or d.next_attempt_at is None or d.next_attempt_at > now:
            return None
        endpoint = s.get(WebhookEndpoint, d.endpoint_id) if d.endpoint_id else None
        if d.endpoint_id is not None and (endpoint is None or endpoint.disabled):
            d.state, d.finished_at, d.next_attempt_at = FAILED, now, None
            d.last_error = "the endpoint is disabled"
            return Outcome(delivery_id, d.attempts, FAILED, None, d.last_error)
        attempt = d.attempts + 1
        claimed = s.execute(
            sa.update(WebhookDelivery)
            .where(
                WebhookDelivery.id == delivery_id,
                WebhookDelivery.state == PENDING,
                WebhookDelivery.attempts == d.attempts,
                WebhookDelivery.next_attempt_at <= now,
            )
            .values(
                attempts=attempt,
                last_attempt_at=now,
                next_attempt_at=now + timedelta(seconds=lease_seconds(settings)),
            )
            .execution_options(synchronize_session=False)
        )
        if claimed.rowcount != 1:
            return None
        url = endpoint.url if endpoint is not None else d.url
        if endpoint is not None:
            secret = endpoint.secret
        else:
            secret = wh.job_secret(signing_key, d.job_id or "")
        body = body_of(d.payload)
    timestamp = int(now.timestamp())
    headers = {"webhook-id": delivery_id, "webhook-timestamp": str(timestamp)}
    headers["webhook-signature"] = wh.sign(secret, delivery_id, timestamp, body)
    code, error = post(url, body, headers, settings)
    return _record(db, settings, delivery_id, attempt, code, error)


def _record(
    db: Database,
    settings: WebhookSettings,
    delivery_id: str,
    attempt: int,
    code: int | None,
    error: str | None,
) -> Outcome | None:
    now = utcnow()
    with db.session() as s:
        d = s.get(WebhookDelivery, delivery_id)
        if d is None or d.state != PENDING or d.attempts != attempt:
            return None  # deleted with its endpoint meanwhile
        d.last_status_code, d.last_error, d.dispatched_at = code, error, None
        if error is None:
            d.state, d.finished_at, d.next_attempt_at = DELIVERED, now, None
        elif attempt > len(settings.retry_seconds):
            d.state, d.finished_at, d.next_attempt_at = FAILED, now, None
            log.warning("webhook delivery %s failed after %d attempts: %s", delivery_id, attempt, error)
        else:
            d.next_attempt_at = now + timedelta(seconds=settings.retry_seconds[attempt - 1])
        return Outcome(delivery_id, attempt, d.state, code, error)


def sweep(db: Database, settings: WebhookSettings, send: Callable[[str], object]) -> list[str]:
    """Hand every due delivery to `send` (by id), at most `sweep_batch`, each at most once a lease: those whose
    hand-off after the commit was lost, whose retry is due, or whose attempt was lost with its worker."""
    now = utcnow()
    stale = now - timedelta(seconds=lease_seconds(settings))
    with db.session() as s:
        ids = list(
            s.scalars(
                sa.select(WebhookDelivery.id)
                .where(
                    WebhookDelivery.state == PENDING,
                    WebhookDelivery.next_attempt_at <= now,
                    sa.or_(WebhookDelivery.dispatched_at.is_(None), WebhookDelivery.dispatched_at < stale),
                )
                .order_by(WebhookDelivery.next_attempt_at)
                .limit(settings.sweep_batch)
            )
        )
        if ids:
            s.execute(
                sa.update(WebhookDelivery)
                .where(WebhookDelivery.id.in_(ids))
                .values(dispatched_at=now)
                .execution_options(synchronize_session=False)
            )
    for delivery_id in ids:
        send(delivery_id)
    return ids


def prune(db: Database, settings: WebhookSettings, *, batch: int = 1000) -> int:
    """Remove up to `batch` delivered or failed messages that ended more than `retention_days` ago. Returns how
    many."""
    cutoff = utcnow() - timedelta(days=settings.retention_days)
    with db.session() as s:
        ids = list(
            s.scalars(
                sa.select(WebhookDelivery.id)
                .where(WebhookDelivery.state != PENDING, WebhookDelivery.finished_at < cutoff)
                .limit(batch)
            )
        )
        if ids:
            s.execute(sa.delete(WebhookDelivery).where(WebhookDelivery.id.in_(ids)))
    return len(ids)


class DeliveryPool:
    """The threads of a worker process that make attempts, apart from the worker's own (`submit` returns at once):
    a slow or silent receiver holds one of these for its timeout, never a thread that launches or reconciles
    jobs, and the task that hands an attempt over leaves the scheduler's queue at once. At most `backlog`
    attempts wait; beyond that one is left to the sweep, which sends it again once its lease ends."""

    def __init__(self, db: Database, settings: WebhookSettings, *, signing_key: bytes) -> None:
        self.db, self.settings, self.signing_key = db, settings, signing_key
        self._executor = ThreadPoolExecutor(settings.threads, thread_name_prefix="relax-webhook")
        self._slots = threading.BoundedSemaphore(settings.threads * 8)

    def submit(self, delivery_id: str) -> bool:
        if not self._slots.acquire(blocking=False):
            log.warning("webhook attempts are backed up: delivery %s waits for the sweep", delivery_id)
            return False
        try:
            self._executor.submit(self._attempt, delivery_id)
        except RuntimeError:  # the process is shutting down
            self._slots.release()
            return False
        return True

    def _attempt(self, delivery_id: str) -> None:
        try:
            deliver(self.db, self.settings, delivery_id, signing_key=self.signing_key)
        except Exception:  # noqa: BLE001 - its row falls due again when its lease ends
            log.exception("webhook delivery %s: the attempt failed", delivery_id)
        finally:
            self._slots.release()
