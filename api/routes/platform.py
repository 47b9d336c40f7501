"""Routes for pools, queues, teams and their grants, API keys, and the audit log. Who may do what is
decided by the services (scheduler/domain/roles.py); routes parse, call and note what the audit log
records."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from api.deps import AuditDep, DispatcherDep, JobLifecycleDep, PrincipalDep, SessionDep
from api.schemas import ERROR_RESPONSES
from api.schemas.platform import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    ApiKeysPage,
    AuditEventPublic,
    AuditEventsPage,
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
    TeamUpdate,
)
from jobspec.issues import SpecIssue
from scheduler.db.models import BIGINT_MAX, utcnow
from scheduler.dispatch import Dispatcher
from scheduler.domain.errors import InvalidRequest
from scheduler.domain.jobs import JobStatus
from scheduler.services import audit, platform
from scheduler.services.auth import Principal, issue_api_key, list_api_keys, revoke_api_key
from scheduler.services.nodes import drain_node, mark_node_down
from scheduler.transactions import after_commit

router = APIRouter(prefix="/v1", tags=["platform"], responses=ERROR_RESPONSES)


@router.get("/pools", response_model=PoolsPage)
def list_pools(session: SessionDep, principal: PrincipalDep) -> PoolsPage:
    """Pools and nodes with capacity. For a team key: no Ray address, and only its own team's jobs on
    the nodes (other teams' GPUs count in `other_gpus`)."""
    return PoolsPage(data=platform.list_pools(session, principal))


@router.get("/queues", response_model=QueuesPage)
def list_queues(session: SessionDep, principal: PrincipalDep) -> QueuesPage:
    """Queues with quota and usage: every queue for an admin; a team key's own and granted queues."""
    return QueuesPage(data=platform.list_queues(session, principal))


@router.get("/teams", response_model=TeamsPage)
def list_teams(session: SessionDep, principal: PrincipalDep) -> TeamsPage:
    return TeamsPage(data=[TeamPublic(**t) for t in platform.list_teams(session, principal)])


@router.post("/teams", status_code=201, response_model=TeamPublic)
def create_team(
    body: TeamCreate, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> TeamPublic:
    audit.note(name=body.name)
    team = platform.create_team(session, principal, body.name)
    audit.note(target=team.id)
    return TeamPublic(**platform.team_view(session, team))


@router.get("/teams/{team}", response_model=TeamPublic)
def get_team(team: str, session: SessionDep, principal: PrincipalDep) -> TeamPublic:
    """A team (name or id) with the priority classes and queues it may use."""
    return TeamPublic(**platform.get_team(session, principal, team))


@router.patch("/teams/{team}", response_model=TeamPublic)
def update_team(
    team: str, body: TeamUpdate, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> TeamPublic:
    """Set the priority classes and extra queues a team may use (admin). Null resets a grant to its
    default: every preemptible class, only the team's own queues."""
    changes = body.model_dump(exclude_unset=True)
    audit.note(**changes)
    row = platform.update_team(session, principal, team, changes)
    return TeamPublic(**platform.team_view(session, row))


@router.get("/api-keys", response_model=ApiKeysPage)
def list_keys(
    session: SessionDep,
    principal: PrincipalDep,
    team: Annotated[str | None, Query(description="Only this team's keys (name or id).")] = None,
) -> ApiKeysPage:
    """Keys without secrets: every key for an admin, the team's for a team admin, one's own otherwise."""
    return ApiKeysPage(
        data=[ApiKeyPublic.model_validate(k) for k in list_api_keys(session, principal, team_ref=team)]
    )


@router.post("/api-keys", status_code=201, response_model=ApiKeyCreated)
def create_key(
    body: ApiKeyCreate, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> ApiKeyCreated:
    """A new key (the secret is in this answer only). Admins make any key; team admins make keys of
    their own team with the roles team_admin, member or viewer."""
    expires_at = body.expires_at
    if body.expires_in_days is not None:
        expires_at = utcnow() + timedelta(days=body.expires_in_days)
    audit.note(name=body.name, role=body.role, team=body.team, expires_at=_iso(expires_at))
    key, raw = issue_api_key(
        session, principal, name=body.name, role=body.role, team_ref=body.team, expires_at=expires_at
    )
    audit.note(target=key.id, prefix=key.prefix)
    return ApiKeyCreated(**ApiKeyPublic.model_validate(key).model_dump(), key=raw)


@router.delete("/api-keys/{key_id}", response_model=ApiKeyPublic)
def revoke_key(key_id: str, session: SessionDep, principal: PrincipalDep) -> ApiKeyPublic:
    """Revoke a key: any for an admin, the team's non-admin keys for a team admin, one's own for anyone."""
    return ApiKeyPublic.model_validate(revoke_api_key(session, principal, key_id))


@router.get("/admin/audit", response_model=AuditEventsPage)
def list_audit_events(
    session: SessionDep,
    principal: PrincipalDep,
    since: datetime | None = None,
    key: Annotated[str | None, Query(description="Key id of the caller.")] = None,
    team: Annotated[str | None, Query(description="The caller's team (name or id).")] = None,
    path: Annotated[str | None, Query(description="Route template, or its start (/v1/jobs).")] = None,
    after: Annotated[
        int | None, Query(ge=0, le=BIGINT_MAX, description="Id of the last row of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditEventsPage:
    """The audit log, newest first (admin): every POST, PUT, PATCH and DELETE under /v1 except the
    drivers' internal routes, refused ones included."""
    rows, cursor = audit.list_events(
        session, principal, since=since, key=key, team=team, path=path, after=after, limit=limit
    )
    return AuditEventsPage(data=[AuditEventPublic.model_validate(r) for r in rows], next_cursor=cursor)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="seconds") if value else None


# Admin: pools, nodes, queues, priority classes ----------------------------------------------------
def _pool_changed(session: Session, principal: Principal, dispatcher: Dispatcher, name: str) -> PoolPublic:
    """After an admin change to pool `name`: a scheduling pass once committed, and the pool as it is now."""
    after_commit(session, dispatcher.request_pass)
    return PoolPublic(**platform.pool_view(session, principal, name))


@router.post("/pools", status_code=201, response_model=PoolPublic)
def create_pool(
    body: PoolCreate, session: SessionDep, principal: PrincipalDep, dispatcher: DispatcherDep, audit: AuditDep
) -> PoolPublic:
    audit.note(target=body.name, accelerator=body.accelerator, nodes=[n.name for n in body.nodes])
    platform.create_pool(
        session,
        principal,
        name=body.name,
        accelerator=body.accelerator,
        ray_address=body.ray_address,
        python=body.python,
        nodes=[n.model_dump() for n in body.nodes],
    )
    return _pool_changed(session, principal, dispatcher, body.name)


@router.patch("/pools/{name}", response_model=PoolPublic)
def update_pool(
    name: str, body: PoolUpdate, session: SessionDep, principal: PrincipalDep, dispatcher: DispatcherDep
) -> PoolPublic:
    platform.update_pool(session, principal, name, body.model_dump(exclude_unset=True))
    return _pool_changed(session, principal, dispatcher, name)


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
    principal.require_admin()  # before the body is judged: a refused key learns nothing
    if body.name != node:
        raise InvalidRequest(
            "the node's name in the body differs from the path",
            issues=[
                SpecIssue(InvalidRequest.code, "name", f"{body.name!r} != {node!r}", "use the same name")
            ],
        )
    platform.upsert_node(session, principal, name, node, gpus=body.gpus, labels=body.labels)
    return _pool_changed(session, principal, dispatcher, name)


@router.patch("/pools/{name}/nodes/{node}", response_model=DrainResult)
def update_node(
    name: str,
    node: str,
    body: NodeUpdate,
    session: SessionDep,
    svc: JobLifecycleDep,
    principal: PrincipalDep,
    dispatcher: DispatcherDep,
) -> DrainResult:
    """Change a node. `alive: false` marks it down: its jobs are requeued at once (they resume from
    their latest checkpoint); `cordoned: true` keeps new jobs off it."""
    changes = body.model_dump(exclude_unset=True)
    requeued: dict = {}
    if changes.pop("alive", None) is False:
        requeued = mark_node_down(session, principal, svc, name, node)
        for job_id, status in requeued.items():
            if status == JobStatus.PREEMPTING:  # its driver is gone with the node: stop the Ray job now
                after_commit(session, lambda j=job_id: dispatcher.stop(j, name))
    elif body.alive is True:
        changes["alive"] = True
    platform.update_node(session, principal, name, node, changes)
    after_commit(session, dispatcher.request_pass)
    return DrainResult(pool=name, node=node, requeued={k: str(v) for k, v in requeued.items()})


@router.post("/pools/{name}/nodes/{node}/drain", response_model=DrainResult)
def drain(
    name: str,
    node: str,
    session: SessionDep,
    svc: JobLifecycleDep,
    principal: PrincipalDep,
    dispatcher: DispatcherDep,
) -> DrainResult:
    """Cordon the node and requeue its jobs: each is asked to checkpoint and exit, then runs again
    elsewhere from that checkpoint."""
    requeued = drain_node(session, principal, svc, name, node)
    after_commit(session, dispatcher.request_pass)
    return DrainResult(pool=name, node=node, requeued={k: str(v) for k, v in requeued.items()})


@router.post("/queues", status_code=201, response_model=QueuePublic)
def create_queue(
    body: QueueCreate, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> QueuePublic:
    audit.note(target=body.name, pool=body.pool, team=body.team)
    platform.create_queue(session, principal, **body.model_dump())
    return next(QueuePublic(**q) for q in platform.list_queues(session, principal) if q["name"] == body.name)


@router.patch("/queues/{name}", response_model=QueuePublic)
def update_queue(
    name: str, body: QueueUpdate, session: SessionDep, principal: PrincipalDep, dispatcher: DispatcherDep
) -> QueuePublic:
    platform.update_queue(session, principal, name, body.model_dump(exclude_unset=True))
    after_commit(session, dispatcher.request_pass)
    return next(QueuePublic(**q) for q in platform.list_queues(session, principal) if q["name"] == name)


@router.get("/priority-classes", response_model=PriorityClassesPage)
def list_priority_classes(session: SessionDep, principal: PrincipalDep) -> PriorityClassesPage:
    return PriorityClassesPage(
        data=[
            PriorityClassPublic.model_validate(p) for p in platform.list_priority_classes(session, principal)
        ]
    )


@router.post("/priority-classes", status_code=201, response_model=PriorityClassPublic)
def create_priority_class(
    body: PriorityClassCreate, session: SessionDep, principal: PrincipalDep, audit: AuditDep
) -> PriorityClassPublic:
    audit.note(target=body.name, value=body.value, preemptible=body.preemptible)
    return PriorityClassPublic.model_validate(
        platform.create_priority_class(session, principal, **body.model_dump())
    )
