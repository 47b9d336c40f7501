"""Routes for pools, queues, teams and API keys."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter

from api.deps import DispatcherDep, JobServiceDep, PrincipalDep, SessionDep
from api.schemas import ERROR_RESPONSES
from api.schemas.platform import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    ApiKeysPage,
    DrainResult,
    NodeCreate,
    NodeUpdate,
    PoolCreate,
    PoolPublic,
    PoolsPage,
    PoolUpdate,
    PriorityClassCreate,
    PriorityClassesPage,
    PriorityClassPublic,
    QueueCreate,
    QueuePublic,
    QueuesPage,
    QueueUpdate,
    TeamCreate,
    TeamPublic,
    TeamsPage,
)
from scheduler.db.models import ApiKey, Team
from scheduler.domain.errors import InvalidRequest
from scheduler.domain.jobs import JobStatus
from scheduler.services import platform
from scheduler.services.auth import create_api_key, revoke_api_key, team_by_name_or_id
from scheduler.services.nodes import drain_node, mark_node_down
from scheduler.transactions import after_commit

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


# Admin: pools, nodes, queues, priority classes ----------------------------------------------------
@router.post("/pools", status_code=201, response_model=PoolPublic)
def create_pool(
    body: PoolCreate, session: SessionDep, principal: PrincipalDep, dispatcher: DispatcherDep
) -> PoolPublic:
    principal.require_admin()
    platform.create_pool(
        session,
        name=body.name,
        accelerator=body.accelerator,
        ray_address=body.ray_address,
        python=body.python,
        nodes=[n.model_dump() for n in body.nodes],
    )
    after_commit(session, dispatcher.request_pass)
    return PoolPublic(**platform.pool_view(session, body.name))


@router.patch("/pools/{name}", response_model=PoolPublic)
def update_pool(
    name: str, body: PoolUpdate, session: SessionDep, principal: PrincipalDep, dispatcher: DispatcherDep
) -> PoolPublic:
    principal.require_admin()
    platform.update_pool(session, name, body.model_dump(exclude_unset=True))
    after_commit(session, dispatcher.request_pass)
    return PoolPublic(**platform.pool_view(session, name))


@router.put("/pools/{name}/nodes/{node}", response_model=PoolPublic)
def put_node(
    name: str,
    node: str,
    body: NodeCreate,
    session: SessionDep,
    principal: PrincipalDep,
    dispatcher: DispatcherDep,
) -> PoolPublic:
    """Add a node to a pool, or replace its GPU count and labels."""
    principal.require_admin()
    if body.name != node:
        raise InvalidRequest(
            "the node's name in the body differs from the path",
            details={
                "issues": [
                    {
                        "field": "name",
                        "message": f"{body.name!r} != {node!r}",
                        "hint": "use the same name",
                        "code": "request.invalid",
                    }
                ]
            },
        )
    platform.upsert_node(session, name, node, gpus=body.gpus, labels=body.labels)
    after_commit(session, dispatcher.request_pass)
    return PoolPublic(**platform.pool_view(session, name))


@router.patch("/pools/{name}/nodes/{node}", response_model=DrainResult)
def update_node(
    name: str,
    node: str,
    body: NodeUpdate,
    session: SessionDep,
    svc: JobServiceDep,
    principal: PrincipalDep,
    dispatcher: DispatcherDep,
) -> DrainResult:
    """Change a node. `alive: false` marks it down: its jobs are requeued at once (they resume from
    their latest checkpoint); `cordoned: true` keeps new jobs off it."""
    principal.require_admin()
    changes = body.model_dump(exclude_unset=True)
    requeued: dict = {}
    if changes.pop("alive", None) is False:
        requeued = mark_node_down(session, svc, name, node)
        for job_id, status in requeued.items():
            if status == JobStatus.PREEMPTING:  # its driver is gone with the node: stop the Ray job now
                after_commit(session, lambda j=job_id: dispatcher.stop(j, name))
    elif body.alive is True:
        changes["alive"] = True
    platform.update_node(session, name, node, changes)
    after_commit(session, dispatcher.request_pass)
    return DrainResult(pool=name, node=node, requeued={k: str(v) for k, v in requeued.items()})


@router.post("/pools/{name}/nodes/{node}/drain", response_model=DrainResult)
def drain(
    name: str,
    node: str,
    session: SessionDep,
    svc: JobServiceDep,
    principal: PrincipalDep,
    dispatcher: DispatcherDep,
) -> DrainResult:
    """Cordon the node and requeue its jobs: each is asked to checkpoint and exit, then runs again
    elsewhere from that checkpoint."""
    principal.require_admin()
    requeued = drain_node(session, svc, name, node)
    after_commit(session, dispatcher.request_pass)
    return DrainResult(pool=name, node=node, requeued={k: str(v) for k, v in requeued.items()})


@router.post("/queues", status_code=201, response_model=QueuePublic)
def create_queue(body: QueueCreate, session: SessionDep, principal: PrincipalDep) -> QueuePublic:
    principal.require_admin()
    platform.create_queue(session, **body.model_dump())
    return next(QueuePublic(**q) for q in platform.list_queues(session) if q["name"] == body.name)


@router.patch("/queues/{name}", response_model=QueuePublic)
def update_queue(
    name: str, body: QueueUpdate, session: SessionDep, principal: PrincipalDep, dispatcher: DispatcherDep
) -> QueuePublic:
    principal.require_admin()
    platform.update_queue(session, name, body.model_dump(exclude_unset=True))
    after_commit(session, dispatcher.request_pass)
    return next(QueuePublic(**q) for q in platform.list_queues(session) if q["name"] == name)


@router.get("/priority-classes", response_model=PriorityClassesPage)
def list_priority_classes(session: SessionDep, principal: PrincipalDep) -> PriorityClassesPage:
    return PriorityClassesPage(
        data=[PriorityClassPublic.model_validate(p) for p in platform.list_priority_classes(session)]
    )


@router.post("/priority-classes", status_code=201, response_model=PriorityClassPublic)
def create_priority_class(
    body: PriorityClassCreate, session: SessionDep, principal: PrincipalDep
) -> PriorityClassPublic:
    principal.require_admin()
    return PriorityClassPublic.model_validate(platform.create_priority_class(session, **body.model_dump()))
