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


def main() -> None:
    """`python -m scheduler.db.migrate`: upgrade the configured database (RELAX_DATABASE_URL) to
    head, then make sure the default team (and, when RELAX_BOOTSTRAP_ADMIN_KEY is set, that admin
    key) exist. Safe to run on every start of every replica."""
    import os

    from scheduler.db.engine import Database
    from scheduler.services.auth import ensure_api_key
    from scheduler.services.platform import ensure_team
    from scheduler.settings import get_settings

    url = get_settings().database_url
    upgrade(url)
    db = Database(url)
    try:
        with db.session() as s:
            ensure_team(s, "default")
            raw = os.environ.get("RELAX_BOOTSTRAP_ADMIN_KEY")
            if raw:
                ensure_api_key(s, raw, name="bootstrap-admin", role="admin", team_id=None)
    finally:
        db.dispose()
    print(f"database at head: {url.split('@')[-1]}")


if __name__ == "__main__":
    main()
