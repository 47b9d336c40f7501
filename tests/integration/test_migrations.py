"""Migrations on SQLite and PostgreSQL: up from empty, no drift from the models, down and up again."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from scheduler.db.migrate import alembic_config, downgrade, upgrade
from scheduler.db.models import Base


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
