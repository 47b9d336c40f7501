"""Signing in to the dashboard without putting an API key on a command line or in a URL.

`relaxctl dashboard` asks for a login code with its key (`issue_login_code`) and opens
`<url>/#code=<code>`: the browser's command line, history and screen then show only the code, which is
good for one exchange within `LOGIN_CODE_TTL_S` seconds. The dashboard reads the code from the fragment
(never sent to a server, so never in an access log), removes it from the address bar and exchanges it
(`exchange_login_code`) for a session key: an API key of the same role and team as the key that asked
for the code, expiring after `SESSION_TTL` (or with that key, if sooner), which the dashboard keeps as it
keeps a key typed in by hand.

No table holds the codes: a code is an HMAC-signed (issuing key, expiry, nonce), and the session key is
derived from the code, so that a second exchange of the same code would create a key whose hash exists
already, which the unique index on `api_keys.key_hash` refuses. Every refusal is the same 401.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import ApiKey, utcnow
from scheduler.domain.errors import Unauthenticated
from scheduler.domain.ids import new_id
from scheduler.services.auth import KEY_PREFIX, Principal, hash_key

LOGIN_CODE_PREFIX = "rlc_"
LOGIN_CODE_TTL_S = 120
SESSION_TTL = timedelta(hours=12)
SESSION_KEY_NAME = "dashboard session"
_CODE_PURPOSE = b"login-code/v1:"
_SESSION_PURPOSE = b"dashboard-session/v1:"


@dataclass(frozen=True)
class LoginCode:
    code: str
    expires_in: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(signing_key: bytes, purpose: bytes, payload: str) -> str:
    return hmac.new(signing_key, purpose + payload.encode(), hashlib.sha256).hexdigest()


def issue_login_code(signing_key: bytes, principal: Principal, *, now: float | None = None) -> LoginCode:
    """A one-time code that signs a browser in as `principal`'s key (any role may ask: the session it
    opens has that same role and team)."""
    expires = int((now or time.time()) + LOGIN_CODE_TTL_S)
    payload = _b64(f"{principal.key_id}|{expires}|{secrets.token_urlsafe(12)}".encode())
    return LoginCode(
        code=f"{LOGIN_CODE_PREFIX}{payload}.{_mac(signing_key, _CODE_PURPOSE, payload)}",
        expires_in=LOGIN_CODE_TTL_S,
    )


def login_code_error() -> Unauthenticated:
    return Unauthenticated(
        "invalid, expired or used login code",
        code="auth.bad_login_code",
        details={"hint": "run `relaxctl dashboard` again, or sign in with an API key"},
    )


def _issuer_id(signing_key: bytes, code: str, now: float) -> str | None:
    body = code[len(LOGIN_CODE_PREFIX) :] if code.startswith(LOGIN_CODE_PREFIX) else ""
    payload, _, mac = body.partition(".")
    if not hmac.compare_digest(_mac(signing_key, _CODE_PURPOSE, payload), mac):
        return None
    try:
        key_id, expires, _nonce = _unb64(payload).decode().split("|")
        if int(expires) < now:
            return None
    except ValueError:
        return None
    return key_id


def exchange_login_code(
    session: Session, signing_key: bytes, code: str, *, now: datetime | None = None
) -> tuple[ApiKey, str]:
    """The session key (row, raw secret) a login code opens, once; `login_code_error()` for a code that is
    wrong, expired or used, or whose issuing key has been revoked or has expired since."""
    now = now or utcnow()
    key_id = _issuer_id(signing_key, code or "", now.timestamp())
    issuer = session.get(ApiKey, key_id) if key_id else None
    if issuer is None or issuer.revoked_at is not None or (issuer.expires_at and issuer.expires_at <= now):
        raise login_code_error()
    raw = KEY_PREFIX + _b64(hmac.new(signing_key, _SESSION_PURPOSE + code.encode(), hashlib.sha256).digest())
    if session.scalar(sa.select(ApiKey.id).where(ApiKey.key_hash == hash_key(raw))) is not None:
        raise login_code_error()  # used already (a concurrent second use hits the unique index instead)
    # Sessions that have ended are of no further use: clear them as new ones open.
    session.execute(
        sa.delete(ApiKey).where(ApiKey.name == SESSION_KEY_NAME, ApiKey.expires_at < now - timedelta(days=1))
    )
    expires_at = now + SESSION_TTL
    if issuer.expires_at is not None:
        expires_at = min(expires_at, issuer.expires_at)
    key = ApiKey(
        id=new_id("key"),
        name=SESSION_KEY_NAME,
        role=issuer.role,
        team_id=issuer.team_id,
        key_hash=hash_key(raw),
        prefix=raw[:10],
        expires_at=expires_at,
        created_by=issuer.id,
    )
    session.add(key)
    session.flush()
    return key, raw
