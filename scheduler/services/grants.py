"""Path grants: locations outside a team's area that an admin lets the team's jobs read (ro) or read and
write (rw), in one pool or every pool; and what a team's jobs may reach (`storage_view`).

A grant is an absolute, normalized path (symbolic links resolved as the API host sees them). It never opens
the platform's home nor the artifact store (other teams' areas): a grant of either, of anything inside them
or of anything that contains them (`/`, the home's parent…) is refused, and path resolution refuses those
locations whatever a grant covers (scheduler/services/paths.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from runtime.access import within
from scheduler.db.models import PathGrant, Pool
from scheduler.domain.errors import Conflict, InvalidRequest, NotFound
from scheduler.domain.ids import new_id
from scheduler.domain.roles import Action
from scheduler.services.auth import Principal, team_by_name_or_id, team_for
from scheduler.services.paths import malformed, team_storage

MODES = ("ro", "rw")


def _invalid(message: str, field: str, hint: str, code: str = "path_grant.invalid") -> InvalidRequest:
    return InvalidRequest.naming(field, message, hint, code=code)


def normalize_grant_path(raw: str, *, home: Path, artifact_root: Path) -> Path:
    """The absolute, symlink-free path a grant stores, or InvalidRequest (`path_grant.invalid`) naming why."""
    bad = malformed(raw) if isinstance(raw, str) else "is not a string"
    if bad is None and not os.path.isabs(raw):
        bad = "is not an absolute path"
    if bad is not None:
        raise _invalid(
            f"grant path {str(raw)[:200]!r} {bad}", "path", "give an absolute path, e.g. /data/shared"
        )
    path = Path(os.path.realpath(raw))
    if path == Path(path.anchor):
        raise _invalid("a grant of '/' would open everything", "path", "grant the folder the team needs")
    for protected, what in (
        (Path(os.path.realpath(home)), "the platform's home"),
        (Path(os.path.realpath(artifact_root)), "the artifact store (the teams' areas)"),
    ):
        if within(path, protected) or within(protected, path):
            raise _invalid(
                f"grant path {raw!r} ({path}) overlaps {what}",
                "path",
                "grant a folder outside the platform's home and artifact store; a team reaches its own "
                "area through artifacts:// without any grant",
                code="path_grant.protected",
            )
    return path


def list_grants(session: Session, principal: Principal, *, team: str | None = None) -> list[PathGrant]:
    principal.require_admin()
    q = sa.select(PathGrant).order_by(PathGrant.team_id, PathGrant.path, PathGrant.id)
    if team is not None:
        q = q.where(PathGrant.team_id == team_by_name_or_id(session, team).id)
    return list(session.scalars(q))


def create_grant(
    session: Session,
    principal: Principal,
    *,
    team: str,
    path: str,
    mode: str,
    pool: str | None,
    home: Path,
    artifact_root: Path,
) -> PathGrant:
    principal.require_admin()
    target = team_by_name_or_id(session, team)
    if mode not in MODES:
        raise _invalid(f"unknown mode {mode!r}", "mode", "ro (read) or rw (read and write)")
    if pool is not None and session.get(Pool, pool) is None:
        raise NotFound(f"pool {pool!r} not found", code="pool.not_found")
    normalized = normalize_grant_path(path, home=home, artifact_root=artifact_root)
    q = sa.select(PathGrant).where(PathGrant.team_id == target.id, PathGrant.path == str(normalized))
    q = q.where(PathGrant.pool.is_(None) if pool is None else PathGrant.pool == pool)
    existing = session.scalar(q)
    if existing is not None:
        raise Conflict(
            f"team {target.name!r} already has grant {existing.id} on {normalized} "
            f"in {'every pool' if pool is None else 'pool ' + pool} ({existing.mode})",
            code="path_grant.exists",
            details={"id": existing.id, "hint": "remove it first to change its mode"},
        )
    grant = PathGrant(
        id=new_id("grant"),
        team_id=target.id,
        pool=pool,
        path=str(normalized),
        mode=mode,
        created_by=principal.key_id,
    )
    session.add(grant)
    session.flush()
    return grant


def delete_grant(session: Session, principal: Principal, grant_id: str) -> PathGrant:
    principal.require_admin()
    grant = session.get(PathGrant, grant_id)
    if grant is None:
        raise NotFound(f"path grant {grant_id} not found", code="path_grant.not_found")
    session.delete(grant)
    session.flush()
    return grant


def storage_view(
    session: Session,
    principal: Principal,
    *,
    team: str | None,
    pool: str | None,
    home: Path,
    artifact_root: Path,
) -> dict[str, Any]:
    """What the caller's team (an admin: any team) may reach: its area and its grants (in `pool`, or all)."""
    principal.require(Action.TEAM_READ)
    target = team_for(session, principal, team)
    storage = team_storage(
        session, home=home, artifact_root=artifact_root, team_id=target.id, team_name=target.name, pool=pool
    )
    q = sa.select(PathGrant).where(PathGrant.team_id == target.id).order_by(PathGrant.path)
    if pool is not None:
        q = q.where(sa.or_(PathGrant.pool.is_(None), PathGrant.pool == pool))
    return {
        "team": target.id,
        "team_name": target.name,
        "area": str(storage.area),
        "jobs": str(storage.area / "jobs"),
        "grants": list(session.scalars(q)),
    }
