"""jobs.rollout_wish, jobs.rollout_wish_reason: the rollout engines an elastic job's driver asks for

An elastic job's driver (`--autoscaler-config`) reports the engines its autoscaler YAML's thresholds ask for
(the report's `rollout_wish`); the platform keeps the latest for the job's run, with why ("rollout 0.12 of the
step < scale_in 0.2"), and the scheduling pass grows the job's rollout up to it and gives engines above it back
(docs/reference/elastic-rollout.md). NULL until the driver has asked (and again at each admission).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("rollout_wish", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("rollout_wish_reason", sa.String(length=200), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN on both (SQLite >= 3.35): no rebuild of `jobs`, which with foreign keys enforced
    # would first delete every row that references it (0006 says more)
    op.drop_column("jobs", "rollout_wish_reason")
    op.drop_column("jobs", "rollout_wish")
