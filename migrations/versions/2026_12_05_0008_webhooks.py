"""webhooks: a team's endpoints and the log of deliveries

`webhook_endpoints` holds the URLs a team registered, the event types each wants and the secret that signs its
messages (Standard Webhooks). `webhook_deliveries` holds every message to one URL (an endpoint's, or one of a
job's --notify-urls): its payload, its attempts, when the next one is due and how it ended. The scheduler's
beat sends again what is due (docs/reference/webhooks.md).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.tables import JSON, create_team_table

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_team_table(
        "webhook_endpoints",
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=True),
        sa.Column("event_types", JSON, nullable=True),
        sa.Column("secret", sa.String(length=100), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(op.f("ix_webhook_endpoints_team_id"), "webhook_endpoints", ["team_id"], unique=False)
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("endpoint_id", sa.String(length=40), nullable=True),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("event_type", sa.String(length=40), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("state", sa.String(length=10), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["endpoint_id"], ["webhook_endpoints.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_webhook_deliveries_endpoint_id", "webhook_deliveries", ["endpoint_id", "id"], unique=False
    )
    op.create_index(
        "ix_webhook_deliveries_state_next", "webhook_deliveries", ["state", "next_attempt_at"], unique=False
    )
    op.create_index(op.f("ix_webhook_deliveries_job_id"), "webhook_deliveries", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_table("webhook_deliveries")  # its indexes go with it
    op.drop_table("webhook_endpoints")
