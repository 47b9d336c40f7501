"""The job services (submission, lifecycle, reports) and the scheduling pass against real SQLite and PostgreSQL databases."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from runtime.report_protocol import Report
from scheduler.db.engine import Database
from scheduler.db.models import Allocation, Job, JobEvent, Metric
from scheduler.dispatch import TASK_LAUNCH, CeleryDispatcher, pool_queue
from scheduler.domain.errors import Conflict, InvalidSpec, InvalidTransition
from scheduler.domain.jobs import JobStatus
from scheduler.scheduling import run_scheduling_pass
from scheduler.services.auth import Principal
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.reports import JobReports
from scheduler.services.submission import JobSubmission, Submission
from tests.factories import bootstrap, drain_queue, grpo_spec, make_broker_app

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)


@pytest.fixture
def broker(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The real dispatcher on the embedded broker: tests read back what the pass enqueued."""
    app = make_broker_app(f"sqla+sqlite:///{tmp_path / 'broker.db'}", tmp_path)
    return app, CeleryDispatcher(app)


@pytest.fixture
def db(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    database = Database(db_url)
    bootstrap(database, tmp_path, slots=2)
    yield database
    database.dispose()


def submit(db: Database, tmp_path: Path, **kw) -> str:  # type: ignore[no-untyped-def]
    with db.session() as s:
        job, _ = JobSubmission(s, artifact_root=tmp_path / "artifacts", home=tmp_path).submit(
            ADMIN, Submission(**kw)
        )
        return job.id


def test_submit_stores_a_queued_job_with_its_event(db: Database, tmp_path: Path) -> None:
    job_id = submit(db, tmp_path, spec=grpo_spec(save="ckpt"), name="grpo-a")
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job.status == JobStatus.QUEUED
        assert job.spec["rollout_batch_size"] == 4
        area = tmp_path / "artifacts" / "teams" / job.team_id
        assert job.spec["save"] == str(area / "jobs" / job_id / "ckpt")
        assert job.output_dir == str(area / "jobs" / job_id)
        assert job.total_gpus >= 1
        events = s.scalars(sa.select(JobEvent).where(JobEvent.job_id == job_id)).all()
        assert [(e.from_status, e.to_status) for e in events] == [(None, "QUEUED")]


def test_invalid_spec_stores_nothing(db: Database, tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec) as err:
        submit(db, tmp_path, spec=grpo_spec(**{"rollout-batch-size": "many"}))
    assert any(i["field"] == "rollout-batch-size" for i in err.value.details["issues"])
    with pytest.raises(InvalidSpec) as err:
        submit(db, tmp_path, spec=grpo_spec(**{"rollout-batch-sise": 4}))
    assert "rollout-batch-size" in str(err.value.details["issues"])  # did-you-mean
    with db.session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Job)) == 0


def test_idempotency_key_returns_the_same_job(db: Database, tmp_path: Path) -> None:
    a = submit(db, tmp_path, spec=grpo_spec(), idempotency_key="k1")
    b = submit(db, tmp_path, spec=grpo_spec(), idempotency_key="k1")
    c = submit(db, tmp_path, spec=grpo_spec(), idempotency_key="k2")
    assert a == b != c


def test_transition_is_compare_and_set(db: Database, tmp_path: Path) -> None:
    job_id = submit(db, tmp_path, spec=grpo_spec())
    with db.session() as s:
        svc = JobLifecycle(s)
        assert svc.transition(job_id, JobStatus.ADMITTED, expected_from=JobStatus.QUEUED, reason="r")
        # a second writer that still believes the job is QUEUED loses
        assert not svc.transition(job_id, JobStatus.ADMITTED, expected_from=JobStatus.QUEUED, reason="r")
        with pytest.raises(InvalidTransition):
            svc.transition(job_id, JobStatus.RUNNING, expected_from=JobStatus.QUEUED, reason="r")


def test_scheduling_pass_admits_within_capacity_and_explains_the_wait(
    db: Database, tmp_path: Path, broker
) -> None:  # type: ignore[no-untyped-def]
    app, disp = broker
    ids = [submit(db, tmp_path, spec=grpo_spec()) for _ in range(3)]
    result = run_scheduling_pass(db, disp)
    with db.session() as s:
        jobs = {j.id: j for j in s.scalars(sa.select(Job))}
        used = s.scalar(sa.select(sa.func.sum(Allocation.gpus)).where(sa.not_(Allocation.shared)))
    per_job = jobs[ids[0]].total_gpus
    fitting = 2 // per_job
    assert len(result.admitted) == fitting
    # one launch task per admitted job, on the pool's queue
    assert drain_queue(app, pool_queue("local")) == [(TASK_LAUNCH, [j]) for j in result.admitted]
    assert used == per_job * fitting <= 2
    waiting = [j for j in jobs.values() if j.status == JobStatus.QUEUED]
    assert waiting and all(j.wait_reason and j.queue_position for j in waiting)
    # a second pass admits nothing more: the slots are taken
    assert run_scheduling_pass(db, disp).admitted == []


def test_cancel_frees_slots(db: Database, tmp_path: Path, broker) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(db, tmp_path, spec=grpo_spec())
    run_scheduling_pass(db, broker[1])
    with db.session() as s:
        svc = JobLifecycle(s)
        assert svc.transition(job_id, JobStatus.STARTING, expected_from=JobStatus.ADMITTED, reason="launch")
        svc.transition(job_id, JobStatus.RUNNING, expected_from=JobStatus.STARTING, reason="up")
        job = svc.cancel(job_id, ADMIN)
        assert job.status == JobStatus.CANCELLING
        assert s.scalar(sa.select(sa.func.count()).select_from(Allocation)) > 0  # still held until Ray stops
        svc.transition(job_id, JobStatus.CANCELLED, expected_from=JobStatus.CANCELLING, reason="stopped")
        assert s.scalar(sa.select(sa.func.count()).select_from(Allocation)) == 0
        with pytest.raises(Conflict):
            svc.cancel(job_id, ADMIN)


def test_reports_are_applied_once_and_fenced_by_attempt(db: Database, tmp_path: Path, broker) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(db, tmp_path, spec=grpo_spec())
    run_scheduling_pass(db, broker[1])
    with db.session() as s:
        svc, reports = JobLifecycle(s), JobReports(s)
        svc.transition(job_id, JobStatus.STARTING, expected_from=JobStatus.ADMITTED, reason="launch")
        job = svc.get(job_id)
        assert job.attempt == 1
        report = Report(
            attempt=1,
            seq=0,
            phase="running",
            progress={"step": 1, "total_steps": 3},
            metrics=[{"step": 1, "name": "rollout/reward", "value": 0.25, "time": 1.0}],
            logs=[{"message": "hello", "time": 1.0}],
        )
        assert reports.ingest_report(job, report) is False
        assert reports.ingest_report(job, report) is False  # a retry of the same batch
        assert job.status == JobStatus.RUNNING and job.progress_step == 1
        assert s.scalar(sa.select(sa.func.count()).select_from(Metric)) == 1
        with pytest.raises(Conflict):
            reports.ingest_report(job, Report(attempt=0, seq=5))
        svc.cancel(job_id, ADMIN)
        assert reports.ingest_report(job, Report(attempt=1, seq=1)) is True  # the driver is asked to stop


def test_a_preempted_job_resumes_from_its_checkpoint(db: Database, tmp_path: Path, broker) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(db, tmp_path, spec=grpo_spec(save="ckpt"))
    run_scheduling_pass(db, broker[1])
    with db.session() as s:
        svc, reports = JobLifecycle(s), JobReports(s)
        svc.transition(job_id, JobStatus.STARTING, expected_from=JobStatus.ADMITTED, reason="launch")
        job = svc.get(job_id)
        assert "load" not in reports.driver_spec(job) or reports.driver_spec(job)["load"] is None
        reports.ingest_report(
            job,
            Report(
                attempt=1,
                seq=0,
                phase="running",
                checkpoints=[
                    {
                        "step": 3,
                        "path": job.spec["save"] + "/iter_0000003",
                        "size_bytes": 10,
                        "format": "torch",
                    }
                ],
            ),
        )
        assert svc.preempt(job_id, "test") == JobStatus.PREEMPTING
        assert reports.ingest_report(job, Report(attempt=1, seq=1)) is True  # checkpoint and exit
        svc.transition(job_id, JobStatus.QUEUED, expected_from=JobStatus.PREEMPTING, reason="driver exited")
        assert svc.get(job_id).preemptions == 1
        folder = Path(job.spec["save"]) / "iter_0000003"  # the files the record names (checked on resume)
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text("{}")
    run_scheduling_pass(db, broker[1])
    with db.session() as s:
        svc = JobLifecycle(s)
        svc.transition(job_id, JobStatus.STARTING, expected_from=JobStatus.ADMITTED, reason="relaunch")
        job = svc.get(job_id)
        assert job.attempt == 2
        assert JobReports(s).driver_spec(job)["load"] == job.spec["save"]


def test_a_high_priority_job_is_not_preempted(db: Database, tmp_path: Path, broker) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(db, tmp_path, spec=grpo_spec(), priority_class="high")
    run_scheduling_pass(db, broker[1])
    with db.session() as s:
        svc = JobLifecycle(s)
        with pytest.raises(Conflict):
            svc.preempt(job_id, "reclaim")
        assert svc.preempt(job_id, "node lost", force=True) == JobStatus.QUEUED
