"""Runs the alembic migrations in migrations/ against a database URL."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

import migrations
from scheduler.db.spec_column import record_defaults

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate to `revision`; at head, also record this platform's job-spec defaults (a new platform version may
    bring new ones without a schema change: scheduler/db/spec_column.py)."""
    command.upgrade(alembic_config(url), revision)
    if revision == "head":
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                record_defaults(conn)
        finally:
            engine.dispose()


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
