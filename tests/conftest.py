"""Shared fixtures: real databases (SQLite and the local PostgreSQL), settings in a temp home."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

PG_URL = os.environ.get("RELAX_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("RELAX_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

# Every Ray a test starts (`ray.init(address="local")`, drivers run standalone) binds 127.0.0.1 only (Ray's
# single-machine mode) and runs with token auth, as the embedded platform's does (api/embedded.py), with a
# token of this session: never ~/.ray/auth_token, never one in the environment. Nor does it phone home.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
if "RAY_AUTH_MODE" not in os.environ:
    _ray_token_dir, _owner = tempfile.mkdtemp(prefix="relax-test-ray-"), os.getpid()  # 0700
    atexit.register(lambda: os.getpid() == _owner and shutil.rmtree(_ray_token_dir, ignore_errors=True))
    _fd = os.open(os.path.join(_ray_token_dir, "auth_token"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(_fd, "w") as _fh:
        _fh.write(secrets.token_hex(32))
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = os.path.join(_ray_token_dir, "auth_token")
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
