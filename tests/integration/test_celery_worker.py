"""A real Celery worker process takes tasks from each broker: the embedded SQL transport and Redis."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from scheduler.celery_app import worker_argv
from scheduler.db.engine import Database
from scheduler.db.models import Job, SchedulerLock
from scheduler.dispatch import CeleryDispatcher
from scheduler.services.auth import Principal
from scheduler.services.outputs import JobOutputs
from scheduler.services.submission import JobSubmission, Submission
from tests.conftest import REDIS_URL
from tests.factories import bootstrap, grpo_spec, make_broker_app

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["embedded", "redis"])
def broker_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "embedded":
        return f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    redis.Redis.from_url(REDIS_URL).flushdb()
    return REDIS_URL


def test_worker_runs_the_pass_and_launch_through_the_broker(
    db_url: str, broker_url: str, tmp_path: Path
) -> None:
    db = Database(db_url)
    # The pool's Ray address is a closed port: the launch reaches the worker, which fails the job
    # with a setup error naming the address. (tests/ray and tests/e2e launch on a real Ray.)
    bootstrap(db, tmp_path, ray_address="http://127.0.0.1:9")
    with db.session() as s:
        job, _ = JobSubmission(s, artifact_root=tmp_path / "artifacts", home=tmp_path).submit(
            ADMIN, Submission(spec=grpo_spec())
        )
    env = os.environ | {
        "RELAX_HOME": str(tmp_path),
        "RELAX_DATABASE_URL": db_url,
        "RELAX_BROKER_URL": broker_url,
        "RELAX_SCHEDULER_TICK_SECONDS": "3600",  # only our explicit request may trigger the pass
    }
    worker = subprocess.Popen(
        worker_argv("scheduler,pool.local", name=f"test-{os.getpid()}@%h", threads=2),
        cwd=ROOT,
        env=env,
        stdout=open(tmp_path / "worker.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        CeleryDispatcher(make_broker_app(broker_url, tmp_path)).request_pass()
        deadline = time.time() + 60
        status = None
        while time.time() < deadline:
            with db.session() as s:
                status, reason = s.execute(
                    sa.select(Job.status, Job.status_reason).where(Job.id == job.id)
                ).one()
            if status == "FAILED":
                break
            time.sleep(0.2)
        log = (tmp_path / "worker.log").read_text()
        assert status == "FAILED", log[-3000:]
        assert "127.0.0.1:9" in reason
        with db.session() as s:
            events = JobOutputs(s).events(s.get(Job, job.id))
            assert [e.to_status for e in events] == ["QUEUED", "ADMITTED", "STARTING", "FAILED"]
            assert s.get(Job, job.id).failure_reason == "setup"
            # the worker records its heartbeat (/readyz, scheduler/health.py)
            beats = s.scalars(
                sa.select(SchedulerLock.name).where(SchedulerLock.name.like("heartbeat:worker:%"))
            )
            assert list(beats), log[-3000:]
    finally:
        worker.terminate()
        worker.wait(30)
        db.dispose()
