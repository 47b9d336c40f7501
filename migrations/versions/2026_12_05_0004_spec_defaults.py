"""job specs stored as what differs from their defaults, the defaults kept once in spec_defaults

A normalized spec names every parameter (~1,060, ~33 kB of JSON); building that JSONB cost PostgreSQL ~1.2 ms of
CPU per submission. New rows hold `{"$defaults": <id>, <the job's own values>}` (scheduler/db/spec_column.py);
the defaults, content-addressed, are kept in `spec_defaults`, one row per set ever used. Rows written before keep
their whole spec and are read as they are: nothing is rewritten.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from scheduler.db.spec_column import record_defaults

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "spec_defaults",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("spec_values", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    record_defaults(op.get_bind())


def downgrade() -> None:
    # specs written since must be whole again before the defaults go
    from scheduler.db.jsontext import json_dumps, json_loads
    from scheduler.db.spec_column import DEFAULTS_KEY, expand_with

    bind = op.get_bind()
    known = {
        row.id: row.spec_values for row in bind.execute(sa.text("SELECT id, spec_values FROM spec_defaults"))
    }
    cast = "CAST(:spec AS JSONB)" if bind.dialect.name == "postgresql" else ":spec"
    for job_id, text in bind.execute(sa.text("SELECT id, CAST(spec AS TEXT) FROM jobs")):
        spec = json_loads(text) if text else None
        if isinstance(spec, dict) and DEFAULTS_KEY in spec:
            whole = json_dumps(expand_with(spec, known))
            bind.execute(
                sa.text(f"UPDATE jobs SET spec = {cast} WHERE id = :id"), {"spec": whole, "id": job_id}
            )
    op.drop_table("spec_defaults")
