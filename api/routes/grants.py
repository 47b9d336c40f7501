"""Routes for path grants (admins) and for what a team's jobs may reach (`GET /v1/storage`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import AuditDep, PrincipalDep, SessionDep, SettingsDep
from api.schemas import ERROR_RESPONSES
from api.schemas.grants import PathGrantCreate, PathGrantPublic, PathGrantsPage, StoragePublic
from scheduler.services import grants

router = APIRouter(prefix="/v1", tags=["storage"], responses=ERROR_RESPONSES)


@router.get("/admin/path-grants", response_model=PathGrantsPage)
def list_path_grants(
    session: SessionDep,
    principal: PrincipalDep,
    team: Annotated[str | None, Query(description="Only this team's grants (name or id).")] = None,
) -> PathGrantsPage:
    rows = grants.list_grants(session, principal, team=team)
    return PathGrantsPage(data=[PathGrantPublic.model_validate(g) for g in rows])


@router.post("/admin/path-grants", status_code=201, response_model=PathGrantPublic)
def create_path_grant(
    body: PathGrantCreate,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    audit: AuditDep,
) -> PathGrantPublic:
    """Let a team's jobs read (ro) or read and write (rw) an absolute path, in one pool or every pool.
    Refused: relative paths, `/`, and anything overlapping the platform's home or its artifact store."""
    audit.note(team=body.team, path=body.path, mode=body.mode, pool=body.pool)
    grant = grants.create_grant(
        session,
        principal,
        team=body.team,
        path=body.path,
        mode=body.mode,
        pool=body.pool,
        home=settings.home,
        artifact_root=settings.artifacts,
    )
    audit.note(target=grant.id)
    return PathGrantPublic.model_validate(grant)


@router.delete("/admin/path-grants/{grant_id}", response_model=PathGrantPublic)
def delete_path_grant(
    grant_id: str, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> PathGrantPublic:
    """Remove a grant: jobs that have not started yet lose it (their driver checks again at start)."""
    grant = grants.delete_grant(session, principal, grant_id)
    audit.note(team=grant.team_id, path=grant.path, mode=grant.mode)
    return PathGrantPublic.model_validate(grant)


@router.get("/storage", response_model=StoragePublic)
def storage(
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    team: Annotated[str | None, Query(description="Admins: the team (name or id); default: yours.")] = None,
    pool: Annotated[str | None, Query(description="Only the grants that apply in this pool.")] = None,
) -> StoragePublic:
    """Where your team's jobs may read and write: `artifacts://` (the team's area), the jobs' output folders,
    and the locations granted to the team."""
    view = grants.storage_view(
        session, principal, team=team, pool=pool, home=settings.home, artifact_root=settings.artifacts
    )
    return StoragePublic(
        team=view["team"],
        team_name=view["team_name"],
        area=view["area"],
        jobs=view["jobs"],
        grants=[PathGrantPublic.model_validate(g) for g in view["grants"]],
    )
