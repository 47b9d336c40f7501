"""jobs.rollout_grant, allocations.released_in: rollout engines taken back, held until the driver has stopped them

When the scheduling pass takes rollout engines back from an elastic job (for another job, or because the job's
driver asks for fewer), their GPUs are not free until the driver has stopped those engines between two steps.
Each resize numbers the job's grant anew (`jobs.rollout_grant`, NULL: 0) and keeps a row for each engine it took
back, `released_in` that number; the rows go once the driver reports it has followed that grant or a later one,
and until then no job is placed on their GPUs (docs/reference/elastic-rollout.md). NULL for every other row.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("rollout_grant", sa.Integer(), nullable=True))
    op.add_column("allocations", sa.Column("released_in", sa.Integer(), nullable=True))


def downgrade() -> None:
    # the rows of engines still stopping go first: without the column they would read as held engines
    op.execute("DELETE FROM allocations WHERE released_in IS NOT NULL")
    op.drop_column("allocations", "released_in")
    op.drop_column("jobs", "rollout_grant")
