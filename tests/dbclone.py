"""Databases migrated to head for the tests, at the cost of a copy: the migrations run once per process.

`upgrade()` (alembic plus the spec defaults' row) costs ~0.2-0.45 s on SQLite and ~0.5-1.1 s on PostgreSQL
(2 cores under load); ~360 tests each need a fresh database. So each pytest process (each xdist worker) runs the
real `upgrade()` once per kind, and then

- SQLite: into a template file, which each test copies (the very file the migrations produced; ~0.5 ms);
- PostgreSQL: into a scratch schema, recording every statement it sent (SQLAlchemy's `before_cursor_execute`,
  parameters as the driver got them); each test's schema is made by sending those statements again, in order, in
  one transaction, with the new schema as the search path (~0.25-0.45 s: PostgreSQL's own work of creating the
  tables, which was most of the cost, stays; alembic's and the engines' set-up go).

Each test still gets a database of its own, dropped after it (tests/conftest.py). tests/integration/test_db_clone.py
shows a clone the same as a fresh `upgrade()` (tables, columns, types, defaults, constraints, indexes, sequences,
PostgreSQL's column compression, rows, alembic_version); tests/integration/test_migrations.py runs the migrations
themselves for every test.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

_lock = threading.Lock()
_sqlite_template: Path | None = None
_postgres_statements: tuple[_Statement, ...] | None = None
_admin: dict[str, sa.Engine] = {}  # PG_URL -> one pooled engine per process for CREATE/DROP SCHEMA


@dataclass(frozen=True)
class _Statement:
    sql: str
    parameters: Any
    many: bool


def schema_url(pg_url: str, schema: str) -> str:
    """`pg_url` with `schema` as the only schema of its search path."""
    sep = "&" if "?" in pg_url else "?"
    return f"{pg_url}{sep}options=-csearch_path%3D{schema}"


def new_schema_name() -> str:
    return f"relax_test_{os.getpid()}_{secrets.token_hex(3)}"


def admin_engine(pg_url: str) -> sa.Engine:
    with _lock:
        engine = _admin.get(pg_url)
        if engine is None:
            # pinged at checkout (a SELECT 1): a connection that a test's server restart or
            # pg_terminate_backend ended is replaced instead of failing the next test's set-up
            engine = _admin[pg_url] = sa.create_engine(
                pg_url, pool_size=1, max_overflow=4, pool_pre_ping=True
            )
        return engine


def _tmpdir() -> Path:
    path, owner = tempfile.mkdtemp(prefix="relax-test-db-"), os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, ignore_errors=True))
    return Path(path)


def sqlite_template() -> Path:
    """This process's SQLite file migrated to head by `upgrade()`."""
    global _sqlite_template
    with _lock:
        if _sqlite_template is None:
            from scheduler.db.migrate import upgrade

            path = _tmpdir() / "template.db"
            upgrade(f"sqlite:///{path}")
            # every connection closed: WAL's content is in the file (a copy of the file alone is the database)
            leftovers = [p.name for p in path.parent.iterdir() if p != path]
            assert not leftovers, leftovers
            _sqlite_template = path
        return _sqlite_template


def migrated_sqlite(path: Path) -> str:
    """A SQLite database at `path`, migrated to head (a copy of the template); its URL."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sqlite_template(), path)
    return f"sqlite:///{path}"


def postgres_statements(pg_url: str) -> tuple[_Statement, ...]:
    """The statements `upgrade()` sends to an empty schema of the PostgreSQL at `pg_url`, recorded once."""
    global _postgres_statements
    with _lock:
        if _postgres_statements is not None:
            return _postgres_statements
        from scheduler.db.migrate import upgrade

        schema = f"relax_template_{os.getpid()}_{secrets.token_hex(3)}"
        url = schema_url(pg_url, schema)
        options = sa.make_url(url).query["options"]
        recorded: list[_Statement] = []

        def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            # only this upgrade's engines (their URL names the scratch schema): not a thread of another test's
            if conn.engine.url.query.get("options") == options:
                recorded.append(_Statement(statement, parameters, executemany))

        admin = sa.create_engine(pg_url)
        try:
            with admin.begin() as conn:
                conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
            sa.event.listen(sa.Engine, "before_cursor_execute", record)
            try:
                upgrade(url)
            finally:
                sa.event.remove(sa.Engine, "before_cursor_execute", record)
        finally:
            with admin.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            admin.dispose()
        # unqualified names only: sent again with another search path, they make the same objects there
        assert recorded and not [s.sql for s in recorded if schema in s.sql or schema in repr(s.parameters)]
        _postgres_statements = tuple(recorded)
        return _postgres_statements


def create_migrated_schema(pg_url: str, schema: str) -> str:
    """Create `schema` in the PostgreSQL at `pg_url` and replay `upgrade()`'s statements in it, in one
    transaction; the URL of a database whose search path is that schema."""
    statements = postgres_statements(pg_url)
    raw = admin_engine(pg_url).raw_connection()
    try:
        cur = raw.cursor()
        try:
            cur.execute(f'CREATE SCHEMA "{schema}"')
            cur.execute(f'SET LOCAL search_path TO "{schema}"')
            for s in statements:
                if s.many:
                    cur.executemany(s.sql, s.parameters)
                else:
                    cur.execute(s.sql, s.parameters or None)
        finally:
            cur.close()
        raw.commit()
    except BaseException:
        raw.rollback()
        raise
    finally:
        raw.close()
    return schema_url(pg_url, schema)


def drop_schema(pg_url: str, schema: str) -> None:
    with admin_engine(pg_url).begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
