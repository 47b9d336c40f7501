"""trust between teams: key roles and expiry, team grants, path grants, audit log, token claims

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.tables import JSON, create_team_table

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("created_by", sa.String(length=40), nullable=True))
    with op.batch_alter_table("teams") as batch:
        batch.add_column(sa.Column("allowed_priority_classes", JSON, nullable=True))
        batch.add_column(sa.Column("allowed_queues", JSON, nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("token_claimed_attempt", sa.Integer(), nullable=True))
    create_team_table(
        "path_grants",
        sa.Column("pool", sa.String(length=63), nullable=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("mode", sa.String(length=2), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        foreign_keys=[sa.ForeignKeyConstraint(["pool"], ["pools.name"], ondelete="CASCADE")],
        unique={"uq_path_grants_team_pool_path": ["team_id", "pool", "path"]},
    )
    op.create_index(op.f("ix_path_grants_team_id"), "path_grants", ["team_id"], unique=False)
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("key_id", sa.String(length=40), nullable=True),
        sa.Column("role", sa.String(length=20), nullable=True),
        sa.Column("team_id", sa.String(length=40), nullable=True),
        sa.Column("method", sa.String(length=10), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("details", JSON, nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_events_time", "audit_events", ["time"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_audit_events_time", table_name="audit_events")
    op.drop_table("audit_events")
    op.drop_index(op.f("ix_path_grants_team_id"), table_name="path_grants")
    op.drop_table("path_grants")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("token_claimed_attempt")
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("allowed_queues")
        batch.drop_column("allowed_priority_classes")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("created_by")
        batch.drop_column("expires_at")
