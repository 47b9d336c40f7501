"""A job's lifecycle: the one door for status changes (`JobLifecycle.transition`), cancellation, preemption,
the jobs on a node, and the job events that are not transitions. The other job services (submission.py,
reports.py, outputs.py) build on the small base here: a unit of work's session and a job by id."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import Allocation, Job, JobEvent, utcnow
from scheduler.domain.errors import Conflict, InvalidTransition, NotFound
from scheduler.domain.jobs import ALLOWED_TRANSITIONS, ON_CLUSTER, FailureReason, JobStatus
from scheduler.domain.roles import Action
from scheduler.services import eval_verdicts, webhooks
from scheduler.services.auth import Principal
from scheduler.transactions import after_commit

log = logging.getLogger("relax.jobs")

# Statuses a cancel request moves from, and where it moves them.
_CANCEL_TARGET = {
    JobStatus.QUEUED: JobStatus.CANCELLED,
    JobStatus.ADMITTED: JobStatus.CANCELLED,
    JobStatus.STARTING: JobStatus.CANCELLING,
    JobStatus.RUNNING: JobStatus.CANCELLING,
    JobStatus.PREEMPTING: JobStatus.CANCELLING,
}


class JobServiceBase:
    """What every job service holds: the caller's unit of work (it flushes, never commits)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, job_id: str, principal: Principal | None = None) -> Job:
        """A job by id; with a principal, only one of the teams it may see (another team's job is
        answered as missing, so its existence is not revealed)."""
        if principal is not None:
            principal.require(Action.JOB_READ)
        job = self.session.get(Job, job_id)
        if job is None or (principal is not None and not principal.can_see_team(job.team_id)):
            raise NotFound(f"job {job_id} not found", code="job.not_found")
        return job


class JobLifecycle(JobServiceBase):
    """Status changes, each a compare-and-set with its event row (scheduler/README.md, the job lifecycle)."""

    def transition(
        self,
        job_id: str,
        to: JobStatus,
        *,
        expected_from: JobStatus | Iterable[JobStatus],
        reason: str,
        failure: FailureReason | None = None,
    ) -> bool:
        """Compare-and-set the status. False when the job is no longer in `expected_from` (someone
        else moved it first): the caller re-reads instead of overwriting."""
        to = JobStatus(to)
        froms = (
            {JobStatus(expected_from)}
            if isinstance(expected_from, str)
            else {JobStatus(f) for f in expected_from}
        )
        bad = [f for f in froms if to not in ALLOWED_TRANSITIONS[f]]
        if bad:
            raise InvalidTransition(f"{'/'.join(sorted(bad))} -> {to} is not a job transition")
        job = self.session.get(Job, job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found", code="job.not_found")
        src = job.status
        now = utcnow()
        values: dict[str, Any] = {
            "status": to,
            "status_reason": reason,
            "updated_at": now,
            "status_changed_at": now,
        }
        if failure is not None:
            values["failure_reason"] = failure
        if src in ON_CLUSTER and not to.holds_slots() and job.launched_at is not None:
            # The run ends: add it to the job's attained service (the policy ranks by it).
            values["service_gpu_s"] = (
                job.service_gpu_s + (now - job.launched_at).total_seconds() * job.total_gpus
            )
        if to == JobStatus.ADMITTED:
            values["admitted_at"] = now
        elif to == JobStatus.STARTING:
            values["launched_at"] = now
            values["attempt"] = Job.attempt + 1
            values["report_seq"] = -1
        elif to == JobStatus.RUNNING:
            values["started_at"] = now
        elif to == JobStatus.QUEUED:
            values["queued_at"] = now
            if JobStatus.PREEMPTING in froms:
                values["preemptions"] = Job.preemptions + 1
        elif to.is_terminal():
            values["finished_at"] = now
        result = self.session.execute(
            sa.update(Job)
            .where(Job.id == job_id, Job.status.in_(list(froms)))
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:
            return False
        self.session.refresh(job)
        if not to.holds_slots():
            self.session.execute(sa.delete(Allocation).where(Allocation.job_id == job_id))
        self.session.add(
            JobEvent(job_id=job.id, kind="transition", from_status=src, to_status=to, reason=reason)
        )
        # the team's webhooks and the job's --notify-urls: rows in this transaction, sent once it commits
        webhooks.record_job_transition(self.session, job, src)
        if to.is_terminal():  # an eval's job: the eval's verdict, in this transaction
            eval_verdicts.job_ended(self.session, job)
        # one line a state change, once it is committed, naming the job and its team whatever the context
        extra = {"job_id": job_id, "team": job.team_id}
        after_commit(self.session, lambda: log.info("%s -> %s: %s", src, to, reason, extra=extra))
        return True

    def cancel(self, job_id: str, principal: Principal, *, reason: str = "cancelled by user") -> Job:
        principal.require(Action.JOB_CANCEL)
        job = self.get(job_id, principal)
        for _ in range(3):  # retry when the scheduler or a worker moved the job meanwhile
            status = job.status
            if status.is_terminal():
                raise Conflict(f"job {job_id} already ended ({status})", code="job.already_ended")
            if status == JobStatus.CANCELLING:
                return job
            target = _CANCEL_TARGET[status]
            if self.transition(job_id, target, expected_from=status, reason=reason):
                return job
            self.session.refresh(job)
        raise Conflict(f"job {job_id} kept changing status; try again", code="job.busy")

    def preempt(self, job_id: str, reason: str, *, force: bool = False) -> JobStatus | None:
        """Take a job's slots back. A launched job goes PREEMPTING: its driver is told to checkpoint and
        exit (the next report answers stop_requested), then the reconciler requeues it; an ADMITTED job
        goes straight back to QUEUED. `force` (node down, drain) ignores the job's preemptible flag.
        Returns the new status, or None when the job was not in a preemptible state."""
        job = self.get(job_id)
        if not (job.preemptible or force):
            raise Conflict(
                f"job {job_id} is not preemptible (priority class {job.priority_class})",
                code="job.not_preemptible",
            )
        status = job.status
        if status == JobStatus.ADMITTED:
            ok = self.transition(job_id, JobStatus.QUEUED, expected_from=status, reason=reason)
            return JobStatus.QUEUED if ok else None
        if status in (JobStatus.STARTING, JobStatus.RUNNING):
            ok = self.transition(job_id, JobStatus.PREEMPTING, expected_from=status, reason=reason)
            return JobStatus.PREEMPTING if ok else None
        return None

    def jobs_on_node(self, pool: str, node: str) -> list[Job]:
        return list(
            self.session.scalars(
                sa.select(Job)
                .join(Allocation, Allocation.job_id == Job.id)
                .where(Allocation.pool == pool, Allocation.node == node)
                .distinct()
            )
        )

    def record_event(self, job: Job, kind: str, message: str, *, at: datetime | None = None) -> None:
        """A job event that is not a transition (a driver's event, a lost driver, a checkpoint found)."""
        self.session.add(JobEvent(job_id=job.id, kind=kind, reason=message, time=at or utcnow()))
