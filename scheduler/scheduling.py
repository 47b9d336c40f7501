"""The scheduling pass: read the queue and the pools, ask the policy, write its decisions at once."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.engine import Database
from scheduler.db.models import Allocation, Job, Node, Pool, SchedulerLock, utcnow
from scheduler.dispatch import Dispatcher
from scheduler.domain.jobs import JobStatus
from scheduler.services.jobs import JobService
from scheduler.transactions import after_commit

log = logging.getLogger(__name__)


@dataclass
class PassResult:
    admitted: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)


def pass_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _take_pass_lock(session: Session, holder: str) -> None:
    # Updating the lock row first makes this transaction the only pass until it commits: PostgreSQL
    # holds the row lock, SQLite the database write lock (transactions begin IMMEDIATE there).
    session.execute(
        sa.update(SchedulerLock)
        .where(SchedulerLock.name == "pass")
        .values(holder=holder, acquired_at=utcnow())
    )


@dataclass
class _Free:
    node: str
    free: int


def run_scheduling_pass(
    db: Database, dispatcher: Dispatcher, *, artifact_root, holder: str | None = None
) -> PassResult:
    """One pass, one transaction. Launch tasks are enqueued only after it commits."""
    result = PassResult()
    with db.session() as session:
        _take_pass_lock(session, holder or pass_holder())
        svc = JobService(session, artifact_root=artifact_root)
        used: dict[tuple[str, str], int] = {
            (p, n): int(g)
            for p, n, g in session.execute(
                sa.select(Allocation.pool, Allocation.node, sa.func.sum(Allocation.gpus)).group_by(
                    Allocation.pool, Allocation.node
                )
            )
        }
        cordoned_pools = set(session.scalars(sa.select(Pool.name).where(Pool.cordoned)))
        free_by_pool: dict[str, list[_Free]] = {}
        for node in session.scalars(sa.select(Node).where(Node.alive, sa.not_(Node.cordoned))):
            if node.pool in cordoned_pools:
                continue
            free_by_pool.setdefault(node.pool, []).append(
                _Free(node.name, node.gpus - used.get((node.pool, node.name), 0))
            )
        queued = list(
            session.scalars(
                sa.select(Job).where(Job.status == JobStatus.QUEUED).order_by(Job.priority.desc(), Job.id)
            )
        )
        position: dict[str, int] = {}
        for job in queued:
            position[job.pool] = position.get(job.pool, 0) + 1
            nodes = free_by_pool.get(job.pool, [])
            placement = _place(job.demand, nodes)
            if placement is None:
                free = sum(n.free for n in nodes)
                reason = (
                    f"needs {job.total_gpus} slot(s); pool {job.pool} has {free} free; "
                    f"{position[job.pool] - 1} job(s) ahead"
                )
                if job.wait_reason != reason or job.queue_position != position[job.pool]:
                    job.wait_reason, job.queue_position = reason, position[job.pool]
                result.waiting[job.id] = reason
                continue
            if not svc.transition(
                job.id,
                JobStatus.ADMITTED,
                expected_from=JobStatus.QUEUED,
                reason=f"admitted on pool {job.pool}: " + _describe(placement),
            ):
                continue
            position[job.pool] -= 1
            job.wait_reason, job.queue_position = None, None
            for node_name, role, gpus in placement:
                session.add(Allocation(job_id=job.id, pool=job.pool, node=node_name, role=role, gpus=gpus))
                next(n for n in nodes if n.node == node_name).free -= gpus
            result.admitted.append(job.id)
            after_commit(session, lambda j=job.id, p=job.pool: dispatcher.launch(j, p))
    if result.admitted:
        log.info("scheduling pass admitted %s", result.admitted)
    return result


def _describe(placement: list[tuple[str, str, int]]) -> str:
    return ", ".join(f"{role} {gpus} on {node}" for node, role, gpus in placement)


def _place(demand: dict, nodes: list[_Free]) -> list[tuple[str, str, int]] | None:
    """All-or-nothing best fit of a job's GPU groups onto nodes (interim FIFO placement)."""
    free = {n.node: n.free for n in nodes}
    out: list[tuple[str, str, int]] = []
    for group in demand.get("groups", []):
        if group.get("shares_with"):
            continue
        for _ in range(int(group.get("replicas", 1))):
            need = int(group.get("gpus_per_replica", 1))
            fitting = [n for n, f in free.items() if f >= need]
            if fitting:
                best = min(fitting, key=lambda n: free[n])
                free[best] -= need
                out.append((best, group["role"], need))
                continue
            if group.get("one_node", True):
                return None
            # spread over nodes, largest free first
            for n in sorted(free, key=lambda n: -free[n]):
                take = min(free[n], need)
                if take:
                    free[n] -= take
                    need -= take
                    out.append((n, group["role"], take))
                if need == 0:
                    break
            if need:
                return None
    return out
