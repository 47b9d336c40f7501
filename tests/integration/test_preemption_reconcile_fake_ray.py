"""The reconciler's side of preemption, against real SQLite and PostgreSQL and the real embedded broker, with a
fake Ray: a preempted driver that checkpointed and exited is requeued (with a reason that says so) unless it
had already trained every step, in which case the job has succeeded. Fast; no Ray, no platform process."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from runtime.launcher import RAY_RUNNING, RAY_SUCCEEDED, RayJobInfo
from scheduler import tasks
from scheduler.db.engine import Database
from scheduler.db.models import Allocation, Job
from scheduler.dispatch import SCHEDULER_QUEUE, TASK_PASS, CeleryDispatcher
from scheduler.domain.jobs import JobStatus
from scheduler.scheduling import run_scheduling_pass
from scheduler.services.auth import Principal
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.reports import JobReports, Report
from scheduler.services.submission import JobSubmission, Submission
from scheduler.settings import CelerySettings, DatabaseSettings, SchedulerSettings, Settings
from tests.factories import bootstrap, drain_queue, grpo_spec, make_broker_app

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)


class FakeRay:
    def __init__(self) -> None:
        self.status_of: dict[str, str] = {}
        self.stopped: list[str] = []

    def status(self, sub_id: str) -> RayJobInfo | None:
        return RayJobInfo(self.status_of[sub_id], None) if sub_id in self.status_of else None

    def stop(self, sub_id: str) -> bool:
        self.stopped.append(sub_id)
        return True

    def logs_tail(self, sub_id: str, lines: int = 200) -> list[str]:
        return []


@pytest.fixture
def world(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    db = Database(db_url)
    bootstrap(db, tmp_path, slots=1)
    settings = Settings(
        home=tmp_path,
        database=DatabaseSettings(url=db_url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
        scheduler=SchedulerSettings(preempt_grace_seconds=120),
    )
    app = make_broker_app(settings.broker_url, tmp_path)
    ctx = tasks.WorkerContext(settings=settings, app=app)
    ctx.__dict__["db"] = db  # the cached_property, shared with the test
    ctx.__dict__["dispatcher"] = CeleryDispatcher(app)
    ray = FakeRay()
    monkeypatch.setattr(tasks, "launcher_for", lambda address, token=None: ray)
    yield ctx, ray
    db.dispose()


def _preempted_job(ctx: tasks.WorkerContext, *, step: int, total: int) -> str:
    """A running low-priority job that reported `step` of `total` and was then preempted."""
    with ctx.db.session() as s:
        job, _ = JobSubmission(s, artifact_root=ctx.settings.artifacts, home=ctx.settings.home).submit(
            ADMIN, Submission(spec=grpo_spec(save="ckpt"), priority_class="low")
        )
        job_id = job.id
    assert run_scheduling_pass(ctx.db, ctx.dispatcher).admitted == [job_id]
    with ctx.db.session() as s:
        svc = JobLifecycle(s)
        svc.transition(job_id, JobStatus.STARTING, expected_from=JobStatus.ADMITTED, reason="launch")
        job = svc.get(job_id)
        job.ray_submission_id = f"relax-{job_id}-1"
        JobReports(s).ingest_report(
            job, Report(attempt=1, seq=0, phase="running", progress={"step": step, "total_steps": total})
        )
        assert svc.preempt(job_id, "for a higher priority job") == JobStatus.PREEMPTING
    return job_id


def _job(ctx: tasks.WorkerContext, job_id: str) -> tuple[Job, int]:
    with ctx.db.session() as s:
        job = s.get(Job, job_id)
        held = s.scalar(sa.select(sa.func.count()).select_from(Allocation).where(Allocation.job_id == job_id))
        s.expunge(job)
        return job, held


def test_a_preempted_driver_may_checkpoint_then_is_requeued_when_it_exits(world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ctx, ray = world
    job_id = _preempted_job(ctx, step=3, total=10)
    sub_id = f"relax-{job_id}-1"
    drain_queue(ctx.app, SCHEDULER_QUEUE)

    ray.status_of[sub_id] = RAY_RUNNING  # still checkpointing: within the grace it is left alone
    tasks.reconcile_pool(ctx, "local")
    job, held = _job(ctx, job_id)
    assert job.status == JobStatus.PREEMPTING and held and ray.stopped == []

    ray.status_of[sub_id] = RAY_SUCCEEDED  # it saved and exited on the stop request
    tasks.reconcile_pool(ctx, "local")
    job, held = _job(ctx, job_id)
    assert job.status == JobStatus.QUEUED and held == 0 and job.preemptions == 1
    assert "preempted" in job.status_reason and "resume" in job.status_reason
    assert (TASK_PASS, []) in drain_queue(ctx.app, SCHEDULER_QUEUE)  # the freed slot is offered at once


def test_a_preempted_driver_that_had_finished_every_step_succeeds(world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ctx, ray = world
    job_id = _preempted_job(ctx, step=10, total=10)
    with ctx.db.session() as s:  # its last report, the end marker, is stored (else it would wait for it)
        JobReports(s).ingest_report(
            s.get(Job, job_id),
            Report(attempt=1, seq=1, events=[{"kind": "final_report", "message": "exit 0"}]),
        )
    ray.status_of[f"relax-{job_id}-1"] = RAY_SUCCEEDED
    tasks.reconcile_pool(ctx, "local")
    job, held = _job(ctx, job_id)
    assert job.status == JobStatus.SUCCEEDED and held == 0 and job.preemptions == 0
