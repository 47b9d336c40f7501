"""evals: CI evals of a model and their verdicts

`evals` holds each eval a team ran (`POST /v1/evals`): the model (a job's export or checkpoint, or a path), the
eval sets, the thresholds on their metrics with each one's verdict, the metrics read, the eval-only job that ran
it and its outcome (running, passed, failed, error) (docs/reference/evals.md).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.tables import JSON, create_team_table

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_team_table(
        "evals",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("model", JSON, nullable=False),
        sa.Column("model_key", sa.String(length=300), nullable=False),
        sa.Column("datasets", JSON, nullable=False),
        sa.Column("thresholds", JSON, nullable=False),
        sa.Column("expected_metrics", JSON, nullable=False),
        sa.Column("metric_values", JSON, nullable=True),
        sa.Column("outcome", sa.String(length=10), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        foreign_keys=[sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE")],
    )
    op.create_index(op.f("ix_evals_job_id"), "evals", ["job_id"], unique=False)
    op.create_index("ix_evals_team_id_id", "evals", ["team_id", "id"], unique=False)
    op.create_index("ix_evals_team_model", "evals", ["team_id", "model_key", "id"], unique=False)


def downgrade() -> None:
    op.drop_table("evals")  # its indexes go with it
