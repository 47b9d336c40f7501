"""metrics indexed by (job, id): the live stream reads a job's points by cursor

`GET /v1/jobs/{id}/stream` reads each kind of a job's rows as `WHERE job_id = ? AND id > ? ORDER BY id LIMIT n`
(scheduler/services/stream.py). The metrics table's only index was (job_id, name, step), so each read scanned the
job's index entries and sorted them; with this one it is a range scan.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_metrics_job_id_id", "metrics", ["job_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_metrics_job_id_id", table_name="metrics")
