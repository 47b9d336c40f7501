"""Migrations on SQLite and PostgreSQL: up from empty, no drift from the models, down and up again."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from scheduler.db.migrate import alembic_config, downgrade, upgrade
from scheduler.db.models import Base, Job, JobEvent
from scheduler.domain.jobs import JobStatus
from scheduler.services.lifecycle import JobLifecycle
from tests.conftest import migrated_database
from tests.integration.test_api import TINY_ARGS


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """Here (and under `api`) each test's database is migrated by `upgrade()` itself, not copied from one that
    was (tests/dbclone.py)."""
    yield from migrated_database(request.param, tmp_path, fresh=True)


def _diff(url: str) -> list:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


def test_head_matches_the_models(db_url: str) -> None:
    assert _diff(db_url) == []


def test_down_and_up_again(db_url: str) -> None:
    downgrade(db_url, "base")
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        assert "jobs" not in sa.inspect(conn).get_table_names()
    engine.dispose()
    upgrade(db_url)
    assert _diff(db_url) == []
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT name FROM scheduler_locks")).scalars().all() == ["pass"]
    engine.dispose()


def test_alembic_check_passes(db_url: str) -> None:
    command.check(alembic_config(db_url))


def _statuses(url: str) -> tuple[list, list]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            jobs = conn.execute(sa.text("SELECT id, status FROM jobs ORDER BY id")).all()
            events = conn.execute(
                sa.text("SELECT job_id, from_status, to_status FROM job_events ORDER BY id")
            ).all()
            return [tuple(r) for r in jobs], [tuple(r) for r in events]
    finally:
        engine.dispose()


def _write_status(url: str, value: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET status = :s"), {"s": value})
    finally:
        engine.dispose()


def test_status_columns_hold_job_statuses_and_keep_their_rows_down_and_up(api) -> None:  # type: ignore[no-untyped-def]
    """0006 holds jobs.status and job_events' statuses to JobStatus's values with CHECK constraints: the rows a
    platform holds (a job and its transition events; the events reference the job, and SQLite's rebuild of
    `jobs` must not cascade to them) are the same after its downgrade and its upgrade, the ORM reads the
    members back, and only at 0006 does the database itself refuse any other value."""
    client, settings, _ = api
    url, db = settings.database.url, client.app.state.db
    job_id = client.post("/v1/jobs", json={"args": list(TINY_ARGS)}).json()["id"]
    with db.session() as s:
        assert JobLifecycle(s).transition(
            job_id, JobStatus.ADMITTED, expected_from=JobStatus.QUEUED, reason="test"
        )
    db.dispose()
    before = _statuses(url)
    assert before == (
        [(job_id, "ADMITTED")],
        [(job_id, None, "QUEUED"), (job_id, "QUEUED", "ADMITTED")],
    )
    with pytest.raises(sa.exc.IntegrityError, match="ck_jobs_status|CHECK constraint"):
        _write_status(url, "LOST")

    downgrade(url, "0005")
    assert _statuses(url) == before
    _write_status(url, "LOST")  # a plain string column again: the upgrade refuses it and changes nothing
    with pytest.raises(sa.exc.IntegrityError, match="ck_jobs_status|CHECK constraint"):
        upgrade(url)
    assert _statuses(url) == ([(job_id, "LOST")], before[1])
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == ["0005"]
        assert not [t for t in sa.inspect(conn).get_table_names() if t.startswith("_alembic")]
    engine.dispose()
    _write_status(url, "ADMITTED")

    upgrade(url)
    assert _statuses(url) == before
    assert _diff(url) == []
    with db.session(read_only=True) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status is JobStatus.ADMITTED
        events = s.scalars(sa.select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)).all()
        assert [(e.from_status, e.to_status) for e in events] == [
            (None, JobStatus.QUEUED),
            (JobStatus.QUEUED, JobStatus.ADMITTED),
        ]
    with pytest.raises(sa.exc.IntegrityError, match="ck_jobs_status|CHECK constraint"):
        _write_status(url, "LOST")
    assert _statuses(url) == before


def test_the_status_checks_list_the_members_of_job_status(db_url: str) -> None:
    """Autogenerate compares no CHECK constraints: this does. A member added to JobStatus without a migration
    that widens the checks fails here (the database would refuse the new status)."""
    declared = {
        (table.name, c.name)
        for table in Base.metadata.tables.values()
        for c in table.constraints
        if isinstance(c, sa.CheckConstraint)
    }
    assert declared == {
        ("jobs", "ck_jobs_status"),
        ("job_events", "ck_job_events_from_status"),
        ("job_events", "ck_job_events_to_status"),
    }
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            found = {
                (table, c["name"]): re.findall(r"'([A-Z_]+)'", c["sqltext"])
                for table in ("jobs", "job_events")
                for c in inspector.get_check_constraints(table)
            }
    finally:
        engine.dispose()
    assert set(found) == declared
    for values in found.values():
        assert sorted(values) == sorted(s.value for s in JobStatus)


def test_0012_seeds_the_eval_class_and_down_moves_its_jobs_to_normal(db_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """0012 seeds the built-in `eval` priority class (docs/adr/0011); down, the jobs of that class move to
    `normal` (keeping their stored value) and the class goes; an admin's class of that name takes its values."""
    from scheduler.db.engine import Database
    from tests.factories import bootstrap, make_job

    def classes() -> dict:
        engine = sa.create_engine(db_url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(sa.text("SELECT name, value, preemptible FROM priority_classes")).all()
                return {r[0]: (r[1], bool(r[2])) for r in rows}
        finally:
            engine.dispose()

    assert classes()["eval"] == (50, True)
    assert classes()["eval"][0] > max(classes()[c][0] for c in ("low", "normal"))
    db = Database(db_url)
    try:
        bootstrap(db, tmp_path)
        job = make_job(db, priority_class="eval", artifact_root=tmp_path)
    finally:
        db.dispose()
    downgrade(db_url, "0011")
    assert "eval" not in classes()
    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            row = conn.execute(
                sa.text("SELECT priority_class, priority FROM jobs WHERE id = :j"), {"j": job}
            ).one()
            assert tuple(row) == ("normal", 50)
            conn.execute(
                sa.text(
                    "INSERT INTO priority_classes (name, value, preemptible, created_at) "
                    "VALUES ('eval', 7, false, CURRENT_TIMESTAMP)"
                )
            )
    finally:
        engine.dispose()
    upgrade(db_url)
    assert classes()["eval"] == (50, True)
    assert _diff(db_url) == []
