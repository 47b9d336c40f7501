"""The reconciler's recovery of jobs whose driver is lost, against real SQLite and PostgreSQL and the real
embedded broker, with a fake Ray (scheduler/recovery.py, docs/reliability.md):

- Ray no longer knows a RUNNING job (its Ray was restarted), or its driver was killed (exit 137, -9), or the
  Ray job was stopped outside the platform: the job goes back to QUEUED with a `driver_lost: …` reason that
  says why, its slots are freed, a pass is requested, and its next attempt's spec loads its own checkpoints;
- after `max_driver_restarts` such losses (or the job's `--max-global-restart` with `--use-fault-tolerance`)
  it is FAILED as `lost`, with the true reason;
- a driver that failed by itself (exit 1 with a traceback) is FAILED as `user_code` with its exception, not
  retried;
- a driver silent past `driver_silence_seconds` while Ray says it runs (and the API answers) is stopped and
  resumed; with the pool's Ray unreachable, a silent driver is resumed too, a reporting one is left alone.
Fast; no Ray, no platform process."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from runtime.launcher import RAY_FAILED, RAY_RUNNING, RAY_STOPPED, RayJobInfo
from runtime.report_protocol import Report
from scheduler import tasks
from scheduler.db.engine import Database
from scheduler.db.models import Allocation, Checkpoint, Job, JobEvent, utcnow
from scheduler.dispatch import SCHEDULER_QUEUE, TASK_PASS, CeleryDispatcher
from scheduler.domain.jobs import JobStatus
from scheduler.recovery import LOST_EVENT
from scheduler.scheduling import run_scheduling_pass
from scheduler.services.auth import Principal
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.reports import JobReports
from scheduler.services.submission import JobSubmission, Submission
from scheduler.settings import CelerySettings, DatabaseSettings, SchedulerSettings, Settings
from tests.factories import bootstrap, drain_queue, grpo_spec, make_broker_app

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)
KILLED = (
    "Job entrypoint command failed with exit code 137, last available logs (truncated to 20,000 chars):\n"
)


class FakeRay:
    def __init__(self) -> None:
        self.info: dict[str, RayJobInfo] = {}
        self.stopped: list[str] = []
        self.down = False
        self.calls: list[str] = []  # submissions, in order with `stopped`
        self.on_submit = lambda: None

    def status(self, sub_id: str) -> RayJobInfo | None:
        if self.down:
            raise ConnectionError("Failed to connect to Ray at address: http://127.0.0.1:9")
        return self.info.get(sub_id)

    def stop(self, sub_id: str) -> bool:
        self.stopped.append(sub_id)
        if sub_id in self.info:
            self.info[sub_id] = RayJobInfo(RAY_STOPPED, "stopped")
        return True

    def submit(self, sub_id: str, entrypoint: str, *, env: dict, metadata: dict) -> bool:
        self.calls.append(f"submit {sub_id}")
        self.on_submit()  # what happens while Ray takes its time to answer
        if sub_id in self.info:
            return False
        self.info[sub_id] = RayJobInfo(RAY_RUNNING, None)
        return True

    def logs_tail(self, sub_id: str, lines: int = 200) -> list[str]:
        return (
            ["step 3/10", "Killed"]
            if "137" in (self.info[sub_id].message or "")
            else [
                "Traceback (most recent call last):",
                '  File "hook.py", line 3, in reward',
                "ZeroDivisionError: division by zero",
            ]
        )


@pytest.fixture
def world(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    db = Database(db_url)
    bootstrap(db, tmp_path, slots=2)
    settings = Settings(
        home=tmp_path,
        database=DatabaseSettings(url=db_url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
        scheduler=SchedulerSettings(max_driver_restarts=2, driver_silence_seconds=60),
    )
    app = make_broker_app(settings.broker_url, tmp_path)
    ctx = tasks.WorkerContext(settings=settings, app=app)
    ctx.__dict__["db"] = db
    ctx.__dict__["dispatcher"] = CeleryDispatcher(app)
    ray = FakeRay()
    monkeypatch.setattr(tasks, "launcher_for", lambda address, token=None: ray)
    api = {"answers": True}
    monkeypatch.setattr(tasks, "_api_answers", lambda _ctx: api["answers"])
    yield ctx, ray, api
    db.dispose()


def _running(ctx: tasks.WorkerContext, ray: FakeRay, **spec: object) -> tuple[str, str]:
    """A job that was admitted, launched and reported running (step 3 of 10, a checkpoint of step 2);
    returns (job id, its Ray submission id)."""
    with ctx.db.session() as s:
        job, _ = JobSubmission(s, artifact_root=ctx.settings.artifacts, home=ctx.settings.home).submit(
            ADMIN, Submission(spec=grpo_spec(save="ckpt", **spec))
        )
        job_id = job.id
    assert job_id in run_scheduling_pass(ctx.db, ctx.dispatcher).admitted
    return job_id, _launch_and_run(ctx, ray, job_id)


def _launch_and_run(ctx: tasks.WorkerContext, ray: FakeRay, job_id: str) -> str:
    with ctx.db.session() as s:
        svc = JobLifecycle(s)
        assert svc.transition(job_id, JobStatus.STARTING, expected_from=JobStatus.ADMITTED, reason="launch")
        job = svc.get(job_id)
        job.ray_submission_id = sub_id = f"{job_id}-a{job.attempt}"
        Path(job.output_dir, "ckpt", "iter_0000002").mkdir(parents=True, exist_ok=True)
        JobReports(s).ingest_report(
            job,
            Report(
                attempt=job.attempt,
                seq=0,
                phase="running",
                progress={"step": 3, "total_steps": 10},
                checkpoints=[{"step": 2, "path": f"{job.output_dir}/ckpt/iter_0000002"}],
            ),
        )
    ray.info[sub_id] = RayJobInfo(RAY_RUNNING, None)
    drain_queue(ctx.app, SCHEDULER_QUEUE)
    return sub_id


def _job(ctx: tasks.WorkerContext, job_id: str) -> tuple[Job, int, int]:
    """(the job, allocations it holds, its driver_lost events)."""
    with ctx.db.session() as s:
        job = s.get(Job, job_id)
        held = s.scalar(sa.select(sa.func.count()).select_from(Allocation).where(Allocation.job_id == job_id))
        lost = s.scalar(
            sa.select(sa.func.count())
            .select_from(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.kind == LOST_EVENT)
        )
        s.expunge(job)
        return job, held, lost


def _readmit(ctx: tasks.WorkerContext, ray: FakeRay, job_id: str) -> str:
    assert job_id in run_scheduling_pass(ctx.db, ctx.dispatcher).admitted
    return _launch_and_run(ctx, ray, job_id)


def test_a_running_job_whose_ray_job_is_gone_is_requeued_to_resume_from_its_checkpoint(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray, _ = world
    job_id, sub_id = _running(ctx, ray)
    del ray.info[sub_id]  # the pool's Ray was restarted: it knows nothing of the job
    tasks.reconcile_pool(ctx, "local")
    job, held, lost = _job(ctx, job_id)
    assert job.status == JobStatus.QUEUED and held == 0 and lost == 1
    assert job.status_reason.startswith(f"driver_lost: Ray job {sub_id} is gone"), job.status_reason
    assert "resume from its latest checkpoint (step 2) (restart 1 of 2)" in job.status_reason
    assert job.preemptions == 0 and job.failure_reason is None
    assert (TASK_PASS, []) in drain_queue(ctx.app, SCHEDULER_QUEUE)  # its slots are offered at once
    # The next attempt loads its own checkpoints (the preemption path).
    _readmit(ctx, ray, job_id)
    with ctx.db.session() as s:
        job = s.get(Job, job_id)
        spec = JobReports(s).driver_spec(job)
        assert job.attempt == 2 and spec["load"] == spec["save"] == job.spec["save"]


def test_a_job_whose_driver_finished_before_its_ray_went_away_succeeds(world) -> None:  # type: ignore[no-untyped-def]
    """The issue's "RUNNING forever at 300/300": the driver trained every step and said so in its final
    report, then the platform (and its Ray) went down before the reconciler saw the Ray job end."""
    ctx, ray, _ = world
    job_id, sub_id = _running(ctx, ray)
    with ctx.db.session() as s:
        JobReports(s).ingest_report(
            s.get(Job, job_id),
            Report(
                attempt=1,
                seq=1,
                progress={"step": 10, "total_steps": 10},
                events=[{"kind": "final_report", "message": "exit 0: finished"}],
            ),
        )
    del ray.info[sub_id]
    tasks.reconcile_pool(ctx, "local")
    job, held, lost = _job(ctx, job_id)
    assert job.status == JobStatus.SUCCEEDED and held == 0 and lost == 0, job.status_reason


def test_a_killed_driver_is_resumed_until_its_restart_limit_then_failed_as_lost(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray, _ = world
    job_id, sub_id = _running(ctx, ray)
    for attempt in (1, 2):
        ray.info[sub_id] = RayJobInfo(RAY_FAILED, KILLED, "JOB_ENTRYPOINT_COMMAND_ERROR", 137)
        tasks.reconcile_pool(ctx, "local")
        job, held, lost = _job(ctx, job_id)
        assert job.status == JobStatus.QUEUED and held == 0 and lost == attempt, job.status_reason
        assert "killed by SIGKILL" in job.status_reason and f"restart {attempt} of 2" in job.status_reason
        sub_id = _readmit(ctx, ray, job_id)
    ray.info[sub_id] = RayJobInfo(RAY_FAILED, KILLED, "JOB_ENTRYPOINT_COMMAND_ERROR", -9)
    tasks.reconcile_pool(ctx, "local")
    job, held, lost = _job(ctx, job_id)
    assert job.status == JobStatus.FAILED and job.failure_reason == "lost" and held == 0 and lost == 3
    assert job.status_reason.startswith(
        f"driver_lost: Ray job {sub_id} ended FAILED: the driver was killed by SIGKILL"
    )
    assert "resumed 2 time(s)" in job.status_reason and "AttributeError" not in job.status_reason


def test_use_fault_tolerance_sets_the_limit_with_max_global_restart(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray, _ = world
    job_id, sub_id = _running(ctx, ray, **{"use-fault-tolerance": True, "max-global-restart": 0})
    ray.info[sub_id] = RayJobInfo(RAY_STOPPED, "Job was intentionally stopped.")
    tasks.reconcile_pool(ctx, "local")
    job, held, _ = _job(ctx, job_id)
    assert job.status == JobStatus.FAILED and job.failure_reason == "lost" and held == 0
    assert "ended STOPPED outside the platform" in job.status_reason and "is 0" in job.status_reason


def test_a_driver_that_failed_by_itself_is_not_retried(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray, _ = world
    job_id, sub_id = _running(ctx, ray)
    msg = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
    ray.info[sub_id] = RayJobInfo(RAY_FAILED, msg, "JOB_ENTRYPOINT_COMMAND_ERROR", 1)
    tasks.reconcile_pool(ctx, "local")
    job, held, lost = _job(ctx, job_id)
    assert job.status == JobStatus.FAILED and job.failure_reason == "user_code" and held == 0 and lost == 0
    assert (
        job.status_reason
        == "Job entrypoint command failed with exit code 1: ZeroDivisionError: division by zero"
    )


def test_a_silent_driver_is_stopped_and_resumed_only_while_the_api_answers(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray, api = world
    job_id, sub_id = _running(ctx, ray)
    tasks.reconcile_pool(ctx, "local")  # it just reported: left alone
    assert _job(ctx, job_id)[0].status == JobStatus.RUNNING and ray.stopped == []

    long_ago = utcnow() - timedelta(seconds=61)
    ctx.started_at = long_ago
    with ctx.db.session() as s:
        s.execute(
            sa.update(Job).where(Job.id == job_id).values(last_report_at=long_ago, launched_at=long_ago)
        )
    api["answers"] = False  # the API itself is down: the driver could not have reported
    tasks.reconcile_pool(ctx, "local")
    assert _job(ctx, job_id)[0].status == JobStatus.RUNNING and ray.stopped == []

    api["answers"] = True
    tasks.reconcile_pool(ctx, "local")
    job, held, lost = _job(ctx, job_id)
    assert ray.stopped == [sub_id] and job.status == JobStatus.QUEUED and held == 0 and lost == 1
    assert (
        "the driver sent nothing for 6" in job.status_reason and "was RUNNING; stopped" in job.status_reason
    )


def test_with_the_pools_ray_unreachable_only_a_silent_driver_is_lost(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray, _ = world
    job_id, _sub = _running(ctx, ray)
    ray.down = True
    tasks.reconcile_pool(ctx, "local")  # it reported just now: Ray may be down, its driver is not
    assert _job(ctx, job_id)[0].status == JobStatus.RUNNING

    long_ago = utcnow() - timedelta(seconds=61)
    ctx.started_at = long_ago
    with ctx.db.session() as s:
        s.execute(
            sa.update(Job).where(Job.id == job_id).values(last_report_at=long_ago, launched_at=long_ago)
        )
    tasks.reconcile_pool(ctx, "local")
    job, held, lost = _job(ctx, job_id)
    assert job.status == JobStatus.QUEUED and held == 0 and lost == 1
    assert "does not answer" in job.status_reason and "sent nothing for" in job.status_reason


def test_a_starting_job_whose_driver_had_started_on_a_ray_now_gone_is_requeued(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray, _ = world
    with ctx.db.session() as s:
        job, _ = JobSubmission(s, artifact_root=ctx.settings.artifacts, home=ctx.settings.home).submit(
            ADMIN, Submission(spec=grpo_spec(save="ckpt"))
        )
        job_id = job.id
    run_scheduling_pass(ctx.db, ctx.dispatcher)
    long_ago = utcnow() - timedelta(seconds=ctx.settings.scheduler.launch_grace_seconds + 1)
    with ctx.db.session() as s:
        svc = JobLifecycle(s)
        svc.transition(job_id, JobStatus.STARTING, expected_from=JobStatus.ADMITTED, reason="launch")
        s.execute(
            sa.update(Job)
            .where(Job.id == job_id)
            .values(launched_at=long_ago, ray_submission_id=f"{job_id}-a1", token_claimed_attempt=1)
        )
        s.add(
            Checkpoint(
                job_id=job_id, attempt=1, step=0, path="x", size_bytes=1, format="torch", time=utcnow()
            )
        )
    tasks.reconcile_pool(ctx, "local")  # the same attempt cannot be relaunched: its secret was used
    job, held, lost = _job(ctx, job_id)
    assert job.status == JobStatus.QUEUED and held == 0 and lost == 1, job.status_reason


def test_the_reconciler_records_each_answer_and_silence_of_the_pools_ray(world, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """relax_pool_ray_last_contact_timestamp_seconds and relax_pool_ray_unanswered_total (issue 16 item 5: Ray
    cluster health per pool), set by every reconcile whether or not jobs run there."""
    import time

    from scheduler.observability import PROCESS

    ctx, ray, _api = world
    _running(ctx, ray)
    before = time.time()
    tasks.reconcile_pool(ctx, "local")
    contact = PROCESS.get_sample_value("relax_pool_ray_last_contact_timestamp_seconds", {"pool": "local"})
    assert contact is not None and contact >= before
    missed = PROCESS.get_sample_value("relax_pool_ray_unanswered_total", {"pool": "local"}) or 0.0

    def no_answer(address: str, token: str | None = None) -> FakeRay:
        raise ConnectionError(f"{address}: connection refused")

    monkeypatch.setattr(tasks, "launcher_for", no_answer)
    tasks.reconcile_pool(ctx, "local")
    assert PROCESS.get_sample_value("relax_pool_ray_unanswered_total", {"pool": "local"}) == missed + 1
    assert (
        PROCESS.get_sample_value("relax_pool_ray_last_contact_timestamp_seconds", {"pool": "local"})
        == contact
    )


def test_a_late_submission_of_an_earlier_attempt_is_stopped_before_the_next_one_starts(world) -> None:  # type: ignore[no-untyped-def]
    """A chaos trial (Ray killed while the job waited): attempt 1's submission was answered 4.5 s late, after the
    job had been found gone, requeued and admitted again, and both attempts' drivers ran. The next attempt's
    launch stops what an earlier attempt left running on Ray before it submits its own."""
    ctx, ray, _ = world
    job_id, sub_1 = _running(ctx, ray)
    del ray.info[sub_1]
    tasks.reconcile_pool(ctx, "local")
    assert _job(ctx, job_id)[0].status == JobStatus.QUEUED
    ray.info[sub_1] = RayJobInfo(RAY_RUNNING, None)  # the late submission of attempt 1 arrives
    assert job_id in run_scheduling_pass(ctx.db, ctx.dispatcher).admitted
    stop_first: list[str] = []
    ray.on_submit = lambda: stop_first.extend(ray.stopped)
    tasks.launch_job(ctx, job_id)
    job = _job(ctx, job_id)[0]
    assert job.attempt == 2 and job.status == JobStatus.STARTING
    assert stop_first == [sub_1] and ray.calls == [f"submit {job_id}-a2"]
    assert ray.info[sub_1].status == RAY_STOPPED and ray.info[f"{job_id}-a2"].status == RAY_RUNNING


def test_a_launch_whose_job_moved_on_while_it_submitted_stops_what_it_submitted(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray, _ = world
    with ctx.db.session() as s:
        job, _ = JobSubmission(s, artifact_root=ctx.settings.artifacts, home=ctx.settings.home).submit(
            ADMIN, Submission(spec=grpo_spec())
        )
        job_id = job.id
    assert job_id in run_scheduling_pass(ctx.db, ctx.dispatcher).admitted

    def node_lost() -> None:  # the job is preempted while Ray takes its time to answer the submission
        with ctx.db.session() as s:
            JobLifecycle(s).preempt(job_id, "node local/vm is down", force=True)

    ray.on_submit = node_lost
    tasks.launch_job(ctx, job_id)
    assert ray.calls == [f"submit {job_id}-a1"] and ray.stopped[-1] == f"{job_id}-a1"
    assert ray.info[f"{job_id}-a1"].status == RAY_STOPPED
