"""files: what teams upload over HTTP, and uploads in parts

`files` holds each uploaded file of a team: its name, purpose, size, sha256, and where its bytes are (the
platform's file store: the team's area, or an S3 bucket); a model archive also names the folder it was unpacked
into. `file_uploads` and `file_upload_parts` hold uploads in parts (OpenAI's Uploads API's shape) until they are
completed into a file, cancelled or expire (docs/reference/files.md).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.tables import create_team_table

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_team_table(
        "files",
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("purpose", sa.String(length=20), nullable=False),
        sa.Column("content_type", sa.String(length=100), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("stored_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("store", sa.String(length=10), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("unpacked_key", sa.Text(), nullable=True),
        sa.Column("archive_entries", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_files_team_id_id", "files", ["team_id", "id"], unique=False)
    create_team_table(
        "file_uploads",
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("purpose", sa.String(length=20), nullable=False),
        sa.Column("mime_type", sa.String(length=100), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=10), nullable=False),
        sa.Column("file_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(op.f("ix_file_uploads_team_id"), "file_uploads", ["team_id"], unique=False)
    op.create_table(
        "file_upload_parts",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("upload_id", sa.String(length=40), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["upload_id"], ["file_uploads.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("upload_id", "digest", name="uq_file_upload_parts_digest"),
    )
    op.create_index(op.f("ix_file_upload_parts_upload_id"), "file_upload_parts", ["upload_id"], unique=False)


def downgrade() -> None:
    for table in ("file_upload_parts", "file_uploads", "files"):
        op.drop_table(table)  # its indexes go with it
