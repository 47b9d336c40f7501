"""Routes for pools, queues, teams and API keys."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter

from api.deps import PrincipalDep, SessionDep
from api.schemas import ERROR_RESPONSES
from api.schemas.platform import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    ApiKeysPage,
    PoolsPage,
    QueuesPage,
    TeamCreate,
    TeamPublic,
    TeamsPage,
)
from scheduler.db.models import ApiKey, Team
from scheduler.services import platform
from scheduler.services.auth import create_api_key, revoke_api_key, team_by_name_or_id

router = APIRouter(prefix="/v1", tags=["platform"], responses=ERROR_RESPONSES)


@router.get("/pools", response_model=PoolsPage)
def list_pools(session: SessionDep, principal: PrincipalDep) -> PoolsPage:
    return PoolsPage(data=platform.list_pools(session))


@router.get("/queues", response_model=QueuesPage)
def list_queues(session: SessionDep, principal: PrincipalDep) -> QueuesPage:
    return QueuesPage(data=platform.list_queues(session))


@router.get("/teams", response_model=TeamsPage)
def list_teams(session: SessionDep, principal: PrincipalDep) -> TeamsPage:
    q = sa.select(Team).order_by(Team.name)
    if not principal.is_admin:
        q = q.where(Team.id == principal.team_id)
    return TeamsPage(data=[TeamPublic.model_validate(t) for t in session.scalars(q)])


@router.post("/teams", status_code=201, response_model=TeamPublic)
def create_team(body: TeamCreate, session: SessionDep, principal: PrincipalDep) -> TeamPublic:
    principal.require_admin()
    return TeamPublic.model_validate(platform.create_team(session, body.name))


@router.get("/api-keys", response_model=ApiKeysPage)
def list_api_keys(session: SessionDep, principal: PrincipalDep) -> ApiKeysPage:
    q = sa.select(ApiKey).order_by(ApiKey.created_at)
    if not principal.is_admin:
        q = q.where(ApiKey.id == principal.key_id)
    return ApiKeysPage(data=[ApiKeyPublic.model_validate(k) for k in session.scalars(q)])


@router.post("/api-keys", status_code=201, response_model=ApiKeyCreated)
def create_key(body: ApiKeyCreate, session: SessionDep, principal: PrincipalDep) -> ApiKeyCreated:
    principal.require_admin()
    team_id = team_by_name_or_id(session, body.team).id if body.team else None
    key, raw = create_api_key(session, name=body.name, role=body.role, team_id=team_id)
    return ApiKeyCreated(**ApiKeyPublic.model_validate(key).model_dump(), key=raw)


@router.delete("/api-keys/{key_id}", response_model=ApiKeyPublic)
def revoke_key(key_id: str, session: SessionDep, principal: PrincipalDep) -> ApiKeyPublic:
    principal.require_admin()
    return ApiKeyPublic.model_validate(revoke_api_key(session, key_id))
