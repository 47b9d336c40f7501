"""Celery tasks: the scheduling pass, and per pool the launch, stop and reconcile of Ray jobs.

Every task takes ids only, re-reads what it needs and changes status by compare-and-set, so running
a task twice (a redelivery after a worker died) is harmless.
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property

import sqlalchemy as sa
from celery import Celery

from runtime.launcher import (
    RAY_FAILED,
    RAY_STOPPED,
    RAY_SUCCEEDED,
    driver_entrypoint,
    launcher_for,
    submission_id,
)
from runtime.redaction import redact
from scheduler.db.engine import Database
from scheduler.db.models import Job, Pool, utcnow
from scheduler.dispatch import (
    TASK_LAUNCH,
    TASK_PASS,
    TASK_RECONCILE,
    TASK_STOP,
    TASK_TICK,
    CeleryDispatcher,
)
from scheduler.domain.jobs import ON_CLUSTER, FailureReason, JobStatus
from scheduler.scheduling import run_scheduling_pass
from scheduler.services.job_tokens import bootstrap_secret
from scheduler.services.jobs import JobService
from scheduler.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class WorkerContext:
    """What tasks share inside one worker process; built on first use, not at import."""

    settings: Settings
    app: Celery

    @cached_property
    def db(self) -> Database:
        return Database(self.settings.database_url)

    @cached_property
    def dispatcher(self) -> CeleryDispatcher:
        return CeleryDispatcher(self.app)

    def jobs(self, session) -> JobService:  # type: ignore[no-untyped-def]
        return JobService(session, artifact_root=self.settings.artifacts)


def register_tasks(app: Celery, settings: Settings) -> WorkerContext:
    ctx = WorkerContext(settings=settings, app=app)

    @app.task(name=TASK_PASS)
    def scheduling_pass() -> list[str]:
        return run_scheduling_pass(ctx.db, ctx.dispatcher, artifact_root=settings.artifacts).admitted

    @app.task(name=TASK_TICK)
    def tick() -> None:
        run_scheduling_pass(ctx.db, ctx.dispatcher, artifact_root=settings.artifacts)
        with ctx.db.session() as s:
            pools = set(s.scalars(sa.select(Job.pool).where(Job.status.in_(list(ON_CLUSTER)))))
        for pool in pools:
            ctx.dispatcher.reconcile(pool)

    @app.task(name=TASK_LAUNCH)
    def launch(job_id: str) -> None:
        launch_job(ctx, job_id)

    @app.task(name=TASK_STOP)
    def stop(job_id: str) -> None:
        with ctx.db.session() as s:
            job = s.get(Job, job_id)
            if job is None or job.ray_submission_id is None or JobStatus(job.status).is_terminal():
                return
            pool = s.get(Pool, job.pool)
            address, sub_id = pool.ray_address if pool else None, job.ray_submission_id
        if address:
            launcher_for(address, ctx.settings.ray_token(job.pool)).stop(sub_id)
        ctx.dispatcher.reconcile(job.pool)

    @app.task(name=TASK_RECONCILE)
    def reconcile(pool: str) -> None:
        reconcile_pool(ctx, pool)

    return ctx


def launch_job(ctx: WorkerContext, job_id: str) -> None:
    """ADMITTED -> STARTING, then submit the driver as a Ray job (again, if a worker died mid-way)."""
    with ctx.db.session() as s:
        svc = ctx.jobs(s)
        job = s.get(Job, job_id)
        if job is None:
            return
        if job.status == JobStatus.ADMITTED:
            if not svc.transition(
                job_id,
                JobStatus.STARTING,
                expected_from=JobStatus.ADMITTED,
                reason="submitting the driver to Ray",
            ):
                return
            job.ray_submission_id = submission_id(job_id, job.attempt)
        elif job.status != JobStatus.STARTING:
            return  # cancelled meanwhile, or a duplicate delivery after the driver came up
        pool = s.get(Pool, job.pool)
        assert pool is not None
        address, python, attempt, sub_id = (
            pool.ray_address,
            pool.python or sys.executable,
            job.attempt,
            job.ray_submission_id,
        )
    try:
        if not address:
            raise RuntimeError(f"pool {job.pool} has no Ray address")
        # Ray's Jobs API shows a job's environment to anyone who can reach the dashboard: it carries only
        # the attempt's one-time bootstrap secret, which the driver exchanges for the attempt's token as
        # its first call (scheduler/services/job_tokens.py); a copy read later is refused.
        bootstrap = bootstrap_secret(ctx.settings.signing_key(), job_id, attempt)
        submitted = launcher_for(address, ctx.settings.ray_token(job.pool)).submit(
            sub_id,
            driver_entrypoint(python, job_id, ctx.settings.public_url),
            env={"RELAX_JOB_ID": job_id, "RELAX_JOB_BOOTSTRAP": bootstrap, "RELAX_JOB_ATTEMPT": str(attempt)},
            metadata={"relax_job_id": job_id, "attempt": str(attempt)},
        )
        log.info(
            "job %s attempt %s %s on %s",
            job_id,
            attempt,
            "submitted" if submitted else "already on Ray",
            address,
        )
    except Exception as err:  # the cluster is unreachable or refused the job
        log.exception("launch of %s failed", job_id)
        with ctx.db.session() as s:
            svc = ctx.jobs(s)
            svc.transition(
                job_id,
                JobStatus.FAILED,
                expected_from=JobStatus.STARTING,
                reason=redact(f"could not submit to Ray at {address}: {err}"),
                failure=FailureReason.SETUP,
            )
            svc.transition(
                job_id,
                JobStatus.CANCELLED,
                expected_from=JobStatus.CANCELLING,
                reason="cancelled before the driver started",
            )
        ctx.dispatcher.request_pass()


def reconcile_pool(ctx: WorkerContext, pool_name: str) -> None:
    """Compare each on-cluster job with its Ray job and move it on; frees slots of ended jobs."""
    with ctx.db.session() as s:
        pool = s.get(Pool, pool_name)
        if pool is None or not pool.ray_address:
            return
        address = pool.ray_address
        jobs = [
            (
                j.id,
                JobStatus(j.status),
                j.ray_submission_id,
                j.launched_at,
                j.status_changed_at,
                j.total_steps is not None and (j.progress_step or 0) >= j.total_steps,
            )
            for j in s.scalars(sa.select(Job).where(Job.pool == pool_name, Job.status.in_(list(ON_CLUSTER))))
        ]
    launcher = launcher_for(address, ctx.settings.ray_token(pool_name))
    freed = False
    grace = timedelta(seconds=ctx.settings.scheduler.launch_grace_seconds)
    preempt_grace = timedelta(seconds=ctx.settings.scheduler.preempt_grace_seconds)
    for job_id, status, sub_id, launched_at, changed_at, all_steps_done in jobs:
        info = launcher.status(sub_id) if sub_id else None
        if info is None:
            late = launched_at is None or utcnow() - launched_at > grace
            if status == JobStatus.CANCELLING and late:
                freed |= _move(
                    ctx, job_id, status, JobStatus.CANCELLED, "cancelled; the Ray job never started"
                )
            elif status == JobStatus.STARTING and late:
                launch_job(ctx, job_id)  # the worker that launched it died before submitting
            continue
        ended = info.status in (RAY_SUCCEEDED, RAY_FAILED, RAY_STOPPED)
        if status == JobStatus.CANCELLING and not ended:
            launcher.stop(sub_id)
            continue
        if status == JobStatus.PREEMPTING and not ended:
            # The driver was asked to checkpoint and exit; past the grace period it is stopped.
            if utcnow() - changed_at > preempt_grace:
                launcher.stop(sub_id)
            continue
        if info.status == RAY_SUCCEEDED:
            if status == JobStatus.PREEMPTING and not all_steps_done:
                reason = "preempted; the driver checkpointed and exited, waiting to resume"
                freed |= _move(ctx, job_id, status, JobStatus.QUEUED, reason)
            else:
                target = JobStatus.CANCELLED if status == JobStatus.CANCELLING else JobStatus.SUCCEEDED
                freed |= _move(ctx, job_id, status, target, "the driver finished")
        elif info.status == RAY_STOPPED:
            if status == JobStatus.CANCELLING:
                freed |= _move(ctx, job_id, status, JobStatus.CANCELLED, "the Ray job was stopped")
            elif status == JobStatus.PREEMPTING:
                freed |= _move(ctx, job_id, status, JobStatus.QUEUED, "preempted; waiting to resume")
            else:
                freed |= _move(
                    ctx,
                    job_id,
                    status,
                    JobStatus.FAILED,
                    "the Ray job was stopped outside the platform",
                    failure=FailureReason.CONTROLLER,
                    log_tail=launcher.logs_tail(sub_id),
                )
        elif info.status == RAY_FAILED:
            if status == JobStatus.CANCELLING:
                freed |= _move(ctx, job_id, status, JobStatus.CANCELLED, "cancelled")
            elif status == JobStatus.PREEMPTING:  # stopped hard (or its node died) while preempted
                freed |= _move(ctx, job_id, status, JobStatus.QUEUED, "preempted; waiting to resume")
            else:
                tail = launcher.logs_tail(sub_id)
                freed |= _move(
                    ctx,
                    job_id,
                    status,
                    JobStatus.FAILED,
                    failure_summary(info.message, tail),
                    failure=FailureReason.USER_CODE,
                    log_tail=tail,
                )
    if freed:
        ctx.dispatcher.request_pass()


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")


def failure_summary(ray_message: str | None, log_tail: list[str]) -> str:
    """One line saying why a driver failed: Ray's first line, and the last exception in its log."""
    head = (ray_message or "the driver failed").strip().splitlines()[0]
    head = head.split(", last available logs")[0].rstrip(",.: ")
    cause = next((ln.strip() for ln in reversed(log_tail) if _EXCEPTION_LINE.match(ln.strip())), "")
    if not cause:
        cause = next((ln.strip() for ln in reversed(log_tail) if ln.strip()), "")
    return redact(f"{head}: {cause[:500]}" if cause else head)


def _move(
    ctx: WorkerContext,
    job_id: str,
    src: JobStatus,
    dst: JobStatus,
    reason: str,
    *,
    failure: FailureReason | None = None,
    log_tail: list[str] | None = None,
) -> bool:
    with ctx.db.session() as s:
        svc = ctx.jobs(s)
        moved = svc.transition(job_id, dst, expected_from=src, reason=reason, failure=failure)
        if moved and log_tail:
            job = svc.get(job_id)
            svc.add_logs(job, ({"message": line, "level": "INFO"} for line in log_tail), source="ray")
        return moved
