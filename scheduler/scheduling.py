"""The scheduling pass: lock, read the pools and jobs into a policy snapshot, decide, write it all at once."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler import policy as P
from scheduler.db.engine import Database
from scheduler.db.models import (
    Allocation,
    Checkpoint,
    Job,
    Node,
    Pool,
    PriorityClass,
    Queue,
    SchedulerLock,
    Team,
    utcnow,
)
from scheduler.dispatch import Dispatcher
from scheduler.domain.jobs import HOLDING_SLOTS, JobStatus
from scheduler.policy.invariants import check
from scheduler.services.jobs import JobService
from scheduler.transactions import after_commit

log = logging.getLogger(__name__)

# How the policy sees each platform status.
_POLICY_STATE = {
    JobStatus.QUEUED: "queued",
    JobStatus.ADMITTED: "running",
    JobStatus.STARTING: "running",
    JobStatus.RUNNING: "running",
    JobStatus.CANCELLING: "preempting",
    JobStatus.PREEMPTING: "preempting",
}


@dataclass
class PassResult:
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


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


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def node_key(pool: str, node: str) -> str:
    """Node names are unique within a pool; the policy sees them qualified by pool."""
    return f"{pool}/{node}"


def gangs_of(demand: dict) -> tuple[P.Gang, ...]:
    """The job spec's resource demand as the policy's gangs."""
    return tuple(
        P.Gang(
            role=str(g["role"]),
            gpus=int(g["gpus_per_replica"]),
            count=int(g["replicas"]),
            one_node=bool(g.get("one_node", True)),
            colocate_with=g.get("shares_with"),
        )
        for g in demand.get("groups", [])
    )


def load_snapshot(session: Session, now: datetime) -> P.Snapshot:
    """Everything the policy needs, read in a handful of queries."""
    cordoned_pools = set(session.scalars(sa.select(Pool.name).where(Pool.cordoned)))
    nodes = tuple(
        P.Node(
            name=node_key(n.pool, n.name),
            pool=n.pool,
            gpus=n.gpus,
            labels=frozenset(f"{k}={v}" for k, v in (n.labels or {}).items()),
            schedulable=n.alive and not n.cordoned and n.pool not in cordoned_pools,
            alive=n.alive,
        )
        for n in session.scalars(sa.select(Node).order_by(Node.pool, Node.name))
    )
    teams = dict(session.execute(sa.select(Team.id, Team.name)).all())
    queues = tuple(
        P.Queue(
            name=q.name,
            pool=q.pool,
            team=teams.get(q.team_id, q.team_id),
            nominal_gpus=q.nominal_gpus,
            borrowing_limit=q.borrowing_limit,
            lending_limit=q.lending_limit,
            weight=q.weight,
        )
        for q in session.scalars(sa.select(Queue))
    )
    classes = tuple(
        P.PriorityClass(name=c.name, value=c.value, preemptible=c.preemptible)
        for c in session.scalars(sa.select(PriorityClass))
    )
    active = list(session.scalars(sa.select(Job).where(Job.status.in_(list(_POLICY_STATE)))))
    ids = [j.id for j in active]
    placements: dict[str, list[P.Assignment]] = {}
    if ids:
        for a in session.scalars(sa.select(Allocation).where(Allocation.job_id.in_(ids))):
            placements.setdefault(a.job_id, []).append(
                P.Assignment(
                    role=a.role,
                    replica=a.replica,
                    node=node_key(a.pool, a.node),
                    gpus=a.gpus,
                    shared=a.shared,
                )
            )
    last_ckpt = (
        dict(
            session.execute(
                sa.select(Checkpoint.job_id, sa.func.max(Checkpoint.time))
                .where(Checkpoint.job_id.in_(ids))
                .group_by(Checkpoint.job_id)
            ).all()
        )
        if ids
        else {}
    )
    jobs = []
    for j in active:
        status = JobStatus(j.status)
        placed = placements.get(j.id)
        jobs.append(
            P.JobView(
                id=j.id,
                queue=j.queue,
                submit_time=j.created_at.timestamp(),
                demand=gangs_of(j.demand),
                priority=j.priority,
                preemptible=j.preemptible,
                state=_POLICY_STATE[status],  # type: ignore[arg-type]
                placement=P.Placement(tuple(placed)) if placed else None,
                started_at=_ts(j.launched_at or j.admitted_at) if status.holds_slots() else None,
                last_checkpoint_at=_ts(last_ckpt.get(j.id)),
                queued_at=_ts(j.queued_at),
                preemptions=j.preemptions,
                service_gpu_s=j.service_gpu_s,
                nominated_nodes=frozenset(j.nominated_nodes or ())
                if status == JobStatus.QUEUED
                else frozenset(),
            )
        )
    return P.Snapshot(
        now=now.timestamp(), nodes=nodes, queues=queues, jobs=tuple(jobs), priority_classes=classes
    )


def run_scheduling_pass(
    db: Database,
    dispatcher: Dispatcher,
    *,
    artifact_root: Path,
    holder: str | None = None,
    config: P.PolicyConfig | None = None,
) -> PassResult:
    """One pass, one transaction: admissions, preemptions and wait reasons are written together, and
    launch tasks are enqueued only after the commit. A decision that breaks an invariant (a GPU
    allocated twice, a placement on a cordoned or dead node, a gang not placed whole) is not applied."""
    result = PassResult()
    with db.session() as session:
        _take_pass_lock(session, holder or pass_holder())
        now = utcnow()
        snapshot = load_snapshot(session, now)
        decision = P.schedule(snapshot, config=config or P.PolicyConfig())
        result.violations = check(snapshot, decision)
        if result.violations:
            log.error("scheduling pass refused a decision that breaks invariants: %s", result.violations)
            return result
        svc = JobService(session, artifact_root=artifact_root)
        jobs = {
            j.id: j for j in session.scalars(sa.select(Job).where(Job.id.in_([j.id for j in snapshot.jobs])))
        }
        for job_id, reason in decision.preempt:
            status = svc.preempt(job_id, reason)
            if status is not None:
                result.preempted.append(job_id)
        for job_id, placement in decision.admit:
            job = jobs[job_id]
            if not svc.transition(
                job_id,
                JobStatus.ADMITTED,
                expected_from=JobStatus.QUEUED,
                reason=f"admitted on pool {job.pool}: {_describe(placement)}",
            ):
                continue
            job.wait_reason, job.queue_position, job.nominated_nodes = None, None, None
            for a in placement.assignments:
                pool, _, node = a.node.partition("/")
                session.add(
                    Allocation(
                        job_id=job_id,
                        pool=pool,
                        node=node,
                        role=a.role,
                        replica=a.replica,
                        gpus=a.gpus,
                        shared=a.shared,
                    )
                )
            result.admitted.append(job_id)
            after_commit(session, lambda j=job_id, p=job.pool: dispatcher.launch(j, p))
        for job_id, info in decision.waiting.items():
            job = jobs.get(job_id)
            if job is None or job.status != JobStatus.QUEUED:
                continue
            reason = info.reason
            result.waiting[job_id] = reason
            if job.wait_reason != reason or job.queue_position != info.position:
                job.wait_reason, job.queue_position = reason, info.position
        # a pass re-issues every nomination it keeps; the rest lapse
        for job_id, job in jobs.items():
            if job.status != JobStatus.QUEUED:
                continue
            nominated = sorted(decision.nominate.get(job_id, ())) or None
            if (job.nominated_nodes or None) != nominated:
                job.nominated_nodes = nominated
    if result.admitted or result.preempted:
        log.info("scheduling pass admitted %s preempted %s", result.admitted, result.preempted)
    return result


def _describe(placement: P.Placement) -> str:
    own = [a for a in placement.assignments if not a.shared]
    return ", ".join(f"{a.role}[{a.replica}] {a.gpus} on {a.node.partition('/')[2]}" for a in own)


def holding_jobs(session: Session) -> list[Job]:
    return list(session.scalars(sa.select(Job).where(Job.status.in_(list(HOLDING_SLOTS)))))


def main(argv: list[str] | None = None) -> None:
    """`python -m scheduler.scheduling [--passes N]`: run passes now against the configured database
    and broker (RELAX_* settings) and print what they did as JSON lines. An operator's tool, and how
    tests run two schedulers at once."""
    import argparse
    import json

    from scheduler.celery_app import make_celery
    from scheduler.dispatch import CeleryDispatcher
    from scheduler.settings import get_settings

    ap = argparse.ArgumentParser(prog="python -m scheduler.scheduling", description=main.__doc__)
    ap.add_argument("--passes", type=int, default=1)
    args = ap.parse_args(argv)
    settings = get_settings()
    db = Database(settings.database_url)
    dispatcher = CeleryDispatcher(make_celery(settings, with_tasks=False))
    try:
        for _ in range(args.passes):
            r = run_scheduling_pass(db, dispatcher, artifact_root=settings.artifacts)
            print(
                json.dumps(
                    {
                        "admitted": r.admitted,
                        "preempted": r.preempted,
                        "violations": r.violations,
                        "waiting": len(r.waiting),
                    }
                ),
                flush=True,
            )
    finally:
        db.dispose()


if __name__ == "__main__":
    main()
