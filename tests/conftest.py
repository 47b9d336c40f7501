"""Shared fixtures: real databases (SQLite and the local PostgreSQL), settings in a temp home."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

PG_URL = os.environ.get("RELAX_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("RELAX_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

# Ray must not turn on token auth or phone home from tests.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _postgres_schema_url() -> tuple[str, str]:
    schema = f"relax_test_{os.getpid()}_{secrets.token_hex(3)}"
    engine = sa.create_engine(PG_URL)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    except sa.exc.OperationalError as err:
        pytest.fail(f"the local PostgreSQL at {PG_URL} is not reachable ({err.orig}); tests need it")
    finally:
        engine.dispose()
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}", schema


def _drop_schema(schema: str) -> None:
    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each kind, migrated to head."""
    from scheduler.db.migrate import upgrade

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'relax.db'}"
        upgrade(url)
        yield url
        return
    url, schema = _postgres_schema_url()
    try:
        upgrade(url)
        yield url
    finally:
        _drop_schema(schema)


@pytest.fixture
def relax_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("RELAX_HOME", str(home))
    return home
