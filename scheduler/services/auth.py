"""API keys for people and CI (job-scoped tokens for drivers: scheduler/services/job_tokens.py)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import ApiKey, Team, utcnow
from scheduler.domain.errors import InvalidRequest, NotFound, PermissionDenied, Unauthenticated
from scheduler.domain.ids import new_id
from scheduler.domain.roles import GRANTABLE_BY_TEAM_ADMIN, PERMISSIONS, TEAM_ROLES, Action, Role, allows

KEY_PREFIX = "rlx_"


@dataclass(frozen=True)
class Principal:
    """Who is calling: an API key, its role (scheduler/domain/roles.py) and, for the team roles, its
    team. Services call `require(action)` before anything else, then `can_see_team` per object."""

    key_id: str
    role: str  # a Role: admin | team_admin | member | viewer
    team_id: str | None

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN

    def can(self, action: Action) -> bool:
        return allows(self.role, action)

    def require(self, action: Action) -> None:
        """403 unless the key's role may do `action`. It names no object, so it tells nothing about
        any: objects of other teams are checked after this, and answered as missing."""
        if not self.can(action):
            roles = sorted(PERMISSIONS[action])
            raise PermissionDenied(
                f"{action} needs a key of role {', '.join(roles)}; this key's role is {self.role}",
                details={"action": str(action), "roles": roles},
            )

    def require_admin(self) -> None:
        self.require(Action.PLATFORM_ADMIN)

    def can_see_team(self, team_id: str | None) -> bool:
        return self.is_admin or (self.team_id is not None and self.team_id == team_id)


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _check_role(role: str) -> None:
    if role not in set(Role):
        raise InvalidRequest(
            f"unknown role {role!r}",
            details={"field": "role", "hint": "admin, team_admin, member or viewer"},
        )


def _check_role_and_team(role: str, team_id: str | None) -> None:
    _check_role(role)
    if role in TEAM_ROLES and team_id is None:
        raise InvalidRequest(
            f"a {role} key needs a team", details={"field": "team", "hint": "pass the team's name or id"}
        )
    if role == Role.ADMIN and team_id is not None:
        raise InvalidRequest(
            "an admin key acts for every team and has none",
            details={"field": "team", "hint": "leave out the team, or pick the role team_admin"},
        )


def create_api_key(
    session: Session,
    *,
    name: str,
    role: str,
    team_id: str | None,
    expires_at: datetime | None = None,
    created_by: str | None = None,
) -> tuple[ApiKey, str]:
    """A new key; the raw secret is returned once and only its hash is stored. No permission check
    (bootstrap): requests go through `issue_api_key`."""
    _check_role_and_team(role, team_id)
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=new_id("key"),
        name=name,
        role=role,
        team_id=team_id,
        key_hash=hash_key(raw),
        prefix=raw[:10],
        expires_at=expires_at,
        created_by=created_by,
    )
    session.add(key)
    session.flush()
    return key, raw


def issue_api_key(
    session: Session,
    principal: Principal,
    *,
    name: str,
    role: str,
    team_ref: str | None,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """A key created by a caller: an admin makes any key; a team admin makes keys of their own team
    with a team role (never admin). `expires_at` must lie ahead."""
    principal.require(Action.KEY_MANAGE)
    _check_role(role)
    if principal.is_admin:
        team_id = team_by_name_or_id(session, team_ref).id if team_ref else None
    else:
        if role not in GRANTABLE_BY_TEAM_ADMIN:
            raise PermissionDenied(
                f"a team admin cannot create {role} keys",
                details={"field": "role", "hint": "team_admin, member or viewer"},
            )
        team_id = team_for(session, principal, team_ref).id
    if expires_at is not None and expires_at <= utcnow():
        raise InvalidRequest(
            "the key would be expired already",
            details={"field": "expires_at", "hint": "a time in the future, or expires_in_days >= 1"},
        )
    return create_api_key(
        session, name=name, role=role, team_id=team_id, expires_at=expires_at, created_by=principal.key_id
    )


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


# `Session.info` key of rows read along with others, held for the unit of work: a session keeps only weak
# references to what it loaded, and `session.get` finds these without reading them again.
LOADED = "relax_loaded"


def hold(session: Session, *rows: object) -> None:
    """Keep rows read in `session` for as long as it lives, so that `session.get` answers them from its
    identity map (one statement less each) instead of reading them again."""
    session.info.setdefault(LOADED, []).extend(r for r in rows if r is not None)


# Built once: a statement made for each request costs more to build than to run.
_KEY_WITH_TEAM = (
    sa.select(ApiKey, Team)
    .outerjoin(Team, Team.id == ApiKey.team_id)
    .where(ApiKey.key_hash == sa.bindparam("key_hash"))
)


def find_api_key(session: Session, raw: str | None) -> ApiKey | None:
    """The key row of a presented secret (revoked and expired ones too), or None. Its team is read in the
    same statement and held in the session (`team_for` then reads it from there)."""
    if not raw:
        return None
    row = session.execute(_KEY_WITH_TEAM, {"key_hash": hash_key(raw)}).first()
    if row is None:
        return None
    hold(session, row[1])
    return row[0]


def principal_for_key(key: ApiKey | None, *, presented: bool, now: datetime | None = None) -> Principal:
    """The caller of a found key, or 401. Only the holder of a key's secret learns that it was revoked
    or expired; anyone else gets the same answer as for a key that never existed."""
    if not presented:
        raise Unauthenticated(
            "missing API key", details={"hint": "send 'Authorization: Bearer <key>' (RELAX_API_KEY)"}
        )
    if key is None:
        raise Unauthenticated("unknown API key")
    if key.revoked_at is not None:
        raise Unauthenticated(
            "this API key was revoked",
            code="auth.key_revoked",
            details={"hint": "ask your team admin (or an admin) for a new key"},
        )
    if key.expires_at is not None and key.expires_at <= (now or utcnow()):
        raise Unauthenticated(
            f"this API key expired at {key.expires_at.isoformat(timespec='seconds')}",
            code="auth.key_expired",
            details={"hint": "ask your team admin (or an admin) for a new key"},
        )
    return Principal(key_id=key.id, role=key.role, team_id=key.team_id)


def authenticate(session: Session, raw: str | None) -> Principal:
    return principal_for_key(find_api_key(session, raw), presented=bool(raw))


def list_api_keys(session: Session, principal: Principal, *, team_ref: str | None = None) -> list[ApiKey]:
    """Keys without their secrets: an admin sees every key, a team admin the team's keys, anyone
    else their own key."""
    q = sa.select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if principal.is_admin:
        if team_ref:
            q = q.where(ApiKey.team_id == team_by_name_or_id(session, team_ref).id)
    elif principal.can(Action.KEY_MANAGE):
        q = q.where(ApiKey.team_id == team_for(session, principal, team_ref).id)
    else:
        q = q.where(ApiKey.id == principal.key_id)
    return list(session.scalars(q))


def _manages(principal: Principal, key: ApiKey) -> bool:
    if principal.is_admin or key.id == principal.key_id:
        return True
    return principal.can(Action.KEY_MANAGE) and key.team_id == principal.team_id and key.role != Role.ADMIN


def revoke_api_key(session: Session, principal: Principal, key_id: str) -> ApiKey:
    """Revoke a key: any key for an admin, the team's non-admin keys for a team admin, one's own key
    for anyone. A key the caller may not manage is answered as missing."""
    if key_id != principal.key_id:
        principal.require(Action.KEY_MANAGE)
    key = session.get(ApiKey, key_id)
    if key is None or not _manages(principal, key):
        raise NotFound(f"API key {key_id} not found", code="api_key.not_found")
    key.revoked_at = key.revoked_at or utcnow()
    session.flush()
    return key


def team_by_name_or_id(session: Session, ref: str) -> Team:
    team = session.get(Team, ref) or session.scalar(sa.select(Team).where(Team.name == ref))
    if team is None:
        raise NotFound(f"team {ref!r} not found", code="team.not_found")
    return team


def team_for(session: Session, principal: Principal, team_ref: str | None) -> Team:
    """The team a call acts for. An admin may name any team; a team key acts for its own team only,
    and naming another is refused the same way whether that team exists or not."""
    if principal.is_admin:
        if team_ref is None:
            return team_by_name_or_id(session, "default")
        return team_by_name_or_id(session, team_ref)
    own = session.get(Team, principal.team_id) if principal.team_id else None
    if own is None:
        raise PermissionDenied("this key belongs to no team")
    if team_ref is not None and team_ref not in (own.id, own.name):
        raise PermissionDenied(
            f"this key acts for team {own.name!r} only",
            details={"field": "team", "hint": f"leave out the team, or name {own.name!r}"},
        )
    return own
