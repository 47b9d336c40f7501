"""Pools, nodes, teams and queues: bootstrap of the embedded platform and what admins see."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import Allocation, Job, Node, Pool, PriorityClass, Queue, Team
from scheduler.domain.errors import Conflict, InvalidRequest, NotFound
from scheduler.domain.ids import new_id
from scheduler.domain.jobs import HOLDING_SLOTS, JobStatus
from scheduler.services.auth import create_api_key, ensure_api_key


@dataclass(frozen=True)
class LocalPool:
    """What the embedded platform knows about the machine it runs on."""

    name: str
    accelerator: str
    node: str
    slots: int
    ray_address: str | None
    python: str | None


def ensure_team(session: Session, name: str) -> Team:
    team = session.scalar(sa.select(Team).where(Team.name == name))
    if team is None:
        team = Team(id=new_id("team"), name=name)
        session.add(team)
        session.flush()
    return team


def ensure_local_pool(session: Session, local: LocalPool, *, team: Team) -> Pool:
    """Create or refresh the embedded pool, its one node and the default team's queue."""
    pool = session.get(Pool, local.name)
    if pool is None:
        pool = Pool(name=local.name, accelerator=local.accelerator)
        session.add(pool)
    pool.accelerator = local.accelerator
    pool.ray_address = local.ray_address
    pool.python = local.python
    node = session.get(Node, (local.name, local.node))
    if node is None:
        node = Node(pool=local.name, name=local.node, gpus=local.slots, labels={})
        session.add(node)
    node.gpus = local.slots
    node.alive = True
    session.flush()
    if session.get(Queue, "default") is None:
        session.add(
            Queue(
                name="default",
                pool=local.name,
                team_id=team.id,
                nominal_gpus=local.slots,
                borrowing_limit=None,
                lending_limit=None,
                weight=1.0,
            )
        )
        session.flush()
    return pool


def ensure_admin_key(session: Session, key_file: Path) -> str:
    """The bootstrap admin key: kept in `key_file` (0600) and valid in the database."""
    if key_file.exists():
        raw = key_file.read_text().strip()
        ensure_api_key(session, raw, name="bootstrap-admin", role="admin", team_id=None)
        return raw
    _, raw = create_api_key(session, name="bootstrap-admin", role="admin", team_id=None)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = key_file.with_suffix(".tmp")
    tmp.write_text(raw + "\n")
    tmp.chmod(0o600)
    tmp.replace(key_file)
    return raw


def list_pools(session: Session, name: str | None = None) -> list[dict]:
    """Every pool with its nodes and the GPUs allocated on each."""
    used = {
        (p, n): int(g)
        for p, n, g in session.execute(
            sa.select(Allocation.pool, Allocation.node, sa.func.sum(Allocation.gpus))
            .where(sa.not_(Allocation.shared))
            .group_by(Allocation.pool, Allocation.node)
        )
    }
    # which jobs hold GPUs on each node, and how many (shared, colocated assignments add none)
    holders: dict[tuple[str, str], dict[str, int]] = {}
    for p, n, job_id, g in session.execute(
        sa.select(Allocation.pool, Allocation.node, Allocation.job_id, sa.func.sum(Allocation.gpus))
        .where(sa.not_(Allocation.shared))
        .group_by(Allocation.pool, Allocation.node, Allocation.job_id)
        .order_by(Allocation.job_id)
    ):
        holders.setdefault((p, n), {})[job_id] = int(g)
    running = dict(
        session.execute(
            sa.select(Job.pool, sa.func.count()).where(Job.status.in_(list(HOLDING_SLOTS))).group_by(Job.pool)
        ).all()
    )
    queued = dict(
        session.execute(
            sa.select(Job.pool, sa.func.count()).where(Job.status == JobStatus.QUEUED).group_by(Job.pool)
        ).all()
    )
    out = []
    pools = sa.select(Pool).order_by(Pool.name)
    if name is not None:
        pools = pools.where(Pool.name == name)
    for pool in session.scalars(pools):
        nodes = list(session.scalars(sa.select(Node).where(Node.pool == pool.name).order_by(Node.name)))
        node_views = [
            {
                "name": n.name,
                "gpus": n.gpus,
                "allocated_gpus": used.get((pool.name, n.name), 0),
                "jobs": [{"job_id": j, "gpus": g} for j, g in holders.get((pool.name, n.name), {}).items()],
                "labels": n.labels,
                "cordoned": n.cordoned,
                "alive": n.alive,
            }
            for n in nodes
        ]
        out.append(
            {
                "name": pool.name,
                "accelerator": pool.accelerator,
                "ray_address": pool.ray_address,
                "cordoned": pool.cordoned,
                "total_gpus": sum(n.gpus for n in nodes),
                "allocated_gpus": sum(v["allocated_gpus"] for v in node_views),
                "jobs_holding_slots": running.get(pool.name, 0),
                "jobs_queued": queued.get(pool.name, 0),
                "nodes": node_views,
            }
        )
    return out


def list_queues(session: Session) -> list[dict]:
    used = dict(
        session.execute(
            sa.select(Job.queue, sa.func.sum(Job.total_gpus))
            .where(Job.status.in_(list(HOLDING_SLOTS)))
            .group_by(Job.queue)
        ).all()
    )
    running = dict(
        session.execute(
            sa.select(Job.queue, sa.func.count())
            .where(Job.status.in_(list(HOLDING_SLOTS)))
            .group_by(Job.queue)
        ).all()
    )
    waiting = {
        q: (int(n), int(g or 0))
        for q, n, g in session.execute(
            sa.select(Job.queue, sa.func.count(), sa.func.sum(Job.total_gpus))
            .where(Job.status == JobStatus.QUEUED)
            .group_by(Job.queue)
        )
    }
    teams = {t.id: t.name for t in session.scalars(sa.select(Team))}
    return [
        {
            "name": q.name,
            "pool": q.pool,
            "team": teams.get(q.team_id, q.team_id),
            "nominal_gpus": q.nominal_gpus,
            "borrowing_limit": q.borrowing_limit,
            "lending_limit": q.lending_limit,
            "weight": q.weight,
            "used_gpus": int(used.get(q.name) or 0),
            "borrowed_gpus": max(0, int(used.get(q.name) or 0) - q.nominal_gpus),
            "running_jobs": int(running.get(q.name) or 0),
            "queued_jobs": waiting.get(q.name, (0, 0))[0],
            "queued_gpus": waiting.get(q.name, (0, 0))[1],
        }
        for q in session.scalars(sa.select(Queue).order_by(Queue.name))
    ]


def pool_view(session: Session, name: str) -> dict:
    views = list_pools(session, name)
    if not views:
        raise NotFound(f"pool {name!r} not found", code="pool.not_found")
    return views[0]


def create_team(session: Session, name: str) -> Team:
    if session.scalar(sa.select(Team).where(Team.name == name)) is not None:
        raise Conflict(f"team {name!r} already exists", code="team.exists")
    team = Team(id=new_id("team"), name=name)
    session.add(team)
    session.flush()
    return team


def get_pool(session: Session, name: str) -> Pool:
    pool = session.get(Pool, name)
    if pool is None:
        raise NotFound(f"pool {name!r} not found", code="pool.not_found")
    return pool


# Admin operations ------------------------------------------------------------------------------
def _field_issue(field: str, message: str, hint: str) -> dict:
    return {"code": "request.invalid", "field": field, "message": message, "hint": hint}


def create_pool(
    session: Session,
    *,
    name: str,
    accelerator: str,
    ray_address: str | None,
    python: str | None,
    nodes: list[dict],
) -> Pool:
    if session.get(Pool, name) is not None:
        raise Conflict(f"pool {name!r} already exists", code="pool.exists")
    pool = Pool(name=name, accelerator=accelerator, ray_address=ray_address, python=python)
    session.add(pool)
    session.flush()
    for n in nodes:
        upsert_node(session, name, n["name"], gpus=n["gpus"], labels=n.get("labels") or {})
    return pool


def update_pool(session: Session, name: str, changes: dict) -> Pool:
    """Apply the fields present in `changes` (ray_address, python, accelerator, cordoned)."""
    pool = get_pool(session, name)
    for key in ("ray_address", "python", "accelerator", "cordoned"):
        if key in changes:
            setattr(pool, key, changes[key])
    session.flush()
    return pool


def get_node(session: Session, pool: str, name: str) -> Node:
    node = session.get(Node, (pool, name))
    if node is None:
        raise NotFound(f"node {name!r} not found in pool {pool!r}", code="node.not_found")
    return node


def upsert_node(session: Session, pool: str, name: str, *, gpus: int, labels: dict) -> Node:
    get_pool(session, pool)
    if gpus < 0:
        raise InvalidRequest(
            "gpus must be >= 0", details={"issues": [_field_issue("gpus", f"{gpus} < 0", "0 or more")]}
        )
    node = session.get(Node, (pool, name))
    if node is None:
        node = Node(pool=pool, name=name, gpus=gpus, labels=labels)
        session.add(node)
    else:
        node.gpus, node.labels = gpus, labels
    session.flush()
    return node


def update_node(session: Session, pool: str, name: str, changes: dict) -> Node:
    """Apply the fields present in `changes` (gpus, labels, cordoned, alive)."""
    node = get_node(session, pool, name)
    for key in ("gpus", "labels", "cordoned", "alive"):
        if key in changes:
            setattr(node, key, changes[key])
    session.flush()
    return node


def create_queue(
    session: Session,
    *,
    name: str,
    pool: str,
    team: str,
    nominal_gpus: int,
    borrowing_limit: int | None,
    lending_limit: int | None,
    weight: float,
) -> Queue:
    from scheduler.services.auth import team_by_name_or_id

    if session.get(Queue, name) is not None:
        raise Conflict(f"queue {name!r} already exists", code="queue.exists")
    get_pool(session, pool)
    team_row = team_by_name_or_id(session, team)
    queue = Queue(
        name=name,
        pool=pool,
        team_id=team_row.id,
        nominal_gpus=nominal_gpus,
        borrowing_limit=borrowing_limit,
        lending_limit=lending_limit,
        weight=weight,
    )
    session.add(queue)
    session.flush()
    return queue


def update_queue(session: Session, name: str, changes: dict) -> Queue:
    queue = session.get(Queue, name)
    if queue is None:
        raise NotFound(f"queue {name!r} not found", code="queue.not_found")
    for key in ("nominal_gpus", "borrowing_limit", "lending_limit", "weight"):
        if key in changes:
            setattr(queue, key, changes[key])
    session.flush()
    return queue


def list_priority_classes(session: Session) -> list[PriorityClass]:
    return list(session.scalars(sa.select(PriorityClass).order_by(PriorityClass.value.desc())))


def create_priority_class(
    session: Session, *, name: str, value: int, preemptible: bool, description: str | None
) -> PriorityClass:
    if session.get(PriorityClass, name) is not None:
        raise Conflict(f"priority class {name!r} already exists", code="priority_class.exists")
    pc = PriorityClass(name=name, value=value, preemptible=preemptible, description=description)
    session.add(pc)
    session.flush()
    return pc
