"""PostgreSQL or Redis going away, and coming back (issue 11, item 5; docs/reliability.md "Crash trials and
outages"). The machine's PostgreSQL and Redis stay up (other tests use them): the platform reaches each
through a TCP proxy (`_outage_proxy.py`) that a test cuts (every connection reset, new ones reset at once)
and restores.

- The database cut: every request that needs it answers 503 `service.unavailable` naming the database, with
  Retry-After, never a 500 (a driver's report too: 503, which its reporter retries, not a refusal that would
  stop it); `/readyz` answers 503 naming it; `/healthz` still 200. Restored: the very next requests succeed
  (the engine's pool pre-ping replaces the dead connections).
- The broker cut: a submission is stored (201, QUEUED): the database is the truth, and the scheduling pass
  its commit asks for is only a hint that the beat's next tick repeats; `/readyz` answers 503 naming the
  broker. Restored: a real Celery worker, which lived through both outages behind the same proxies, takes
  tasks again and schedules every job, the one submitted during the cut included.
- A launch task lost with the broker (the pass committed, its publish failed) is sent again by the tick
  instead of the job holding its slots forever; a launch while the embedded Ray restarts waits for it."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from fastapi.testclient import TestClient

from api.app import create_app
from scheduler import health
from scheduler.celery_app import worker_argv
from scheduler.db.engine import Database
from scheduler.db.migrate import upgrade
from scheduler.db.models import Job
from scheduler.services.job_tokens import job_token
from scheduler.settings import CelerySettings, DatabaseSettings, Settings
from tests.conftest import PG_URL, REDIS_URL
from tests.factories import bootstrap, drain_queue, grpo_spec, make_broker_app
from tests.integration._outage_proxy import OutageProxy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def services(tmp_path: Path) -> Iterator[dict]:
    """A PostgreSQL schema and a Redis database, each behind its own proxy; the platform's settings point at
    the proxies. {"pg", "redis": proxies, "settings", "db": a Database through the proxy, "direct": one not}"""
    pg_target, redis_target = sa.make_url(PG_URL), redis.Redis.from_url(REDIS_URL)
    redis_target.flushdb()
    pg = OutageProxy(pg_target.port or 5432, pg_target.host or "127.0.0.1")
    rd = OutageProxy(redis_target.connection_pool.connection_kwargs.get("port", 6379))
    schema = f"relax_outage_{os.getpid()}_{time.time_ns() % 10**8}"
    admin = sa.create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    direct_url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    proxied_url = direct_url.replace(f"@{pg_target.host}:{pg_target.port}", f"@127.0.0.1:{pg.port}")
    assert proxied_url != direct_url, PG_URL  # the URL names host:port explicitly
    upgrade(direct_url)
    redis_db = redis_target.connection_pool.connection_kwargs.get("db", 0)
    settings = Settings(
        home=tmp_path,
        database=DatabaseSettings(url=proxied_url),
        celery=CelerySettings(broker_url=f"redis://127.0.0.1:{rd.port}/{redis_db}"),
    )
    direct, db = Database(direct_url), Database(proxied_url)
    try:
        yield {"pg": pg, "redis": rd, "settings": settings, "db": db, "direct": direct, "key": None}
    finally:
        pg.close()
        rd.close()
        db.dispose()
        direct.dispose()
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()
        redis_target.flushdb()


@pytest.fixture
def client(services: dict, tmp_path: Path) -> Iterator[TestClient]:
    """The real app (its own Celery producer on the proxied Redis) on the proxied PostgreSQL, as admin."""
    key = bootstrap(services["direct"], tmp_path)
    with TestClient(create_app(services["settings"], db=services["db"])) as c:
        c.headers["Authorization"] = f"Bearer {key}"
        yield c


def _unavailable(r, service: str) -> None:  # type: ignore[no-untyped-def]
    assert r.status_code == 503, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["code"] == "service.unavailable" and err["details"] == {"service": service}, err
    assert service in err["message"] and err["request_id"]
    assert r.headers["Retry-After"] == "5"


def _status(db: Database, job_id: str) -> tuple[str, str | None]:
    with db.session(read_only=True) as s:
        return tuple(s.execute(sa.select(Job.status, Job.status_reason).where(Job.id == job_id)).one())  # type: ignore[return-value]


def test_the_database_away_is_503_and_a_failing_readyz_and_all_proceeds_once_it_returns(
    services: dict, client: TestClient
) -> None:
    job = client.post("/v1/jobs", json={"spec": grpo_spec()})
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    assert client.get("/readyz").status_code == 200

    services["pg"].cut()
    token = job_token(services["settings"].signing_key(), job_id, 1)
    calls = [
        ("GET", "/v1/jobs", None),
        ("POST", "/v1/jobs", {"spec": grpo_spec()}),
        ("GET", f"/v1/jobs/{job_id}", None),
        ("GET", f"/v1/jobs/{job_id}/metrics", None),
        ("GET", f"/v1/jobs/{job_id}/stream", None),
        ("POST", f"/v1/jobs/{job_id}/cancel", None),
        ("POST", "/v1/specs/validate", {"spec": grpo_spec()}),
        ("GET", "/v1/pools", None),
        ("POST", "/v1/teams", {"name": "newteam"}),
        ("GET", "/metrics", None),
    ]
    for method, path, body in calls:
        _unavailable(client.request(method, path, json=body), "database")
    # a driver's report: 503, which its reporter resends (a 401 or 409 would make it give up)
    report = {
        "attempt": 1,
        "seq": 0,
        "metrics": [{"step": 0, "name": "train/loss", "value": 1.0, "time": 1e9}],
    }
    r = client.post(
        f"/v1/internal/jobs/{job_id}/report", json=report, headers={"Authorization": f"Bearer {token}"}
    )
    _unavailable(r, "database")
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["database"] == "down" and r.json()["down"] == "database", r.text
    assert client.get("/healthz").status_code == 200
    assert services["pg"].refused > 0

    services["pg"].restore()
    # the next requests succeed: the engine drops the dead connections and connects again
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "QUEUED"
    again = client.post("/v1/jobs", json={"spec": grpo_spec()})
    assert again.status_code == 201, again.text
    assert [j["id"] for j in client.get("/v1/jobs").json()["data"]] == [again.json()["id"], job_id]
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["database"] == "postgresql", r.text


def test_the_broker_away_stores_submissions_fails_readyz_and_a_worker_schedules_them_once_it_returns(
    services: dict, client: TestClient, tmp_path: Path
) -> None:
    settings: Settings = services["settings"]
    env = os.environ | {
        "RELAX_HOME": str(tmp_path),
        "RELAX_DATABASE_URL": settings.database_url,
        "RELAX_BROKER_URL": settings.broker_url,
        "RELAX_SCHEDULER_TICK_SECONDS": "3600",  # no beat here: only submissions ask for a pass
        "RELAX_SCHEDULER_HEARTBEAT_SECONDS": "1",
    }
    argv = worker_argv("scheduler,pool.local", name=f"outage-{os.getpid()}@%h", threads=2)
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115

    def wait_for(what, timeout: float = 60):  # type: ignore[no-untyped-def]
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = what()
            if got:
                return got
            assert worker.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"not within {timeout}s:\n{log.read_text()[-3000:]}")

    def scheduled(job_id: str) -> bool:
        # the pool's Ray is a closed port: a job the worker took ends FAILED (setup) naming it
        status, reason = _status(services["direct"], job_id)
        return status == "FAILED" and "127.0.0.1:9" in (reason or "")

    try:
        wait_for(lambda: client.get("/readyz").json().get("worker") == "up")
        first = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()["id"]
        wait_for(lambda: scheduled(first))
        # its failed launch asked for one more pass (slots freed): let it run before the cut, or it admits
        # the job submitted during the outage (a pass asked for before an outage may run in it)
        wait_for(lambda: log.read_text().count("scheduling pass:") >= 2)

        services["redis"].cut()
        t0 = time.time()
        during = client.post("/v1/jobs", json={"spec": grpo_spec()})
        took = time.time() - t0
        assert during.status_code == 201 and during.json()["status"] == "QUEUED", during.text
        assert took < 5, took  # the failed hand-off to the broker costs the request well under a second
        r = client.get("/readyz")
        assert r.status_code == 503 and r.json()["broker"] == "down" and r.json()["down"] == "broker", r.text
        assert client.get(f"/v1/jobs/{during.json()['id']}").status_code == 200  # reads need no broker
        time.sleep(2)  # the worker sees its broker connection gone and retries
        assert _status(services["direct"], during.json()["id"])[0] == "QUEUED"

        services["redis"].restore()
        assert client.get("/readyz").status_code == 200
        after = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()["id"]
        # the worker reconnects; the pass this submission asks for schedules the one of the outage too
        wait_for(lambda: scheduled(after) and scheduled(during.json()["id"]), 90)

        services["pg"].cut()
        _unavailable(client.post("/v1/jobs", json={"spec": grpo_spec()}), "database")
        time.sleep(2.5)  # heartbeats fail meanwhile; the worker keeps running
        assert worker.poll() is None, log.read_text()[-3000:]
        services["pg"].restore()
        last = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()["id"]
        wait_for(lambda: scheduled(last))
        wait_for(lambda: client.get("/readyz").status_code == 200)  # its heartbeat is recorded again
        assert "heartbeat not recorded" in log.read_text()  # it did notice the outage
    finally:
        worker.terminate()
        worker.wait(30)


def test_a_launch_lost_with_the_broker_is_sent_again_instead_of_holding_slots_forever(
    services: dict, client: TestClient
) -> None:
    """The broker goes away just as a scheduling pass admits a job: the pass commits (slots reserved), its
    launch task is lost. The tick sends it again (`scheduler.tasks.relaunch_stalled`) once the job has been
    ADMITTED for a while; before this the job held its slots forever (only STARTING on is reconciled)."""
    from scheduler.dispatch import CeleryDispatcher
    from scheduler.scheduling import run_scheduling_pass
    from scheduler.tasks import WorkerContext, relaunch_stalled

    settings: Settings = services["settings"]
    broker = make_broker_app(settings.broker_url, settings.home)
    job_id = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()["id"]
    drain_queue(broker, "scheduler")
    services["redis"].cut()
    admitted = run_scheduling_pass(services["db"], CeleryDispatcher(broker))
    assert admitted.admitted == [job_id] and _status(services["db"], job_id)[0] == "ADMITTED"
    services["redis"].restore()
    assert drain_queue(broker, "pool.local") == []  # the launch never reached the broker

    ctx = WorkerContext(settings=settings, app=broker)
    ctx.__dict__["db"] = services["db"]
    assert relaunch_stalled(ctx) == []  # just admitted: its launch may still be on its way
    assert relaunch_stalled(ctx, older_than=0) == [job_id]
    assert drain_queue(broker, "pool.local") == [("relax.launch", [job_id])]


def test_a_launch_while_the_embedded_ray_restarts_waits_for_its_new_address(
    api, monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The embedded platform's Ray dies as a job is launched: the launch waits for the supervisor to bring
    it back and submits to the address the supervisor records on the pool (Ray comes back on new ports).
    Before this the job was FAILED as `setup` ("could not submit to Ray at …": a chaos trial). Without a
    supervisor that restarts the pool's Ray (production, an external cluster) it fails at once as before."""
    import json

    from scheduler import tasks
    from scheduler.db.models import Pool
    from scheduler.services.lifecycle import JobLifecycle
    from tests.factories import make_job

    client, settings, broker = api
    db = client.app.state.db
    tried: list[str] = []

    class FlakyRay:
        def __init__(self, address: str) -> None:
            if address != "http://127.0.0.1:2":  # the old head is dead
                tried.append(address)
                raise ConnectionError(f"Failed to connect to Ray at address: {address}.")
            self.address = address

        def submit(self, sub_id: str, entrypoint: str, **_: object) -> bool:
            tried.append(f"{self.address} {sub_id}")
            return True

    def admitted() -> str:
        job_id = make_job(db, artifact_root=settings.artifacts)
        with db.session() as s:
            JobLifecycle(s).transition(job_id, "ADMITTED", expected_from="QUEUED", reason="test")
        return job_id

    def ray_back() -> None:  # what the supervisor does once the new head answers (api/embedded.py)
        with db.session() as s:
            s.get(Pool, "local").ray_address = "http://127.0.0.1:2"

    monkeypatch.setattr(tasks, "launcher_for", lambda address, token=None: FlakyRay(address))
    monkeypatch.setattr(tasks, "LAUNCH_RETRY_SECONDS", 0.05)
    ctx = tasks.WorkerContext(settings=settings, app=broker)
    ctx.__dict__["db"] = db

    job_id = admitted()
    tasks.launch_job(ctx, job_id)  # no supervisor: fails at once, as before
    assert _status(db, job_id)[0] == "FAILED" and tried == ["http://127.0.0.1:9"]

    state = tmp_path / "platform.json"
    state.write_text(
        json.dumps({"pid": 1, "updated_at": time.time(), "parts": {"ray": {"state": "restarting"}}})
    )
    monkeypatch.setenv(health.SUPERVISOR_STATE_ENV, str(state))
    job_id, tried[:] = admitted(), []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:  # the supervisor brings Ray back after the second try
        if len(tried) == 2:
            ray_back()
        real_sleep(seconds)

    monkeypatch.setattr(tasks.time, "sleep", sleep)
    tasks.launch_job(ctx, job_id)
    assert _status(db, job_id)[0] == "STARTING", _status(db, job_id)
    assert tried == ["http://127.0.0.1:9"] * 2 + [f"http://127.0.0.1:2 {job_id}-a1"]
