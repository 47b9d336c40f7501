"""What /readyz judges (scheduler/health.py), on SQLite and PostgreSQL: workers by their heartbeat rows, the
beat by its last tick, and under the embedded platform's supervisor each part by the state it writes — a
part the supervisor reports down is down at once, and a restarted worker or beat only counts once it
heartbeats or ticks again. Without a supervisor a worker or beat that never reported is not judged."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler import health
from scheduler.db.engine import Database
from scheduler.db.models import SchedulerLock, utcnow
from scheduler.settings import CelerySettings, DatabaseSettings, Settings


def _settings(db_url: str, home: Path) -> Settings:
    return Settings(
        home=home,
        database=DatabaseSettings(url=db_url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{home / 'broker.db'}"),
    )


def _state(path: Path, *, updated: float | None = None, **parts: dict) -> Path:
    path.write_text(json.dumps({"pid": 1, "updated_at": updated or time.time(), "parts": parts}))
    return path


def _age(db: Database, name: str, seconds: float) -> None:
    with db.session() as s:
        s.execute(
            sa.update(SchedulerLock)
            .where(SchedulerLock.name == name)
            .values(acquired_at=utcnow() - timedelta(seconds=seconds))
        )


def test_workers_and_beat_by_their_heartbeats(db_url: str, tmp_path: Path) -> None:
    db = Database(db_url)
    settings = _settings(db_url, tmp_path)
    try:
        r = health.readiness(settings, db)
        assert r.ready and r.parts["worker"].ok is None and r.parts["beat"].ok is None  # never seen
        worker = health.worker_row("relax-local@host")
        health.record(db, worker, "relax-local@host pid 1")
        health.record(db, health.TICK, "host pid 1")
        r = health.readiness(settings, db)
        assert r.ready and r.parts["worker"].ok and r.parts["beat"].ok and r.parts["database"].ok

        _age(db, worker, 30)  # the worker died: no heartbeat for 30 s
        _age(db, health.TICK, 30)
        r = health.readiness(settings, db)
        assert r.down == ["worker", "beat"], r.parts
        assert r.parts["worker"].detail.startswith("no worker heartbeat for 30s")
    finally:
        db.dispose()


def test_under_the_supervisor_each_part_is_judged_by_its_state(db_url: str, tmp_path: Path) -> None:
    db = Database(db_url)
    settings = _settings(db_url, tmp_path)
    state = tmp_path / "platform.json"
    try:
        health.record(db, health.worker_row("w"), "w")
        health.record(db, health.TICK, "w")
        past = time.time() - 60
        running = {"state": "running", "since": past}
        assert health.readiness(
            settings,
            db,
            supervisor_state=_state(state, ray=running, worker=running, beat=running, api=running),
        ).ready

        restarting = {"state": "restarting", "since": time.time(), "detail": "was killed by SIGKILL"}
        r = health.readiness(settings, db, supervisor_state=_state(state, worker=restarting, beat=running))
        assert r.down == ["worker"] and "was killed by SIGKILL" in r.parts["worker"].detail

        # up again, but not yet heartbeating: still down
        r = health.readiness(
            settings,
            db,
            supervisor_state=_state(state, worker={"state": "running", "since": time.time() + 1}),
        )
        assert r.down == ["worker"] and "not recorded a heartbeat yet" in r.parts["worker"].detail

        r = health.readiness(settings, db, supervisor_state=_state(state, ray={"state": "restarting"}))
        assert r.down == ["ray"]
        r = health.readiness(settings, db, supervisor_state=_state(state, updated=time.time() - 30))
        assert r.down == ["supervisor"]
    finally:
        db.dispose()


def test_readyz_answers_503_naming_what_is_down(db_url: str, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from api.app import create_app

    settings = _settings(db_url, tmp_path)
    db = Database(db_url)
    state = _state(
        tmp_path / "platform.json", worker={"state": "restarting"}, beat={"state": "running", "since": 0}
    )
    health.record(db, health.TICK, "w")
    monkeypatch.setenv(health.SUPERVISOR_STATE_ENV, str(state))
    try:
        with TestClient(create_app(settings, db=db)) as client:
            r = client.get("/readyz")
            assert r.status_code == 503 and r.json()["down"] == "worker" and r.json()["worker"] == "down"
            assert r.json()["database"] == db.dialect and len(r.content) < 200  # terse: it is public
            _state(state, worker={"state": "running", "since": 0}, beat={"state": "running", "since": 0})
            health.record(db, health.worker_row("w"), "w")
            r = client.get("/readyz")
            assert r.status_code == 200 and r.json()["status"] == "ready", r.json()
    finally:
        db.dispose()
