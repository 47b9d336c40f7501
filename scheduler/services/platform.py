"""Pools, nodes, teams and queues: bootstrap of the embedded platform, what each role sees of them, and
the admin operations (each checks the caller's role: scheduler/domain/roles.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobspec.issues import SpecIssue
from scheduler.db.models import Allocation, Job, Node, Pool, PriorityClass, Queue, Team
from scheduler.domain.errors import Conflict, InvalidRequest, NotFound
from scheduler.domain.evals import EVAL_PRIORITY_CLASS
from scheduler.domain.ids import new_id
from scheduler.domain.jobs import HOLDING_SLOTS, JobStatus
from scheduler.domain.roles import Action
from scheduler.secret_files import create_secret_file, read_secret_file
from scheduler.services.auth import Principal, create_api_key, ensure_api_key, team_by_name_or_id

RowT = TypeVar("RowT", Pool, Node, Queue, PriorityClass, Team)


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
        raw = read_secret_file(key_file)
        ensure_api_key(session, raw, name="bootstrap-admin", role="admin", team_id=None)
        return raw
    key, raw = create_api_key(session, name="bootstrap-admin", role="admin", team_id=None)
    # 0600 from its creation on (never readable by others, not even for an instant), written whole
    if not create_secret_file(key_file, raw + "\n"):  # another process wrote one first: that one counts
        session.delete(key)
        raw = read_secret_file(key_file)
        ensure_api_key(session, raw, name="bootstrap-admin", role="admin", team_id=None)
    return raw


def list_pools(session: Session, principal: Principal, name: str | None = None) -> list[dict]:
    """Every pool with its nodes and the GPUs allocated on each. Keys that may not see the whole
    cluster (everyone but admins) get no Ray address, and on each node only their own team's jobs;
    other teams' jobs there count in `other_gpus`, without id, name or team."""
    principal.require(Action.POOL_READ)
    whole = principal.can(Action.CLUSTER_READ)
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
    others: dict[tuple[str, str], int] = {}
    for p, n, job_id, team_id, g in session.execute(
        sa.select(
            Allocation.pool, Allocation.node, Allocation.job_id, Job.team_id, sa.func.sum(Allocation.gpus)
        )
        .join(Job, Job.id == Allocation.job_id)
        .where(sa.not_(Allocation.shared))
        .group_by(Allocation.pool, Allocation.node, Allocation.job_id, Job.team_id)
        .order_by(Allocation.job_id)
    ):
        if whole or principal.can_see_team(team_id):
            holders.setdefault((p, n), {})[job_id] = int(g)
        else:
            others[(p, n)] = others.get((p, n), 0) + int(g)
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
                "other_gpus": others.get((pool.name, n.name), 0),
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
                "ray_address": pool.ray_address if whole else None,
                "cordoned": pool.cordoned,
                "total_gpus": sum(n.gpus for n in nodes),
                "allocated_gpus": sum(v["allocated_gpus"] for v in node_views),
                "jobs_holding_slots": running.get(pool.name, 0),
                "jobs_queued": queued.get(pool.name, 0),
                "nodes": node_views,
            }
        )
    return out


def list_queues(session: Session, principal: Principal) -> list[dict]:
    """Queues with quota and usage. An admin sees every queue; a team key sees its team's queues and
    those an admin granted the team (pool totals are on the pools)."""
    principal.require(Action.TEAM_READ)
    queues = sa.select(Queue).order_by(Queue.name)
    if not principal.can(Action.CLUSTER_READ):
        team = session.get(Team, principal.team_id) if principal.team_id else None
        granted = list(team.allowed_queues or []) if team is not None else []
        queues = queues.where(sa.or_(Queue.team_id == principal.team_id, Queue.name.in_(granted)))
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
        for q in session.scalars(queues)
    ]


def pool_view(session: Session, principal: Principal, name: str) -> dict:
    views = list_pools(session, principal, name)
    if not views:
        raise NotFound(f"pool {name!r} not found", code="pool.not_found")
    return views[0]


def create_team(session: Session, principal: Principal, name: str) -> Team:
    principal.require(Action.PLATFORM_ADMIN)
    if session.scalar(sa.select(Team).where(Team.name == name)) is not None:
        raise Conflict(f"team {name!r} already exists", code="team.exists")
    return _add(session, Team(id=new_id("team"), name=name))


# Teams and what they may use --------------------------------------------------------------------
def granted_priority_classes(session: Session, team: Team) -> list[str]:
    """The classes the team may submit jobs at: its grant, or (none set) every preemptible class. A class
    that is never preempted is only reachable by an admin's grant. The eval class is never among them: every
    team's evals have it, and no plain job may use it (docs/adr/0011-eval-priority-class.md)."""
    return granted_among(list(session.scalars(sa.select(PriorityClass))), team)


def granted_among(classes: list[PriorityClass], team: Team) -> list[str]:
    """`granted_priority_classes` from the classes read already (every one), highest value first."""
    classes = sorted(
        (c for c in classes if c.name != EVAL_PRIORITY_CLASS), key=lambda c: c.value, reverse=True
    )
    if team.allowed_priority_classes is None:
        return [c.name for c in classes if c.preemptible]
    allowed = set(team.allowed_priority_classes)
    return [c.name for c in classes if c.name in allowed]


def eval_rank_beyond_quota(classes: list[PriorityClass], team: Team) -> int | None:
    """The priority an eval job of `team` has beyond its queue's nominal quota (`JobView.borrow_priority`):
    its team's highest granted training class, never above the eval class (none granted: the lowest class).
    None when there is no eval class."""
    by_name = {c.name: c.value for c in classes}
    top = by_name.get(EVAL_PRIORITY_CLASS)
    if top is None:
        return None
    granted = [by_name[n] for n in granted_among(classes, team)]
    return min(top, max(granted) if granted else min(by_name.values()))


def granted_queues(session: Session, team: Team) -> list[str]:
    """The queues the team may submit to: its own, then those of other teams an admin granted it."""
    own = list(
        session.scalars(sa.select(Queue.name).where(Queue.team_id == team.id).order_by(Queue.created_at))
    )
    extra = [q for q in team.allowed_queues or [] if q not in own]
    existing = set(session.scalars(sa.select(Queue.name).where(Queue.name.in_(extra)))) if extra else set()
    return own + [q for q in extra if q in existing]


def team_view(session: Session, team: Team) -> dict:
    return {
        "id": team.id,
        "name": team.name,
        "created_at": team.created_at,
        "allowed_priority_classes": team.allowed_priority_classes,
        "allowed_queues": team.allowed_queues,
        "priority_classes": granted_priority_classes(session, team),
        "queues": granted_queues(session, team),
    }


def list_teams(session: Session, principal: Principal) -> list[dict]:
    """Every team for an admin; a team key sees its own team (with what it may use)."""
    principal.require(Action.TEAM_READ)
    q = sa.select(Team).order_by(Team.name)
    if not principal.can(Action.CLUSTER_READ):
        q = q.where(Team.id == principal.team_id)
    return [team_view(session, t) for t in session.scalars(q)]


def get_team(session: Session, principal: Principal, ref: str) -> dict:
    """One team by name or id; another team than the key's own is answered as missing."""
    principal.require(Action.TEAM_READ)
    team = session.get(Team, ref) or session.scalar(sa.select(Team).where(Team.name == ref))
    if team is None or not (principal.can(Action.CLUSTER_READ) or principal.can_see_team(team.id)):
        raise NotFound(f"team {ref!r} not found", code="team.not_found")
    return team_view(session, team)


def update_team(session: Session, principal: Principal, ref: str, changes: dict) -> Team:
    """Set the team's grants: `allowed_priority_classes` and `allowed_queues` (None: the defaults,
    every preemptible class and the team's own queues). Every name must exist."""
    principal.require(Action.PLATFORM_ADMIN)
    team = team_by_name_or_id(session, ref)
    issues = []
    if changes.get("allowed_priority_classes") is not None:
        known = set(session.scalars(sa.select(PriorityClass.name)))
        for name in changes["allowed_priority_classes"]:
            if name == EVAL_PRIORITY_CLASS:
                issues.append(
                    _field_issue(
                        "allowed_priority_classes",
                        f"the class {name!r} is not granted: every team's evals run at it, and jobs may not",
                        "leave it out; a team's evals use it without a grant (POST /v1/evals), and may ask "
                        "for a lower class they are granted",
                    )
                )
            elif name not in known:
                issues.append(
                    _field_issue(
                        "allowed_priority_classes",
                        f"unknown priority class {name!r}",
                        f"one of {', '.join(sorted(known))}",
                    )
                )
    if changes.get("allowed_queues") is not None:
        wanted = list(changes["allowed_queues"])
        known = set(session.scalars(sa.select(Queue.name).where(Queue.name.in_(wanted))))
        for name in wanted:
            if name not in known:
                issues.append(_field_issue("allowed_queues", f"unknown queue {name!r}", "see GET /v1/queues"))
    if issues:
        raise InvalidRequest(issues[0].message, issues=issues)
    for key in ("allowed_priority_classes", "allowed_queues"):
        if key in changes:
            value = changes[key]
            setattr(team, key, None if value is None else list(dict.fromkeys(value)))
    session.flush()
    return team


def get_pool(session: Session, name: str) -> Pool:
    pool = session.get(Pool, name)
    if pool is None:
        raise NotFound(f"pool {name!r} not found", code="pool.not_found")
    return pool


# Admin operations ------------------------------------------------------------------------------
def _field_issue(field: str, message: str, hint: str) -> SpecIssue:
    return SpecIssue(InvalidRequest.code, field, message, hint)


def _refuse_existing(
    session: Session, model: type[Pool | Queue | PriorityClass], name: str, what: str
) -> None:
    """Conflict (`<what>.exists`) when a `model` row named `name` exists: an admin create never replaces."""
    if session.get(model, name) is not None:
        raise Conflict(f"{what} {name!r} already exists", code=f"{what.replace(' ', '_')}.exists")


def _add(session: Session, row: RowT) -> RowT:
    """The new `row`, added and flushed (its defaults and constraints applied now)."""
    session.add(row)
    session.flush()
    return row


def _apply_changes(session: Session, row: RowT, changes: dict, fields: tuple[str, ...]) -> RowT:
    """`row` with those of `fields` present in `changes` (a PATCH body: absent means unchanged) set, flushed."""
    for key in fields:
        if key in changes:
            setattr(row, key, changes[key])
    session.flush()
    return row


def create_pool(
    session: Session,
    principal: Principal,
    *,
    name: str,
    accelerator: str,
    ray_address: str | None,
    python: str | None,
    nodes: list[dict],
) -> Pool:
    principal.require(Action.PLATFORM_ADMIN)
    _refuse_existing(session, Pool, name, "pool")
    pool = _add(session, Pool(name=name, accelerator=accelerator, ray_address=ray_address, python=python))
    for n in nodes:
        upsert_node(session, principal, name, n["name"], gpus=n["gpus"], labels=n.get("labels") or {})
    return pool


def update_pool(session: Session, principal: Principal, name: str, changes: dict) -> Pool:
    """Apply the fields present in `changes` (ray_address, python, accelerator, cordoned)."""
    principal.require(Action.PLATFORM_ADMIN)
    return _apply_changes(
        session, get_pool(session, name), changes, ("ray_address", "python", "accelerator", "cordoned")
    )


def get_node(session: Session, pool: str, name: str) -> Node:
    node = session.get(Node, (pool, name))
    if node is None:
        raise NotFound(f"node {name!r} not found in pool {pool!r}", code="node.not_found")
    return node


def upsert_node(
    session: Session, principal: Principal, pool: str, name: str, *, gpus: int, labels: dict
) -> Node:
    principal.require(Action.PLATFORM_ADMIN)
    get_pool(session, pool)
    if gpus < 0:
        raise InvalidRequest("gpus must be >= 0", issues=[_field_issue("gpus", f"{gpus} < 0", "0 or more")])
    node = session.get(Node, (pool, name))
    if node is None:
        node = Node(pool=pool, name=name, gpus=gpus, labels=labels)
        session.add(node)
    else:
        node.gpus, node.labels = gpus, labels
    session.flush()
    return node


def update_node(session: Session, principal: Principal, pool: str, name: str, changes: dict) -> Node:
    """Apply the fields present in `changes` (gpus, labels, cordoned, alive)."""
    principal.require(Action.PLATFORM_ADMIN)
    return _apply_changes(
        session, get_node(session, pool, name), changes, ("gpus", "labels", "cordoned", "alive")
    )


def create_queue(
    session: Session,
    principal: Principal,
    *,
    name: str,
    pool: str,
    team: str,
    nominal_gpus: int,
    borrowing_limit: int | None,
    lending_limit: int | None,
    weight: float,
) -> Queue:
    principal.require(Action.PLATFORM_ADMIN)
    _refuse_existing(session, Queue, name, "queue")
    get_pool(session, pool)
    team_row = team_by_name_or_id(session, team)
    return _add(
        session,
        Queue(
            name=name,
            pool=pool,
            team_id=team_row.id,
            nominal_gpus=nominal_gpus,
            borrowing_limit=borrowing_limit,
            lending_limit=lending_limit,
            weight=weight,
        ),
    )


def update_queue(session: Session, principal: Principal, name: str, changes: dict) -> Queue:
    principal.require(Action.PLATFORM_ADMIN)
    queue = session.get(Queue, name)
    if queue is None:
        raise NotFound(f"queue {name!r} not found", code="queue.not_found")
    return _apply_changes(
        session, queue, changes, ("nominal_gpus", "borrowing_limit", "lending_limit", "weight")
    )


def list_priority_classes(session: Session, principal: Principal) -> list[PriorityClass]:
    principal.require(Action.TEAM_READ)
    return list(session.scalars(sa.select(PriorityClass).order_by(PriorityClass.value.desc())))


def create_priority_class(
    session: Session,
    principal: Principal,
    *,
    name: str,
    value: int,
    preemptible: bool,
    description: str | None,
) -> PriorityClass:
    principal.require(Action.PLATFORM_ADMIN)
    _refuse_existing(session, PriorityClass, name, "priority class")
    return _add(
        session, PriorityClass(name=name, value=value, preemptible=preemptible, description=description)
    )


class RayNodeView(Protocol):
    """A node as the pool's Ray lists it (`runtime.launcher.RayNode`)."""

    node_id: str
    name: str
    ip: str
    alive: bool
    resources: dict[str, float]


@dataclass(frozen=True)
class NodeSync:
    """What one sync with Ray's node list changed: node names added, marked down, and back up."""

    added: tuple[str, ...] = ()
    down: tuple[str, ...] = ()
    up: tuple[str, ...] = ()
    # Ray nodes not added because the pool has nodes registered by a name Ray does not use (name them as Ray
    # does, its node name or IP, to bind them)
    skipped: tuple[str, ...] = ()


def sync_ray_nodes(session: Session, pool_name: str, ray_nodes: Sequence[RayNodeView]) -> NodeSync:
    """Bring a pool's nodes in step with its Ray cluster's node list. Each Ray node is the pool's node with its
    Ray id; failing that, the one named as Ray names it (or by its IP); failing that, in a pool of one node
    Ray does not list, with one alive Ray node no other matches (the embedded pool: its node is named after
    the host, Ray's by its IP; or its Ray restarted), that node; a node whose Ray id is dead or gone is the alive
    Ray node of its name (a raylet restarted). A node Ray lists as dead, or no longer lists, is marked down (the
    pass requeues its jobs); a node Ray holds alive is up, with as many GPUs as it advertises (a CPU pool keeps
    its slots; one added gets as many as its CPUs). A Ray node the pool lacks is added, named as Ray names it, unless
    the pool has nodes registered by a name Ray does not use (it may be one of them: `NodeSync.skipped`); those
    nodes are left as they are. Flushes, never commits."""
    pool = session.get(Pool, pool_name)
    if pool is None:
        raise NotFound(f"pool {pool_name!r} not found", code="pool.not_found")
    nodes = list(session.scalars(sa.select(Node).where(Node.pool == pool_name)))
    by_id = {n.ray_node_id: n for n in nodes if n.ray_node_id}
    unbound = {n.name: n for n in nodes if not n.ray_node_id}
    strangers = [
        r
        for r in ray_nodes
        if r.alive and r.node_id not in by_id and r.name not in unbound and r.ip not in unbound
    ]
    listed = {r.node_id for r in ray_nodes}
    if len(nodes) == 1 and len(strangers) == 1 and nodes[0].ray_node_id not in listed:
        # a pool of one node (the embedded pool, named after the host; Ray names its node by IP), or its
        # Ray restarted with a new node id: that node is this one (its lost jobs are the reconciler's)
        by_id[strangers[0].node_id] = nodes[0]
        unbound.pop(nodes[0].name, None)
    named = {r.name for r in ray_nodes} | {r.ip for r in ray_nodes}
    unmatched_hostnames = [n for n in unbound.values() if n.name not in named and n not in by_id.values()]
    # a node whose Ray id Ray holds dead or no longer lists, named as a Ray node alive under a new id: its raylet
    # came back (restarted with the same `--node-name`)
    alive_ids = {r.node_id for r in ray_nodes if r.alive}
    returned = {n.name: n for n in nodes if n.ray_node_id and n.ray_node_id not in alive_ids}
    added: list[str] = []
    skipped: list[str] = []
    down: list[str] = []
    up: list[str] = []
    seen: set[str] = set()
    for r in sorted(ray_nodes, key=lambda r: not r.alive):  # the alive first: a node back under a new id
        node = by_id.get(r.node_id) or unbound.get(r.name) or unbound.get(r.ip)
        if node is None and r.alive and r.node_id not in by_id:
            node = returned.pop(r.name, None)
        if node is not None and not r.alive and node.name in seen:
            continue  # its old id: the node is back under its new one
        if node is None:
            if not r.alive:
                continue  # a node Ray lost before the pool knew it
            if unmatched_hostnames:
                # the pool has nodes an admin registered by a name Ray does not use: this Ray node may be one of
                # them, and adding it would count its GPUs twice
                skipped.append(r.name)
                continue
            name = r.name if session.get(Node, (pool_name, r.name)) is None else r.node_id
            # its slots: the GPUs it advertises, or on a CPU pool its CPUs (a slot is one CPU there: what the
            # driver's bundles ask for)
            slots = r.resources.get("GPU" if pool.accelerator != "cpu" else "CPU", 0)
            node = Node(pool=pool_name, name=name, gpus=int(slots), labels={}, alive=True)
            session.add(node)
            added.append(name)
        node.ray_node_id = r.node_id
        seen.add(node.name)
        if r.alive and pool.accelerator != "cpu":
            node.gpus = int(r.resources.get("GPU", 0))
        if node.alive and not r.alive:
            down.append(node.name)
        elif r.alive and not node.alive and node.name not in added:
            up.append(node.name)
        node.alive = r.alive
    for node in nodes:
        if node.ray_node_id and node.name not in seen and node.alive:
            node.alive = False  # Ray no longer lists it at all
            down.append(node.name)
    session.flush()
    return NodeSync(tuple(added), tuple(down), tuple(up), tuple(skipped))
