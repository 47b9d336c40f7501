"""Webhooks as Standard Webhooks (standardwebhooks.com) specifies them: event types, secrets, signatures, and
which URLs may receive them (no I/O here; delivery is scheduler/services/webhook_delivery.py).

A message is signed with the endpoint's secret `whsec_<base64 key>`: the `webhook-signature` header is `v1,` and
the base64 of HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>"), where the timestamp is unix seconds and
the body the exact bytes sent. Event types are `<group>.<event>`: `job.<status in lower case>`, and
`eval.completed` for an eval's result (a filter names types, or a whole group as `job.*`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
from urllib.parse import urlsplit

from scheduler.domain.jobs import JobStatus

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # Standard Webhooks asks for 24 to 64 random bytes
SIGNATURE_VERSION = "v1"

#: Every event type a webhook may ask for, by group. A job's status change is `job.<status>`.
EVENT_GROUPS: dict[str, tuple[str, ...]] = {
    "job": tuple(f"job.{status.value.lower()}" for status in JobStatus),
    # an eval's verdict (passed, failed or error): scheduler/services/eval_verdicts.py
    "eval": ("eval.completed",),
}
#: An eval's result (`/v1/evals`), once its job has ended.
EVAL_COMPLETED = "eval.completed"
EVENT_TYPES: frozenset[str] = frozenset(t for types in EVENT_GROUPS.values() for t in types)
#: The statuses after which a job changes no more.
TERMINAL_EVENT_TYPES = frozenset(f"job.{s.value.lower()}" for s in JobStatus if s.is_terminal())
#: What a job's own secret (its `--notify-urls` messages) is derived for, with the platform's signing key.
JOB_SECRET_PURPOSE = "webhook-notify"


def job_event_type(status: JobStatus) -> str:
    return f"job.{status.value.lower()}"


def unknown_event_types(patterns: list[str]) -> list[str]:
    """The entries of an endpoint's filter that name no event type nor group (`job.*`)."""
    return [p for p in patterns if p not in EVENT_TYPES and p.removesuffix(".*") not in EVENT_GROUPS]


def matches(patterns: list[str] | None, event_type: str) -> bool:
    """Whether an endpoint with filter `patterns` (None or empty: every type) wants `event_type`."""
    if not patterns:
        return True
    group = event_type.split(".", 1)[0]
    return event_type in patterns or f"{group}.*" in patterns


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def job_secret(signing_key: bytes, job_id: str) -> str:
    """The secret that signs the messages of one job's `--notify-urls`: derived from the platform's signing key
    and the job's id (HMAC-SHA256), so it is stored nowhere, differs from job to job, and is the same on every
    attempt; a new platform key (RELAX_SECRET_KEY) gives every job a new one."""
    digest = hmac.new(signing_key, f"{JOB_SECRET_PURPOSE}:{job_id}".encode(), hashlib.sha256).digest()
    return SECRET_PREFIX + base64.b64encode(digest).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key a `whsec_` secret stands for (the base64 after the prefix)."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value for one message."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def verify(secret: str, msg_id: str, timestamp: int, body: bytes, header: str) -> bool:
    """Whether one of the space-separated signatures of a `webhook-signature` header is this message's."""
    expected = sign(secret, msg_id, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in header.split())


def url_problem(url: str) -> str | None:
    """Why `url` cannot receive webhooks, judged on its text alone (its addresses are checked at delivery), or
    None. Only http and https, a host, no credentials in it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        return f"is not a URL ({err})"
    del port
    if parts.scheme not in ("http", "https"):
        return f"has scheme {parts.scheme or 'none'!r}; only http and https URLs receive webhooks"
    if not parts.hostname:
        return "names no host"
    if parts.username is not None or parts.password is not None:
        return "carries credentials (user:password@); put a token in the path or query instead"
    return None


def address_problem(address: str) -> str | None:
    """Why a webhook may not be sent to this IP address unless the platform allows private addresses: loopback,
    private networks, link-local (cloud metadata services), multicast, reserved and unspecified ones."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "is a loopback address"
    if ip.is_link_local:
        return "is a link-local address"
    if ip.is_private or ip.is_reserved or ip.is_multicast or ip.is_unspecified or not ip.is_global:
        return "is not a public address"
    return None
