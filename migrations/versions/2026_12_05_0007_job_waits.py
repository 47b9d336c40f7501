"""queued jobs' wait reasons, positions and nominations in a table of their own

Each scheduling pass rewrites the wait reason and queue position of most queued jobs (an admission moves every
job behind it up one place; the reason names the jobs ahead). In `jobs` each of those updates rewrote the whole
wide row and its index entries: over 2,000 queued jobs ~100 ms of CPU a pass between the scheduler and
PostgreSQL. `job_waits` holds just those three values, one narrow row a queued job, with room left in each page
(fill factor 70) for PostgreSQL to update them in place. The job's attributes of the same names read it
(scheduler/db/models.py). Existing values move over; downgrade moves them back.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.tables import JSON

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

COLUMNS = ("queue_position", "wait_reason", "nominated_nodes")


def upgrade() -> None:
    op.create_table(
        "job_waits",
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("queue_position", sa.Integer(), nullable=True),
        sa.Column("wait_reason", sa.Text(), nullable=True),
        sa.Column("nominated_nodes", JSON, nullable=True),
        postgresql_with={"fillfactor": 70},
    )
    op.execute(
        "INSERT INTO job_waits (job_id, queue_position, wait_reason, nominated_nodes) "
        "SELECT id, queue_position, wait_reason, nominated_nodes FROM jobs "
        "WHERE queue_position IS NOT NULL OR wait_reason IS NOT NULL OR nominated_nodes IS NOT NULL"
    )
    for column in COLUMNS:  # SQLite (3.35+) drops a plain column in place: no rebuild of `jobs`
        op.drop_column("jobs", column)


def downgrade() -> None:
    op.add_column("jobs", sa.Column("queue_position", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("wait_reason", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("nominated_nodes", JSON, nullable=True))
    for column in COLUMNS:
        op.execute(
            f"UPDATE jobs SET {column} = (SELECT w.{column} FROM job_waits w WHERE w.job_id = jobs.id)"
        )
    op.drop_table("job_waits")
