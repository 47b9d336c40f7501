"""The audit log: one row per mutating API call (who, which route, on what, how it ended); admins read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import AuditEvent, utcnow
from scheduler.domain.roles import Action
from scheduler.services.auth import Principal, team_by_name_or_id

# Detail values are short, plain data the caller named (a job's name, a queue, a role): never a
# request body, a spec or a secret. Longer strings are cut.
_MAX_DETAIL_CHARS = 200


@dataclass
class AuditEntry:
    """What one call is recorded as. The API fills it while the request runs: the caller once the key
    is known (also a refused key's), the target and details once the route knows them."""

    method: str
    path: str  # the route template, e.g. /v1/jobs/{job_id}/cancel
    request_id: str | None = None
    key_id: str | None = None
    role: str | None = None
    team_id: str | None = None
    target: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def caller(self, key_id: str, role: str, team_id: str | None) -> None:
        self.key_id, self.role, self.team_id = key_id, role, team_id

    def note(self, target: str | None = None, **details: Any) -> None:
        """Name the object the call acts on and add safe details (None values are left out)."""
        if target is not None:
            self.target = target
        self.details.update({k: _safe(v) for k, v in details.items() if v is not None})


def _safe(value: Any) -> Any:
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_safe(v) for v in value[:50]]
    text = str(value)
    return text if len(text) <= _MAX_DETAIL_CHARS else text[:_MAX_DETAIL_CHARS] + "…"


_INSERT = AuditEvent.__table__.insert()


def row_values(entry: AuditEntry, status_code: int) -> dict[str, Any]:
    """The `audit_events` row of `entry` (every column but the id), for `record` or a statement that writes
    it beside its change (`JobSubmission.submit`)."""
    return {
        "time": utcnow(),
        "request_id": entry.request_id,
        "key_id": entry.key_id,
        "role": entry.role,
        "team_id": entry.team_id,
        "method": entry.method,
        "path": entry.path,
        "target": entry.target,
        "status_code": status_code,
        "details": dict(entry.details),
    }


def record(session: Session, entry: AuditEntry, status_code: int) -> None:
    """Write the row in `session`: the request's own unit of work when the call succeeded (so the row
    commits with the change, or not at all), a fresh one for a refused or failed call. One INSERT, no ORM
    object (nothing reads the row back in the request)."""
    session.execute(_INSERT, row_values(entry, status_code))


def list_events(
    session: Session,
    principal: Principal,
    *,
    since: datetime | None = None,
    key: str | None = None,
    team: str | None = None,
    path: str | None = None,
    after: int | None = None,
    limit: int = 100,
) -> tuple[list[AuditEvent], int | None]:
    """Newest first; `after` is the id of the last row of the previous page; `path` matches the route
    template's start (`/v1/jobs` also finds `/v1/jobs/{job_id}/cancel`)."""
    principal.require(Action.AUDIT_READ)
    q = sa.select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit + 1)
    if since is not None:
        q = q.where(AuditEvent.time >= since)
    if key:
        q = q.where(AuditEvent.key_id == key)
    if team:
        q = q.where(AuditEvent.team_id == team_by_name_or_id(session, team).id)
    if path:
        q = q.where(AuditEvent.path.startswith(path, autoescape=True))
    if after is not None:
        q = q.where(AuditEvent.id < after)
    rows = list(session.scalars(q))
    next_cursor = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], next_cursor
