"""What several migrations' tables are made of, written once: the JSON type, the priority classes' columns, and the
keys of a job's rows and of a team's rows.

A migration must create the same schema whenever it runs, so nothing here changes once a released migration uses
it: a table of another shape gets a new function. Like the migrations, this imports no model code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
"""JSON, stored as JSONB on PostgreSQL."""

PRIORITY_CLASSES = sa.table(
    "priority_classes",
    sa.column("name", sa.String),
    sa.column("value", sa.Integer),
    sa.column("preemptible", sa.Boolean),
    sa.column("description", sa.Text),
    sa.column("created_at", sa.DateTime(timezone=True)),
)
"""`priority_classes` as 0001 made it, for the rows migrations write."""


def create_job_table(
    name: str, *columns: sa.Column, indexes: Mapping[str, Sequence[str]] | None = None
) -> None:
    """A table of a job's rows: a big-integer `id`, `job_id` (its rows go with the job), then `columns`. Indexed on
    `job_id` alone (`ix_<name>_job_id`) unless `indexes` (index name -> its columns) says otherwise."""
    op.create_table(
        name,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        *columns,
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    for index, indexed in (indexes or {op.f(f"ix_{name}_job_id"): ["job_id"]}).items():
        op.create_index(index, name, list(indexed), unique=False)


def create_team_table(
    name: str,
    *columns: sa.Column,
    foreign_keys: Sequence[sa.ForeignKeyConstraint] = (),
    unique: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """A table of a team's rows: a string `id`, `team_id` (its rows go with the team), then `columns`, then
    `created_by` (the API key that made the row). `foreign_keys` come before the team's; `unique` (constraint name -> its columns) after the key."""
    op.create_table(
        name,
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        *columns,
        sa.Column("created_by", sa.String(length=40), nullable=True),
        *foreign_keys,
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        *(sa.UniqueConstraint(*names, name=constraint) for constraint, names in (unique or {}).items()),
    )
