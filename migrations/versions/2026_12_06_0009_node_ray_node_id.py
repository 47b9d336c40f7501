"""nodes.ray_node_id: the Ray node a pool's node is

A pool is a Ray cluster; each of its nodes in the database names the Ray node it is (Ray's hex node id, the
`ray.io/node-id` label), so the driver can pin each placement-group bundle to the node the scheduling pass
chose. NULL for a node registered by hostname only: its bundles are not pinned.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("ray_node_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("ray_node_id")
