"""The engine's pool pings a connection at checkout only when it has been idle (scheduler/db/engine.py
`_ping_when_idle`): a connection whose server process died while it sat idle is replaced without the caller
noticing; one that died while in use fails its next statement, after which the pool connects anew. The local
PostgreSQL, a server process ended with `pg_terminate_backend` (what a restart or a failover does to it)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from scheduler.db import engine as engine_module
from scheduler.db.engine import make_engine
from tests.conftest import PG_URL


def _backend_pid(conn: sa.Connection) -> int:
    return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()


def _terminate(pid: int) -> None:
    killer = sa.create_engine(PG_URL)
    try:
        with killer.connect() as conn:
            assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
    finally:
        killer.dispose()


@pytest.fixture
def engine():  # type: ignore[no-untyped-def]
    e = make_engine(PG_URL)
    e.pool = e.pool.recreate()  # one pool of its own
    yield e
    e.dispose()


def test_an_idle_connection_that_died_is_replaced_at_checkout(engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        pid = _backend_pid(conn)
    _terminate(pid)
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_SECONDS", 0.0)  # every connection counts as idle
    pings: list[object] = []
    ping = engine.dialect.do_ping
    monkeypatch.setattr(engine.dialect, "do_ping", lambda c: pings.append(c) or ping(c))
    with engine.connect() as conn:  # pinged, found dead, replaced: the caller sees nothing
        assert _backend_pid(conn) != pid
    assert pings  # the idle connection was pinged (and the new one too: with 0 s every connection is idle)


def test_a_busy_connection_is_not_pinged_and_a_dead_one_fails_once(engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_SECONDS", 3600.0)  # every connection counts as busy
    pings: list[object] = []
    ping = engine.dialect.do_ping
    monkeypatch.setattr(engine.dialect, "do_ping", lambda c: pings.append(c) or ping(c))
    with engine.connect() as conn:
        pid = _backend_pid(conn)
    with engine.connect() as conn:
        assert _backend_pid(conn) == pid
    assert pings == []  # no `SELECT 1` before either
    _terminate(pid)
    with pytest.raises(sa.exc.OperationalError) as err, engine.connect() as conn:
        _backend_pid(conn)
    assert err.value.connection_invalidated
    with engine.connect() as conn:  # the pool connected anew
        assert _backend_pid(conn) != pid
