"""API keys for people and CI, and job-scoped tokens for drivers."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import ApiKey, Team, utcnow
from scheduler.domain.errors import InvalidRequest, NotFound, PermissionDenied, Unauthenticated
from scheduler.domain.ids import new_id

KEY_PREFIX = "rlx_"


@dataclass(frozen=True)
class Principal:
    """Who is calling: an API key of a team member, or an admin key (all teams)."""

    key_id: str
    role: str  # admin | member
    team_id: str | None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def require_admin(self) -> None:
        if not self.is_admin:
            raise PermissionDenied("this needs an admin API key")

    def can_see_team(self, team_id: str) -> bool:
        return self.is_admin or self.team_id == team_id


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def create_api_key(session: Session, *, name: str, role: str, team_id: str | None) -> tuple[ApiKey, str]:
    """A new key; the raw secret is returned once and only its hash is stored."""
    if role not in ("admin", "member"):
        raise InvalidRequest(f"unknown role {role!r}", details={"field": "role", "hint": "admin or member"})
    if role == "member" and team_id is None:
        raise InvalidRequest(
            "a member key needs a team", details={"field": "team", "hint": "pass the team's name or id"}
        )
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=new_id("key"), name=name, role=role, team_id=team_id, key_hash=hash_key(raw), prefix=raw[:10]
    )
    session.add(key)
    session.flush()
    return key, raw


def ensure_api_key(session: Session, raw: str, *, name: str, role: str, team_id: str | None) -> ApiKey:
    """Make a key given from outside (a file, an environment variable) valid; idempotent."""
    key = session.scalar(sa.select(ApiKey).where(ApiKey.key_hash == hash_key(raw)))
    if key is None:
        key = ApiKey(
            id=new_id("key"), name=name, role=role, team_id=team_id, key_hash=hash_key(raw), prefix=raw[:10]
        )
        session.add(key)
        session.flush()
    return key


def authenticate(session: Session, raw: str | None) -> Principal:
    if not raw:
        raise Unauthenticated(
            "missing API key", details={"hint": "send 'Authorization: Bearer <key>' (RELAX_API_KEY)"}
        )
    key = session.scalar(sa.select(ApiKey).where(ApiKey.key_hash == hash_key(raw)))
    if key is None or key.revoked_at is not None:
        raise Unauthenticated("unknown or revoked API key")
    return Principal(key_id=key.id, role=key.role, team_id=key.team_id)


def revoke_api_key(session: Session, key_id: str) -> ApiKey:
    key = session.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"API key {key_id} not found")
    key.revoked_at = key.revoked_at or utcnow()
    session.flush()
    return key


def team_by_name_or_id(session: Session, ref: str) -> Team:
    team = session.get(Team, ref) or session.scalar(sa.select(Team).where(Team.name == ref))
    if team is None:
        raise NotFound(f"team {ref!r} not found")
    return team


def job_token(signing_key: bytes, job_id: str, attempt: int) -> str:
    """The bearer token of one attempt of one job: derived, so a relaunch can recompute it, and a
    driver of an older attempt (a fenced-off, stale driver) cannot report into the new one."""
    mac = hmac.new(signing_key, f"{job_id}:{attempt}".encode(), hashlib.sha256).hexdigest()
    return f"rjt_{mac}"


def verify_job_token(signing_key: bytes, job_id: str, attempt: int, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(job_token(signing_key, job_id, attempt), token or "")
