"""Node lifecycle: cordon, drain and loss. Draining or losing a node requeues the jobs placed on it."""

from __future__ import annotations

from sqlalchemy.orm import Session

from scheduler.domain.jobs import JobStatus
from scheduler.services.auth import Principal
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.platform import update_node


def drain_node(
    session: Session, principal: Principal, jobs: JobLifecycle, pool: str, node: str
) -> dict[str, JobStatus]:
    """Cordon the node and preempt every job on it: each checkpoints, stops and queues again, to be
    placed elsewhere (or here once uncordoned). Returns the jobs moved and their new status."""
    update_node(session, principal, pool, node, {"cordoned": True})
    return _requeue_jobs_on(jobs, pool, node, f"node {node} of pool {pool} is being drained")


def mark_node_down(
    session: Session, principal: Principal, jobs: JobLifecycle, pool: str, node: str
) -> dict[str, JobStatus]:
    """The node is lost: its jobs are requeued (they resume from their latest checkpoint)."""
    update_node(session, principal, pool, node, {"alive": False})
    return _requeue_jobs_on(jobs, pool, node, f"node {node} of pool {pool} is down")


def _requeue_jobs_on(jobs: JobLifecycle, pool: str, node: str, reason: str) -> dict[str, JobStatus]:
    moved: dict[str, JobStatus] = {}
    for job in jobs.jobs_on_node(pool, node):
        status = jobs.preempt(job.id, reason, force=True)
        if status is not None:
            moved[job.id] = status
    return moved
