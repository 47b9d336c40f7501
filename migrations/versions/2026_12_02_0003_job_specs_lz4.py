"""job specs compressed with lz4 on PostgreSQL

A job's spec is its whole normalized Relax configuration, ~33 kB of JSON, stored compressed (TOAST). PostgreSQL's
default compression, pglz, cost 1.3 ms of the server's CPU per submission; lz4 0.6 ms, for 1.3x the size
(bench/api_load.py, docs/reliability.md "Load"). Values written before keep their compression.
PostgreSQL 14 or later, built with lz4; elsewhere (older servers, SQLite) nothing changes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_COLUMNS = ("spec", "submitted")


def _lz4_available() -> bool:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql" or (bind.dialect.server_version_info or (0,)) < (14,):
        return False
    query = "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
    return bool(bind.execute(sa.text(query)).scalar())


def upgrade() -> None:
    if _lz4_available():
        for column in _COLUMNS:
            op.execute(f"ALTER TABLE jobs ALTER COLUMN {column} SET COMPRESSION lz4")


def downgrade() -> None:
    if _lz4_available():
        for column in _COLUMNS:
            op.execute(f"ALTER TABLE jobs ALTER COLUMN {column} SET COMPRESSION default")
