"""Files uploaded over HTTP (`/v1/files`, `/v1/uploads`): a file's and an upload's status, as OpenAI's Files and
Uploads APIs name them (the platform answers in their shapes: docs/reference/files.md)."""

from __future__ import annotations

from enum import StrEnum


class FileStatus(StrEnum):
    """A stored file's. The platform stores a file whole before it answers, so its files are `processed`; the
    other two are OpenAI's, kept for clients that switch on them."""

    UPLOADED = "uploaded"
    PROCESSED = "processed"
    ERROR = "error"


class UploadStatus(StrEnum):
    """An upload in parts' (`/v1/uploads`)."""

    PENDING = "pending"  # taking parts
    COMPLETED = "completed"  # its file is stored
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # not completed in time: takes no more parts, counts against no quota
