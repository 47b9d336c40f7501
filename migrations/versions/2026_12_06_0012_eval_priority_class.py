"""eval priority class: the built-in class of eval jobs

Seeds `eval` (value 50: above `normal` (0) and `low` (-100), below the admin-granted `high` (100); preemptible)
beside the classes the initial schema seeded. Only jobs that `POST /v1/evals` submits may use it; within the
team's quota it ranks above the team's training jobs, beyond it at the team's highest training class
(docs/adr/0011-eval-priority-class.md). A class an admin created under that name before takes these values.

Downgrade moves jobs of the class to `normal` (their stored priority value is kept) and removes it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from migrations.tables import PRIORITY_CLASSES

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_CREATED = datetime(2026, 12, 6, tzinfo=UTC)
_JOBS = sa.table("jobs", sa.column("priority_class", sa.String))
_EVAL = {
    "value": 50,
    "preemptible": True,
    "description": "Eval jobs only (POST /v1/evals): before the team's training jobs, within the team's quota.",
}


def upgrade() -> None:
    conn = op.get_bind()
    is_eval = PRIORITY_CLASSES.c.name == "eval"
    exists = conn.scalar(sa.select(sa.func.count()).select_from(PRIORITY_CLASSES).where(is_eval))
    if exists:
        op.execute(PRIORITY_CLASSES.update().where(is_eval).values(**_EVAL))
    else:
        op.bulk_insert(PRIORITY_CLASSES, [{"name": "eval", "created_at": _CREATED, **_EVAL}])


def downgrade() -> None:
    op.execute(_JOBS.update().where(_JOBS.c.priority_class == "eval").values(priority_class="normal"))
    op.execute(PRIORITY_CLASSES.delete().where(PRIORITY_CLASSES.c.name == "eval"))
