"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from migrations.tables import JSON, PRIORITY_CLASSES, create_job_table

revision = "0001"
_CREATED = datetime(2026, 11, 29, tzinfo=UTC)
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "pools",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("accelerator", sa.String(length=40), nullable=False),
        sa.Column("ray_address", sa.String(length=255), nullable=True),
        sa.Column("python", sa.String(length=255), nullable=True),
        sa.Column("cordoned", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "scheduler_locks",
        sa.Column("name", sa.String(length=40), nullable=False),
        sa.Column("holder", sa.String(length=100), nullable=True),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "priority_classes",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "teams",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=True),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["team_id"],
            ["teams.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash"),
    )
    op.create_table(
        "nodes",
        sa.Column("pool", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("cordoned", sa.Boolean(), nullable=False),
        sa.Column("alive", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["pool"],
            ["pools.name"],
        ),
        sa.PrimaryKeyConstraint("pool", "name"),
    )
    op.create_table(
        "queues",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("pool", sa.String(length=63), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("nominal_gpus", sa.Integer(), nullable=False),
        sa.Column("borrowing_limit", sa.Integer(), nullable=True),
        sa.Column("lending_limit", sa.Integer(), nullable=True),
        sa.Column("weight", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["pool"],
            ["pools.name"],
        ),
        sa.ForeignKeyConstraint(
            ["team_id"],
            ["teams.id"],
        ),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("queue", sa.String(length=63), nullable=False),
        sa.Column("pool", sa.String(length=63), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("status_changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("failure_reason", sa.String(length=20), nullable=True),
        sa.Column("priority_class", sa.String(length=63), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("queue_position", sa.Integer(), nullable=True),
        sa.Column("wait_reason", sa.Text(), nullable=True),
        sa.Column("nominated_nodes", JSON, nullable=True),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("submitted", JSON, nullable=False),
        sa.Column("demand", JSON, nullable=False),
        sa.Column("total_gpus", sa.Integer(), nullable=False),
        sa.Column("output_dir", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("service_gpu_s", sa.Float(precision=53), nullable=False),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ray_submission_id", sa.String(length=100), nullable=True),
        sa.Column("report_seq", sa.Integer(), nullable=False),
        sa.Column("progress_step", sa.Integer(), nullable=True),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("admitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("launched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_report_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["pool"],
            ["pools.name"],
        ),
        sa.ForeignKeyConstraint(
            ["queue"],
            ["queues.name"],
        ),
        sa.ForeignKeyConstraint(
            ["team_id"],
            ["teams.id"],
        ),
        sa.ForeignKeyConstraint(["priority_class"], ["priority_classes.name"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("team_id", "idempotency_key", name="uq_jobs_team_idempotency_key"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_status_pool", ["status", "pool"], unique=False)
        batch_op.create_index("ix_jobs_team_name", ["team_id", "name"], unique=False)

    create_job_table(
        "allocations",
        sa.Column("pool", sa.String(length=63), nullable=False),
        sa.Column("node", sa.String(length=100), nullable=False),
        sa.Column("role", sa.String(length=40), nullable=False),
        sa.Column("replica", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("shared", sa.Boolean(), nullable=False),
        indexes={op.f("ix_allocations_job_id"): ["job_id"], "ix_allocations_pool_node": ["pool", "node"]},
    )
    create_job_table(
        "checkpoints",
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("format", sa.String(length=20), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
    )
    create_job_table(
        "job_events",
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("from_status", sa.String(length=20), nullable=True),
        sa.Column("to_status", sa.String(length=20), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
    )
    create_job_table(
        "log_lines",
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("level", sa.String(length=10), nullable=False),
        sa.Column("source", sa.String(length=40), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
    )
    create_job_table(
        "metrics",
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("value", sa.Float(precision=53), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        indexes={"ix_metrics_job_name_step": ["job_id", "name", "step"]},
    )
    create_job_table(
        "rollouts",
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("split", sa.String(length=10), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
    )
    create_job_table(
        "predictions",
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
    )

    # Every job has a priority class; these three exist from the start (admins add more).
    op.bulk_insert(
        PRIORITY_CLASSES,
        [
            {
                "name": "low",
                "value": -100,
                "preemptible": True,
                "created_at": _CREATED,
                "description": "Best effort: runs on idle capacity, preempted first.",
            },
            {
                "name": "normal",
                "value": 0,
                "preemptible": True,
                "created_at": _CREATED,
                "description": "The default.",
            },
            {
                "name": "high",
                "value": 100,
                "preemptible": False,
                "created_at": _CREATED,
                "description": "Runs before normal jobs of its queue and is never preempted.",
            },
        ],
    )
    # The scheduling pass serialises on this row (see scheduler/scheduling.py).
    op.bulk_insert(
        sa.table("scheduler_locks", sa.column("name", sa.String)),
        [{"name": "pass"}],
    )


def downgrade() -> None:
    # the job's rows' tables first, the tables they reference after; indexes go with their tables
    for table in (
        "predictions",
        "rollouts",
        "metrics",
        "log_lines",
        "job_events",
        "checkpoints",
        "allocations",
        "jobs",
        "queues",
        "nodes",
        "api_keys",
        "teams",
        "priority_classes",
        "scheduler_locks",
        "pools",
    ):
        op.drop_table(table)
