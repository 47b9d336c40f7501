"""A unit of work whose transaction begins at its first write (scheduler/db/engine.py `defer_begin`), as the
submit route's runs on PostgreSQL: its reads go without a transaction (no BEGIN, no COMMIT: two round trips of a
submission's five), a write after `begin_now` is transactional again, and the connection goes back to the pool as
every other unit of work expects it. The local PostgreSQL; SQLite is left as it is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from scheduler.db.engine import Database, begin_deferred, begin_now, defer_begin
from scheduler.db.models import Job, WebhookDelivery, WebhookEndpoint
from scheduler.services.auth import Principal, team_for
from tests.conftest import migrated_database
from tests.factories import grpo_spec

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Database]:
    """A Database on a schema of its own, with a table `scratch (n int)`."""
    for url in migrated_database("postgresql", tmp_path):
        db = Database(url)
        with db.session() as s:
            s.execute(sa.text("CREATE TABLE scratch (n integer)"))
        yield db
        db.dispose()


def _in_transaction(session: sa.orm.Session) -> bool:
    return session.connection().connection.dbapi_connection.info.transaction_status.name != "IDLE"


def _scratch(db: Database) -> list[int]:
    with db.session(read_only=True) as s:
        return sorted(s.scalars(sa.text("SELECT n FROM scratch")))


def test_reads_go_without_a_transaction_and_writes_after_begin_now_with_one(pg: Database) -> None:
    with pg.new_session() as s:
        assert defer_begin(s) and begin_deferred(s)
        assert s.execute(sa.text("SELECT count(*) FROM scratch")).scalar_one() == 0
        assert not _in_transaction(s)  # no BEGIN was sent
        begin_now(s)
        assert not begin_deferred(s)
        s.execute(sa.text("INSERT INTO scratch VALUES (1)"))
        assert _in_transaction(s)
        s.execute(sa.text("INSERT INTO scratch VALUES (2)"))
        s.rollback()  # both writes undone together
    assert _scratch(pg) == []


def test_a_write_before_begin_now_commits_itself(pg: Database) -> None:
    with pg.new_session() as s:
        assert defer_begin(s)
        s.execute(sa.text("INSERT INTO scratch VALUES (3)"))
        assert not _in_transaction(s)
        s.rollback()  # nothing left to undo: the statement committed on its own
    assert _scratch(pg) == [3]


def test_the_connection_goes_back_to_the_pool_transactional(pg: Database) -> None:
    pg.engine.pool = pg.engine.pool.recreate()  # a pool of its own, empty: one connection below
    with pg.new_session() as s:
        assert defer_begin(s)
        pid = s.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    with pg.new_session() as s:  # the same connection, as any unit of work gets it
        s.execute(sa.text("INSERT INTO scratch VALUES (4)"))
        assert s.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() == pid
        assert _in_transaction(s) and not s.connection().connection.dbapi_connection.autocommit
        s.rollback()
    assert _scratch(pg) == []


def test_a_unit_of_work_that_ran_a_statement_is_not_deferred(pg: Database) -> None:
    with pg.new_session() as s:
        s.execute(sa.text("SELECT 1"))
        assert not defer_begin(s) and not begin_deferred(s)
        s.execute(sa.text("INSERT INTO scratch VALUES (5)"))
        s.rollback()
    assert _scratch(pg) == []


def test_sqlite_is_left_as_it_is(tmp_path: Path) -> None:
    for url in migrated_database("sqlite", tmp_path):
        db = Database(url)
        try:
            with db.new_session() as s:
                assert not defer_begin(s)
                assert not s.in_transaction()  # no connection taken: no BEGIN IMMEDIATE, no write lock
                begin_now(s)  # nothing to do
        finally:
            db.dispose()


def test_a_submission_with_deliveries_writes_them_with_the_job_in_one_transaction(api) -> None:  # type: ignore[no-untyped-def]
    """The submit route defers its BEGIN; where deliveries follow the job's statement (a team endpoint here),
    the job's statement opens the transaction the deliveries commit in. Without any, it commits on its own
    (tests/integration/test_api_cost.py)."""
    client, _, _ = api
    db = client.app.state.db
    if db.dialect != "postgresql":
        pytest.skip("SQLite's units of work are not deferred")
    with db.session() as s:
        team = team_for(s, ADMIN, "default")
        s.add(
            WebhookEndpoint(
                id="we_test", team_id=team.id, url="https://hooks.example.com/x", secret="whsec_x"
            )
        )
    writes: list[tuple[str, bool]] = []

    def after(conn, _cursor, statement, *_):  # type: ignore[no-untyped-def]
        status = conn.connection.dbapi_connection.info.transaction_status
        writes.append((" ".join(statement.split()[:3]), status.name != "IDLE"))

    sa.event.listen(db.engine, "after_cursor_execute", after)
    try:
        r = client.post("/v1/jobs", json={"name": "hooked", "spec": grpo_spec()})
    finally:
        sa.event.remove(db.engine, "after_cursor_execute", after)
    assert r.status_code == 201, r.text
    assert [w for w in writes if not w[0].startswith("SELECT")] == [
        ("WITH new_job AS", True),
        ("INSERT INTO webhook_deliveries", True),
    ]
    reads = [w[1] for w in writes if w[0].startswith("SELECT")]
    assert len(reads) >= 2 and not any(reads)  # the key, the platform's small tables: outside a transaction
    with db.session(read_only=True) as s:
        assert s.get(Job, r.json()["id"]) is not None
        rows = s.scalars(sa.select(WebhookDelivery).where(WebhookDelivery.job_id == r.json()["id"])).all()
        assert [(d.endpoint_id, d.event_type) for d in rows] == [("we_test", "job.queued")]


def test_deferral_ends_with_the_sessions_transaction(pg: Database) -> None:
    """A session used again after its unit of work ended is not deferred: its connection went back to the pool
    (transactional again) and the next transaction begins as any does."""
    with pg.new_session() as s:
        assert defer_begin(s)
        s.execute(sa.text("SELECT 1"))
        s.commit()
        assert not begin_deferred(s)
        s.execute(sa.text("INSERT INTO scratch VALUES (6)"))
        assert _in_transaction(s)
        begin_now(s)  # nothing to do: the deferral ended with the first transaction
        s.rollback()
    assert _scratch(pg) == []
