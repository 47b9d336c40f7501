"""Files uploaded over HTTP and uploads in parts (`/v1/files`, `/v1/uploads`): OpenAI's Files and Uploads APIs'
shapes (ids, `object`, unix-second times), with the platform's own fields beside them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from scheduler.db.models import FileUpload, FileUploadPart, StoredFile
from scheduler.domain.files import FileStatus, UploadStatus
from scheduler.services.files import upload_status


def _named(row: StoredFile | FileUpload) -> dict[str, Any]:
    """The fields a file and an upload show alike: its id, size, creation time, name and purpose."""
    return {
        "id": row.id,
        "bytes": row.bytes,
        "created_at": int(row.created_at.timestamp()),
        "filename": row.filename,
        "purpose": row.purpose,
    }


class FilePublic(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int = Field(description="The file's size.")
    created_at: int = Field(description="Unix seconds.")
    filename: str
    purpose: str
    status: FileStatus = FileStatus.PROCESSED
    status_details: str | None = None
    expires_at: int | None = None
    team_id: str
    content_type: str
    sha256: str
    kind: Literal["file", "folder"] = Field(
        description="folder: a model archive, unpacked; `file://<id>` then names the folder."
    )
    stored_bytes: int = Field(
        description="What it counts against the team's quota (unpacked folder included)."
    )
    archive_entries: int | None = None
    uri: str = Field(description="How a job's spec names it: file://<id>.")

    @classmethod
    def of(cls, row: StoredFile) -> FilePublic:
        folder = row.archive_entries is not None
        return cls(
            **_named(row),
            team_id=row.team_id,
            content_type=row.content_type,
            sha256=row.sha256,
            kind="folder" if folder else "file",
            stored_bytes=row.stored_bytes,
            archive_entries=row.archive_entries,
            uri=f"file://{row.id}",
        )


class FilesPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[FilePublic]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
    next_cursor: str | None = Field(None, description="Pass as `after` for the next page.")


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class UploadCreate(BaseModel):
    filename: str = Field(max_length=255, description="The file's name.")
    purpose: str = Field(max_length=40, description="As for POST /v1/files (e.g. fine-tune, dataset, model).")
    bytes: int = Field(ge=1, le=1 << 50, description="The file's whole size: the parts must add up to it.")
    mime_type: str = Field(max_length=100, description="The file's content type, e.g. application/x-tar.")
    team: str | None = Field(
        None, max_length=100, description="Admins: the team (name or id); default: yours."
    )


class UploadComplete(BaseModel):
    part_ids: list[str] = Field(
        min_length=1, max_length=100_000, description="The parts' ids in the file's order (one may repeat)."
    )
    md5: str | None = Field(None, max_length=32, description="The file's MD5 (hex), checked when given.")


class UploadPublic(BaseModel):
    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: UploadStatus
    expires_at: int
    mime_type: str
    team_id: str
    file: FilePublic | None = Field(None, description="The file, once completed.")

    @classmethod
    def of(cls, row: FileUpload, file: StoredFile | None = None) -> UploadPublic:
        return cls(
            **_named(row),
            status=upload_status(row),
            expires_at=int(row.expires_at.timestamp()),
            mime_type=row.mime_type,
            team_id=row.team_id,
            file=FilePublic.of(file) if file is not None else None,
        )


class UploadPartPublic(BaseModel):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str
    bytes: int

    @classmethod
    def of(cls, row: FileUploadPart) -> UploadPartPublic:
        return cls(
            id=row.id,
            created_at=int(row.created_at.timestamp()),
            upload_id=row.upload_id,
            bytes=row.bytes,
        )
