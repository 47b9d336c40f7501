"""Nothing acknowledged is lost (docs/reliability.md), against real SQLite and PostgreSQL, the real API and
the real reporter (real HTTP, real spool files), with a fake Ray: a resent report is stored once; a job whose
Ray job ended is SUCCEEDED only once its driver's final report is stored; the reconciler delivers what an
ended driver left in its spool; checkpoint records follow the files on disk, and a resume finds a checkpoint
whose registration was lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from runtime.launcher import RAY_SUCCEEDED, RayJobInfo
from runtime.report_protocol import Report
from runtime.reporter import HttpReporter, Phase
from runtime.spool import DiskSpool, spool_dir, spool_key
from runtime.train.checkpoint import (
    CheckpointFormat,
    CheckpointRecord,
    latest_complete_iteration,
    write_latest_iteration,
)
from scheduler import tasks
from scheduler.db.engine import Database
from scheduler.db.models import Checkpoint, Job, JobEvent, Metric
from scheduler.dispatch import CeleryDispatcher
from scheduler.domain.jobs import JobStatus
from scheduler.services.auth import Principal
from scheduler.services.job_tokens import bootstrap_secret, job_token
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.reports import WAITING_FOR_FINAL_REPORT, JobReports
from scheduler.services.submission import JobSubmission, Submission
from scheduler.settings import CelerySettings, DatabaseSettings, Settings
from tests.factories import bootstrap, grpo_spec, make_broker_app

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)
FINAL = {"kind": "final_report", "message": "exit 0: finished"}


class FakeRay:
    def __init__(self) -> None:
        self.status_of: dict[str, str] = {}

    def status(self, sub_id: str) -> RayJobInfo | None:
        return RayJobInfo(self.status_of[sub_id], None) if sub_id in self.status_of else None

    def stop(self, sub_id: str) -> bool:
        return True

    def logs_tail(self, sub_id: str, lines: int = 200) -> list[str]:
        return []


@pytest.fixture
def world(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    db = Database(db_url)
    bootstrap(db, tmp_path, slots=2)
    settings = Settings(
        home=tmp_path,
        database=DatabaseSettings(url=db_url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
    )
    app = make_broker_app(settings.broker_url, tmp_path)
    ctx = tasks.WorkerContext(settings=settings, app=app)
    ctx.__dict__["db"] = db
    ctx.__dict__["dispatcher"] = CeleryDispatcher(app)
    ray = FakeRay()
    monkeypatch.setattr(tasks, "launcher_for", lambda address, token=None: ray)
    yield ctx, ray
    db.dispose()


def _reports(s: Any, ctx: tasks.WorkerContext) -> JobReports:
    return JobReports(s, artifact_root=ctx.settings.artifacts, home=ctx.settings.home)


def _running_job(ctx: tasks.WorkerContext, ray: FakeRay) -> tuple[str, str]:
    """A job whose attempt 1 runs (no report yet); its Ray job is RUNNING. Returns (id, its save folder)."""
    with ctx.db.session() as s:
        submission = JobSubmission(s, artifact_root=ctx.settings.artifacts, home=ctx.settings.home)
        job, _ = submission.submit(ADMIN, Submission(spec=grpo_spec(save="ckpt")))
        svc = JobLifecycle(s)
        for src, dst in (("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING"), ("STARTING", "RUNNING")):
            assert svc.transition(job.id, dst, expected_from=src, reason="test")
        job.ray_submission_id = f"{job.id}-a1"
        ray.status_of[job.ray_submission_id] = "RUNNING"
        return job.id, str(job.spec["save"])


def _job(ctx: tasks.WorkerContext, job_id: str) -> Job:
    with ctx.db.session() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def _events(ctx: tasks.WorkerContext, job_id: str, kind: str) -> list[str]:
    with ctx.db.session() as s:
        q = sa.select(JobEvent.reason).where(JobEvent.job_id == job_id, JobEvent.kind == kind)
        return list(s.scalars(q.order_by(JobEvent.id)))


def _checkpoint(save: str, iteration: int, owner: str, *, complete: bool = True) -> Path:
    """An `iter_NNNNNNN` folder as the trainer leaves it (complete: with its state file)."""
    folder = Path(save) / f"iter_{iteration:07d}"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "weights.bin").write_bytes(b"w" * 100)
    (folder / ".relax-job").write_text(owner + "\n")
    if complete:
        (folder / "trainer_state.json").write_text(json.dumps({"iteration": iteration}))
    return folder


def test_a_resent_report_is_stored_once_and_a_gap_is_refused(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    from tests.factories import make_job

    job_id = make_job(client.app.state.db, artifact_root=settings.artifacts)
    with client.app.state.db.session() as s:
        svc = JobLifecycle(s)
        for src, dst in (("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING")):
            assert svc.transition(job_id, dst, expected_from=src, reason="test")
    secret = bootstrap_secret(settings.signing_key(), job_id, 1)
    token = client.post(f"/v1/internal/jobs/{job_id}/token", headers={"Authorization": f"Bearer {secret}"})
    headers = {"Authorization": f"Bearer {token.json()['token']}"}
    url = f"/v1/internal/jobs/{job_id}/report"

    def report(seq: int, *steps: int) -> dict[str, Any]:
        metrics = [{"step": step, "name": "train/loss", "value": 1.0} for step in steps]
        return {"attempt": 1, "seq": seq, "metrics": metrics}

    def points() -> list[int]:
        with client.app.state.db.session() as s:
            return sorted(s.scalars(sa.select(Metric.step).where(Metric.job_id == job_id)))

    assert client.post(url, json=report(0, 0, 1), headers=headers).status_code == 200
    # the driver never heard the answer (the API died after storing it) and sends the same report again
    assert client.post(url, json=report(0, 0, 1), headers=headers).json() == {"stop_requested": False}
    assert points() == [0, 1]  # acknowledged, not stored twice
    gap = client.post(url, json=report(2, 4), headers=headers)
    assert gap.status_code == 422 and gap.json()["error"]["code"] == "report.seq_gap"
    assert points() == [0, 1]  # refused: the sender resends in order
    assert client.post(url, json=report(1, 2, 3), headers=headers).status_code == 200
    assert client.post(url, json=report(2, 4), headers=headers).status_code == 200
    assert client.post(url, json=report(1, 2, 3), headers=headers).status_code == 200  # an older resend
    assert points() == [0, 1, 2, 3, 4]
    # and only from the live attempt's token: another job's token is the same 401 as ever
    other = {"Authorization": f"Bearer {job_token(settings.signing_key(), 'job_other', 1)}"}
    assert client.post(url, json=report(3, 5), headers=other).status_code == 401


def test_a_job_is_succeeded_only_once_its_final_report_is_stored(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray = world
    job_id, _ = _running_job(ctx, ray)
    with ctx.db.session() as s:
        _reports(s, ctx).ingest_report(s.get(Job, job_id), Report(attempt=1, seq=0, phase="running"))
    ray.status_of[f"{job_id}-a1"] = RAY_SUCCEEDED  # the driver exited 0; its last reports have not arrived
    tasks.reconcile_pool(ctx, "local")
    job = _job(ctx, job_id)
    assert job.status == JobStatus.RUNNING and job.status_reason == WAITING_FOR_FINAL_REPORT
    assert len(_events(ctx, job_id, "awaiting_final_report")) == 1
    tasks.reconcile_pool(ctx, "local")  # still waiting, recorded once
    assert _job(ctx, job_id).status == JobStatus.RUNNING
    assert len(_events(ctx, job_id, "awaiting_final_report")) == 1

    with ctx.db.session() as s:  # the driver's last report arrives late (e.g. the API came back)
        _reports(s, ctx).ingest_report(s.get(Job, job_id), Report(attempt=1, seq=1, events=[FINAL]))
    tasks.reconcile_pool(ctx, "local")
    job = _job(ctx, job_id)
    assert job.status == JobStatus.SUCCEEDED and "final report is stored" in job.status_reason

    # One that never gets it fails after the grace period, saying why (not SUCCEEDED at 73/300).
    lost_id, _ = _running_job(ctx, ray)
    ray.status_of[f"{lost_id}-a1"] = RAY_SUCCEEDED
    tasks.reconcile_pool(ctx, "local")
    assert _job(ctx, lost_id).status == JobStatus.RUNNING
    ctx.settings.scheduler.final_report_grace_seconds = 0.0
    tasks.reconcile_pool(ctx, "local")
    lost = _job(ctx, lost_id)
    assert lost.status == JobStatus.FAILED and lost.failure_reason == "lost"
    assert "final report never reached the platform" in lost.status_reason


def test_the_reconciler_delivers_what_an_ended_driver_left_in_its_spool(world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ctx, ray = world
    job_id, save = _running_job(ctx, ray)
    job = _job(ctx, job_id)
    folder = spool_dir(job.output_dir, 1)
    token = job_token(ctx.settings.signing_key(), job_id, 1)

    # Someone else who can write the job's folder plants a report: it is not signed with the attempt's key.
    forged = DiskSpool(folder, spool_key("rjt_1_" + "0" * 64))
    forged.append({"attempt": 1, "seq": 0, "metrics": [{"step": 0, "name": "train/loss", "value": 666.0}]})
    forged.close()
    tasks.reconcile_pool(ctx, "local")  # the Ray job still runs: nothing is collected while it does
    with ctx.db.session() as s:
        assert _reports(s, ctx).collect_spool(s.get(Job, job_id), ctx.settings.signing_key()).applied == 0
    assert _job(ctx, job_id).report_seq == -1
    assert "does not verify" in _events(ctx, job_id, "spool_collected")[-1]
    for segment in folder.iterdir():
        segment.unlink()

    # The real driver's reporter: the API is down for the whole run (nothing listens on port 9).
    reporter = HttpReporter(
        "http://127.0.0.1:9", job_id, token, attempt=1, flush_interval=0.01, max_backoff=0.05, timeout=0.2
    )
    reporter.attach_spool(folder)
    reporter.set_phase(Phase.RUNNING)
    produced = []
    for step in range(400):
        reporter.metrics(step, {"train/loss": 1.0 / (step + 1), "train/lr": 1e-3})
        reporter.set_progress(step + 1, 400)
        produced += [(step, "train/loss", 1.0 / (step + 1)), (step, "train/lr", 1e-3)]
    ckpt = _checkpoint(save, 399, job_id)
    reporter.checkpoint(
        CheckpointRecord(399, str(ckpt), 100, CheckpointFormat.TORCH, 1.0),
    )
    assert reporter.close(timeout=0.5, final="exit 0: finished") is False  # left on disk
    assert any(folder.glob("seg-*.jsonl"))

    ray.status_of[f"{job_id}-a1"] = RAY_SUCCEEDED
    tasks.reconcile_pool(ctx, "local")  # the worker reads the spool: the DB is up even if the API is not
    job = _job(ctx, job_id)
    assert job.status == JobStatus.SUCCEEDED, job.status_reason
    assert job.progress_step == 400
    with ctx.db.session() as s:
        stored = [
            (m.step, m.name, m.value) for m in s.scalars(sa.select(Metric).where(Metric.job_id == job_id))
        ]
        checkpoints = list(s.scalars(sa.select(Checkpoint.step).where(Checkpoint.job_id == job_id)))
    assert sorted(stored) == sorted(produced)  # every point exactly once
    assert checkpoints == [399]  # registered once (by its report; the disk agreed)
    assert not folder.exists()  # delivered: the spool is gone
    assert "report(s) collected from the driver's spool" in _events(ctx, job_id, "spool_collected")[-1]


def test_a_spooled_report_is_checked_as_the_api_checks_one(world) -> None:  # type: ignore[no-untyped-def]
    """The spool's reports are `Report`s validated as the API validates a report sent to it: one the API would
    refuse (a step beyond its 32-bit column; SQLite would have stored it) stops the collection there, nothing
    of it or after it is stored, and the reason names the item."""
    ctx, ray = world
    job_id, _ = _running_job(ctx, ray)
    job = _job(ctx, job_id)
    spool = DiskSpool(
        spool_dir(job.output_dir, 1), spool_key(job_token(ctx.settings.signing_key(), job_id, 1))
    )
    spool.append({"attempt": 1, "seq": 0, "metrics": [{"step": 2**31, "name": "train/loss", "value": 1.0}]})
    spool.append({"attempt": 1, "seq": 1, "metrics": [{"step": 1, "name": "train/loss", "value": 1.0}]})
    spool.close()
    with ctx.db.session() as s:
        found = _reports(s, ctx).collect_spool(s.get(Job, job_id), ctx.settings.signing_key())
    assert (found.applied, found.stored, found.left) == (0, 0, 2)
    assert (
        found.problem is not None and "ValidationError" in found.problem and "metrics.0.step" in found.problem
    )
    assert _job(ctx, job_id).report_seq == -1
    with ctx.db.session() as s:
        assert s.scalars(sa.select(Metric).where(Metric.job_id == job_id)).all() == []


def test_checkpoint_records_follow_the_disk_and_a_resume_finds_an_unregistered_one(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray = world
    job_id, save = _running_job(ctx, ray)
    registered = _checkpoint(save, 1, job_id)
    with ctx.db.session() as s:
        _reports(s, ctx).ingest_report(
            s.get(Job, job_id),
            Report(attempt=1, seq=0, checkpoints=[{"step": 1, "path": str(registered), "size_bytes": 1}]),
        )
    write_latest_iteration(save, 1)
    _checkpoint(save, 3, job_id)  # written, but its registration was lost (the driver was killed)
    write_latest_iteration(save, 2)  # the tracker lags (a crash between the rename and its update)
    _checkpoint(save, 4, job_id, complete=False)  # no state file: not a checkpoint
    foreign = _checkpoint(save, 5, "job_someone_else")  # not this job's: never registered as its own
    for path in sorted(Path(registered).rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    Path(registered).rmdir()  # a person (or a lost disk) removed a registered one

    with ctx.db.session() as s:
        result = _reports(s, ctx).reconcile_checkpoints(s.get(Job, job_id))
    assert result.registered == [3] and result.missing == [str(registered)]
    with ctx.db.session() as s:
        rows = [(c.step, c.path) for c in s.scalars(sa.select(Checkpoint).where(Checkpoint.job_id == job_id))]
    assert rows == [(3, str(Path(save) / "iter_0000003"))]
    assert "gone" in _events(ctx, job_id, "checkpoint_missing")[0]
    assert "without a registration" in _events(ctx, job_id, "checkpoint_registered")[0]
    (foreign / "trainer_state.json").unlink()
    assert latest_complete_iteration(save) == 3  # resume takes the newest complete one, not the tracker's 2

    # A relaunch of a job none of whose checkpoints was registered still resumes from the disk.
    other_id, other_save = _running_job(ctx, ray)
    _checkpoint(other_save, 7, other_id)
    with ctx.db.session() as s:
        svc = JobLifecycle(s)
        for src, dst in (("RUNNING", "PREEMPTING"), ("PREEMPTING", "QUEUED"), ("QUEUED", "ADMITTED")):
            assert svc.transition(other_id, dst, expected_from=src, reason="test")
        assert svc.transition(other_id, "STARTING", expected_from="ADMITTED", reason="relaunch")
        spec = _reports(s, ctx).driver_spec(s.get(Job, other_id))
    assert spec["load"] == other_save
    with ctx.db.session() as s:
        assert list(s.scalars(sa.select(Checkpoint.step).where(Checkpoint.job_id == other_id))) == [7]
