"""Engines and units of work for SQLite (embedded) and PostgreSQL (production)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from scheduler.db import spec_column
from scheduler.db.jsontext import json_dumps, json_loads

READ_ONLY = "relax_read_only"


def make_engine(url: str, *, echo: bool = False) -> sa.Engine:
    """An engine with the per-backend settings the platform relies on."""
    u = sa.make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            url,
            echo=echo,
            json_serializer=json_dumps,
            json_deserializer=json_loads,
            connect_args={"timeout": 30, "check_same_thread": False},
        )
        _configure_sqlite(engine)
        return engine
    _cache_wide_statements()
    # A database that went away (restart, failover, network cut): a pooled connection idle for a while is
    # pinged at checkout and replaced when dead (`_ping_when_idle`), and a connection attempt gives up after
    # 10 s instead of the OS's minutes, so requests meanwhile answer 503 (api/errors.py) and the first ones
    # after its return succeed.
    connect_args = {} if "connect_timeout" in u.query else {"connect_timeout": 10}
    engine = sa.create_engine(
        url,
        echo=echo,
        json_serializer=json_dumps,
        json_deserializer=json_loads,
        pool_size=10,
        max_overflow=20,
        connect_args=connect_args,
    )
    _ping_when_idle(engine)
    _transactional_when_returned(engine)
    return engine


# SQLAlchemy's `pool_pre_ping` costs a round trip (`SELECT 1`) at every checkout: ~0.15 ms of the API's CPU and a
# statement of PostgreSQL's per request (docs/reliability.md). A connection given back less than this long ago
# is taken as it is: under load every connection is that fresh, and a database that died meanwhile fails the
# statements in flight, whose disconnect errors make the pool drop every connection older than the error.
PING_AFTER_IDLE_SECONDS = 1.0


def _ping_when_idle(engine: sa.Engine) -> None:
    """Pre-ping, for connections idle longer than `PING_AFTER_IDLE_SECONDS` only (SQLAlchemy's documented way to
    refuse a connection at checkout: `DisconnectionError`, after which the pool connects anew, up to 3 times)."""

    @sa.event.listens_for(engine, "connect")
    def _fresh(_dbapi_conn, record):  # type: ignore[no-untyped-def]
        record.info["returned_at"] = time.monotonic()

    @sa.event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn, record):  # type: ignore[no-untyped-def]
        if record is not None:
            record.info["returned_at"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn, record, _proxy):  # type: ignore[no-untyped-def]
        returned = record.info.get("returned_at")
        if returned is not None and time.monotonic() - returned < PING_AFTER_IDLE_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as err:
            raise sa.exc.DisconnectionError(f"a pooled connection is dead: {err}") from err


# A unit of work whose transaction begins at its first write (`defer_begin`), on PostgreSQL: until then its
# statements run in the driver's autocommit mode, without the BEGIN that psycopg otherwise sends, and waits for,
# before the first one, and without a COMMIT at the end when nothing was written: two round trips less. Under
# READ COMMITTED (PostgreSQL's default, the platform's) every statement of a transaction reads from a snapshot
# of its own anyway, so reads outside a transaction see what they would have seen inside one; a unit of work
# that writes one statement only (`JobSubmission.submit`: the job, its event and the call's audit row) lets that
# statement commit itself (PostgreSQL runs it in a transaction of its own: all of it or nothing).
_DEFERRED = "relax_deferred_begin"
try:
    from psycopg.pq import TransactionStatus

    _IDLE = TransactionStatus.IDLE
except ImportError:  # no psycopg: `defer_begin` is never used on another driver's connection
    _IDLE = None


def defer_begin(session: Session) -> bool:
    """PostgreSQL (psycopg) under READ COMMITTED: the session's connection (procured now: the pool's checkout,
    a ping after idleness) runs its statements outside a transaction until `begin_now` or the end of the
    session's transaction; call it before the unit of work's first statement. False, and nothing changed,
    elsewhere (SQLite, another isolation level, a unit of work that ran a statement already). The connection
    goes back to the pool transactional again (`_transactional_when_returned`)."""
    dialect = session.get_bind().dialect
    if dialect.driver != "psycopg":
        return False
    dbapi = session.connection().connection.dbapi_connection  # the first connection sets the dialect up
    if getattr(dialect, "default_isolation_level", None) != "READ COMMITTED":
        return False
    if dbapi is None or dbapi.autocommit or dbapi.info.transaction_status != _IDLE:
        return False
    dbapi.autocommit = True
    session.info[_DEFERRED] = (session.get_transaction(), dbapi)
    return True


def begin_deferred(session: Session) -> bool:
    """Whether the session's statements run outside a transaction now (`defer_begin`, no `begin_now` yet, in
    the same transaction of the session)."""
    deferred = session.info.get(_DEFERRED)
    return deferred is not None and deferred[0] is session.get_transaction()


def begin_now(session: Session) -> None:
    """The unit of work's transaction begins with its next statement, as a unit of work's does by default (no
    I/O: psycopg sends the BEGIN with that statement); what was run before stays as it ran. Nothing for a
    session not deferred (`defer_begin`)."""
    deferred = session.info.pop(_DEFERRED, None)
    if deferred is None or deferred[0] is not session.get_transaction():
        return  # not deferred, or deferred in a transaction of the session that ended (its connection is back)
    dbapi = deferred[1]
    if dbapi.autocommit:
        dbapi.autocommit = False  # idle: a statement that committed itself left no transaction open


def _transactional_when_returned(engine: sa.Engine) -> None:
    """A connection given back while its statements committed themselves (`defer_begin`) is made
    transactional again before the pool's rollback-on-return, in the pool's reset (an error there invalidates
    the connection: a new one replaces it)."""

    @sa.event.listens_for(engine, "reset")
    def _reset(dbapi_conn, _record, _state):  # type: ignore[no-untyped-def]
        if dbapi_conn is not None and dbapi_conn.autocommit:
            dbapi_conn.autocommit = False


# psycopg turns a statement's `%(name)s` placeholders into PostgreSQL's `$n` with a regular expression over the
# whole text on every execution, unless the statement is short enough to keep the result in its (LRU, 128
# entries) cache: at most 4,096 bytes and 50 parameters (psycopg 3.1-3.3, `psycopg._queries`). A submission's
# one statement (the job, its event and the audit row: 54 parameters, 2.4 kB) paid ~0.3 ms of CPU for it each
# time. The platform's statements are built once (a bounded set), so wider ones are cached too.
_CACHED_STATEMENT_PARAMS = 128


def _cache_wide_statements() -> None:
    try:
        from psycopg import _queries
    except ImportError:  # no psycopg: nothing to do
        return
    if getattr(_queries, "MAX_CACHED_STATEMENT_PARAMS", _CACHED_STATEMENT_PARAMS) < _CACHED_STATEMENT_PARAMS:
        _queries.MAX_CACHED_STATEMENT_PARAMS = _CACHED_STATEMENT_PARAMS


def _configure_sqlite(engine: sa.Engine) -> None:
    # Several processes (API, worker, beat) write the same file. WAL lets readers run beside the
    # writer, and every transaction begins IMMEDIATE: a deferred one that reads and then writes can
    # fail at once with "database is locked" when another writer committed in between, which the busy
    # timeout does not cover. pysqlite's own transaction handling is switched off so that the
    # BEGIN below is the only one.
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        # Read-only units of work (GET requests, streams) begin deferred: in WAL mode they never
        # block, and they must not hold the write lock while a request runs.
        read_only = conn.get_execution_options().get(READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


class Database:
    """Owns the engine and hands out units of work; the caller of `session()` owns the commit."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = url
        self.engine = make_engine(url, echo=echo)
        spec_column.watch(self.engine)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)
        self._read_factory = sessionmaker(
            self.engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False
        )

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def single_writer(self) -> bool:
        """Whether a write transaction holds the whole database from its start (SQLite: BEGIN IMMEDIATE takes
        the one write lock), so that slow reads go in a read-only unit of work before it. PostgreSQL locks
        only the rows a transaction writes, when it writes them."""
        return self.dialect == "sqlite"

    def new_session(self, *, read_only: bool = False) -> Session:
        """A unit of work for the caller to commit or roll back, and close (`session` does it for a block).
        Making one does no I/O: its transaction begins with its first statement."""
        return (self._read_factory if read_only else self._factory)()

    @contextmanager
    def session(self, *, read_only: bool = False) -> Iterator[Session]:
        """One transaction: commits when the block succeeds, rolls back when it raises.

        `read_only` units of work must not write (on SQLite they do not take the write lock)."""
        with self.new_session(read_only=read_only) as s:
            try:
                yield s
                s.commit()
            except BaseException:
                s.rollback()
                raise

    def dispose(self) -> None:
        self.engine.dispose()
