"""A team's files uploaded over HTTP (`/v1/files`, `/v1/uploads`: OpenAI's Files and Uploads APIs' shapes;
docs/reference/files.md), kept in the platform's file store (scheduler/services/filestore.py).

- A file arrives whole (`POST /v1/files`) or in parts (`/v1/uploads`: create, add parts, complete). Its bytes
  are written to a temporary name in the team's area first (`files/.staging/`), counted and hashed as they
  come, and stored under the file's key only once whole and accepted: a refused or failed upload leaves
  nothing behind, and a transaction that rolls back removes what it had stored.
- A model may be a folder: a tar (optionally compressed) or zip archive uploaded with purpose `model` is
  unpacked into `files/<id>/model/` (the S3 store: into the cache, when a job first uses it). Only regular
  files and folders are taken, within the archive's folder: an absolute name, `..`, a link of either kind, a
  device, a duplicate, too many entries or too many bytes refuse the whole upload.
- A team keeps at most `team_quota_bytes` (its files, their unpacked folders, and what its uploads in progress
  declared): past it, 413 and nothing kept.
- A job names a file by `file://<id>` in a path field (scheduler/services/paths.py): its local path, or its
  copy materialised into the team's area (`files/cache/<id>/`). Another team's id is answered as an unknown one.

Who may: every role of a team reads its files; its writers (admin, team admin, member) upload and delete.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
import tarfile
import uuid
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobspec.issues import SpecIssue
from scheduler.db.models import FileUpload, FileUploadPart, StoredFile, Team, utcnow
from scheduler.domain.errors import Conflict, DomainError, InvalidRequest, NotFound
from scheduler.domain.files import UploadStatus
from scheduler.domain.ids import new_id
from scheduler.domain.roles import Action
from scheduler.services.auth import Principal, team_for
from scheduler.services.filestore import FileStore, real_dir, store_for, store_of_root
from scheduler.settings import FileSettings

log = logging.getLogger("relax.files")


def team_area(artifact_root: Path, team_id: str) -> Path:
    """The team's area (as scheduler/services/paths.py names it: that module imports this one)."""
    return Path(artifact_root) / "teams" / team_id


READ = Action.JOB_READ
WRITE = Action.JOB_SUBMIT
FILE_SCHEME = "file://"
#: OpenAI's purposes, and the platform's own (`dataset`, `model`).
PURPOSES = ("fine-tune", "batch", "evals", "user_data", "assistants", "vision", "dataset", "model")
FILES_DIR = "files"  # <area>/files/<id>/...
STAGING_DIR = ".staging"
UPLOADS_DIR = ".uploads"
CACHE_DIR = "cache"
MODEL_DIR = "model"
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")
#: Content types a file may be declared with: text and data formats, archives, and plain bytes. Images, audio,
#: video, HTML and executables are no dataset or model of this platform.
_ALLOWED_TYPES = re.compile(
    r"^(text/(plain|csv|tab-separated-values|markdown|x-python|x-yaml|yaml)"
    r"|application/(octet-stream|json|jsonl|x-ndjson|ndjson|x-jsonlines|jsonlines|yaml|x-yaml|x-tar|tar|gzip"
    r"|x-gzip|x-gtar|zip|x-zip-compressed|x-bzip2|x-xz|vnd\.apache\.parquet|x-parquet|x-safetensors"
    r"|x-hdf5|x-python-pickle|x-npy|x-numpy))$"
)
_NAME_BAD = re.compile(r"[\x00-\x1f/\\]")
_MD5 = re.compile(r"^[0-9a-fA-F]{32}$")
_WRITTEN = "relax_files_written"  # session.info: what this transaction stored (removed if it rolls back)
_REMOVE = "relax_files_remove"  # session.info: what to remove once it commits


class TooLarge(DomainError):
    code = "file.too_large"
    status_code = 413


class UnsupportedType(DomainError):
    code = "file.unsupported_type"
    status_code = 415


def _invalid(message: str, field: str, hint: str, code: str = "file.invalid") -> InvalidRequest:
    return InvalidRequest.naming(field, message, hint, code=code)


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


# Transactions: bytes stored in a transaction that rolls back are removed; removals wait for the commit --------
@sa.event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    session.info.pop(_WRITTEN, None)
    for store, key in session.info.pop(_REMOVE, []):
        _quietly_delete(store, key)


@sa.event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    session.info.pop(_REMOVE, None)
    for store, key in session.info.pop(_WRITTEN, []):
        _quietly_delete(store, key)


def _quietly_delete(store: FileStore | Path, key: str) -> None:
    try:
        if isinstance(store, Path):
            shutil.rmtree(store / key, ignore_errors=True)
        else:
            store.delete(key)
    except Exception:  # noqa: BLE001 - an object left behind is not worth failing the request for
        log.warning("could not remove %s from the file store", key, exc_info=True)


def _written(session: Session, store: FileStore | Path, key: str) -> None:
    session.info.setdefault(_WRITTEN, []).append((store, key))


def _remove_after_commit(session: Session, store: FileStore | Path, key: str) -> None:
    session.info.setdefault(_REMOVE, []).append((store, key))


# Checks of what a caller gives -------------------------------------------------------------------------------
def check_purpose(purpose: str) -> str:
    if purpose not in PURPOSES:
        raise _invalid(
            f"purpose {purpose[:100]!r} is not one of {', '.join(PURPOSES)}",
            "purpose",
            "use fine-tune or dataset for training data, model for a checkpoint (a file, or a folder as a tar or "
            "zip archive), evals for eval data",
            code="file.bad_purpose",
        )
    return purpose


def check_filename(filename: str | None, field: str = "filename") -> str:
    name = (filename or "").strip()
    if not name or name in (".", "..") or _NAME_BAD.search(name) or len(name.encode()) > 255:
        raise _invalid(
            f"{field} {name[:100]!r} is not a file name",
            field,
            "give a plain name of at most 255 bytes, without '/', '\\' or control characters",
            code="file.bad_filename",
        )
    return name


def check_content_type(content_type: str | None, field: str = "file") -> str:
    ctype = (content_type or "application/octet-stream").split(";")[0].strip().lower()
    if not _ALLOWED_TYPES.match(ctype):
        raise UnsupportedType(
            f"{field}: content type {ctype[:100]!r} is not taken",
            issues=[
                SpecIssue(
                    "file.unsupported_type",
                    field,
                    f"content type {ctype[:100]!r} is not taken",
                    "upload data as text/JSONL/CSV/Parquet, a model's files or a tar/zip archive of a folder "
                    "(application/octet-stream for any other bytes)",
                )
            ],
        )
    return ctype


def is_archive(filename: str, purpose: str) -> bool:
    return purpose == "model" and filename.lower().endswith(ARCHIVE_SUFFIXES)


# Safe unpacking of a model archive ---------------------------------------------------------------------------
@dataclass
class Entry:
    name: PurePosixPath
    is_dir: bool
    size: int


class ArchiveRefused(InvalidRequest):
    code = "file.bad_archive"


def _refuse_archive(message: str, hint: str = "pack the folder with plain files only") -> ArchiveRefused:
    return ArchiveRefused.naming("file", message, hint)


def _entry_name(raw: str) -> PurePosixPath | None:
    """The entry's relative path, None for the archive's root itself; refused when it would leave it."""
    if "\x00" in raw or "\\" in raw:
        raise _refuse_archive(f"archive entry {raw[:200]!r} has a NUL or a backslash in its name")
    p = PurePosixPath(raw)
    if p.is_absolute():
        raise _refuse_archive(f"archive entry {raw[:200]!r} is an absolute path", "pack relative paths only")
    parts = [x for x in p.parts if x != "."]
    if ".." in parts:
        raise _refuse_archive(f"archive entry {raw[:200]!r} leaves the archive's folder ('..')")
    if any(len(x.encode()) > 255 for x in parts) or len(raw.encode()) > 4096:
        raise _refuse_archive(f"archive entry {raw[:200]!r} has too long a name")
    return PurePosixPath(*parts) if parts else None


def _entries(path: Path) -> tuple[str, list[tuple[Entry, Any]]]:
    """The archive's kind and its entries (with the archive's own member object), refused if any is not a
    plain file or folder."""
    out: list[tuple[Entry, Any]] = []
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                kind = stat.S_IFMT(info.external_attr >> 16)  # 0: a zip that says nothing of it
                if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                    raise _refuse_archive(
                        f"archive entry {info.filename[:200]!r} is a link or a special file",
                        "archive the files themselves (zip without --symlinks)",
                    )
                name = _entry_name(info.filename)
                if name is not None:
                    out.append((Entry(name, info.is_dir(), 0 if info.is_dir() else info.file_size), info))
        return "zip", out
    try:
        with tarfile.open(path, "r:*") as tf:
            for member in tf:
                if member.issym() or member.islnk():
                    raise _refuse_archive(
                        f"archive entry {member.name[:200]!r} is a link",
                        "pack the files the links point to (tar --dereference)",
                    )
                if not (member.isreg() or member.isdir()):
                    raise _refuse_archive(
                        f"archive entry {member.name[:200]!r} is a device, a FIFO or another special file"
                    )
                name = _entry_name(member.name)
                if name is not None:
                    out.append((Entry(name, member.isdir(), member.size if member.isreg() else 0), member))
        return "tar", out
    except (tarfile.TarError, EOFError, OSError) as err:
        raise _refuse_archive(
            f"the model archive cannot be read as tar or zip ({err})",
            "upload a .tar, .tar.gz, .tgz or .zip archive of the model's folder, or the model's file itself",
        ) from None


def scan_archive(path: Path, *, max_entries: int, max_bytes: int) -> tuple[int, int]:
    """(entries, unpacked bytes) of a model archive, refused as `unpack_archive` would refuse it."""
    _, entries = _entries(path)
    return _bounded(entries, max_entries=max_entries, max_bytes=max_bytes)


def _bounded(entries: list[tuple[Entry, Any]], *, max_entries: int, max_bytes: int) -> tuple[int, int]:
    if len(entries) > max_entries:
        raise TooLarge(
            f"the model archive has {len(entries)} entries, more than {max_entries}",
            code="file.archive_too_large",
            issues=[SpecIssue("file.archive_too_large", "file", "too many entries", "pack fewer files")],
        )
    total = sum(e.size for e, _ in entries)
    if total > max_bytes:
        raise TooLarge(
            f"the model archive unpacks to {_gib(total)}, more than {_gib(max_bytes)}",
            code="file.archive_too_large",
            issues=[
                SpecIssue(
                    "file.archive_too_large",
                    "file",
                    f"unpacks to {total} bytes",
                    "free space (DELETE /v1/files/{id}) or ask an admin for a larger quota",
                )
            ],
        )
    seen: set[PurePosixPath] = set()
    for e, _ in entries:
        if e.name in seen and not e.is_dir:
            raise _refuse_archive(f"archive entry {str(e.name)[:200]!r} appears twice")
        seen.add(e.name)
    return len(entries), total


def unpack_archive(
    path: Path, dest: Path, *, max_entries: int, max_bytes: int
) -> tuple[int, int, PurePosixPath]:
    """Unpack the archive at `path` into the new folder `dest` (which must not exist): regular files and folders
    only, each inside `dest`, at most `max_entries` entries and `max_bytes` bytes (as read, not as declared).
    Returns (entries, bytes, the model's folder inside `dest`: its one top-level folder when it has just one)."""
    kind, entries = _entries(path)
    count, _ = _bounded(entries, max_entries=max_entries, max_bytes=max_bytes)
    dest.mkdir(parents=True)
    root = dest.resolve()
    written = 0
    opener = zipfile.ZipFile(path) if kind == "zip" else tarfile.open(path, "r:*")
    with opener as archive:
        for entry, member in entries:
            target = root / entry.name
            if entry.is_dir:
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.parent.resolve() != target.parent or not target.parent.is_relative_to(root):
                raise _refuse_archive(f"archive entry {str(entry.name)[:200]!r} leaves the archive's folder")
            src: IO[bytes] | None = archive.open(member) if kind == "zip" else archive.extractfile(member)  # type: ignore[union-attr,arg-type]
            if src is None:
                raise _refuse_archive(f"archive entry {str(entry.name)[:200]!r} cannot be read")
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with src, os.fdopen(fd, "wb") as out:
                while chunk := src.read(1024 * 1024):
                    written += len(chunk)
                    if written > max_bytes:
                        raise TooLarge(
                            f"the model archive unpacks to more than {_gib(max_bytes)}",
                            code="file.archive_too_large",
                        )
                    out.write(chunk)
    top = [p for p in root.iterdir()]
    inner = PurePosixPath(top[0].name) if len(top) == 1 and top[0].is_dir() else PurePosixPath(".")
    return count, written, inner


# The service -------------------------------------------------------------------------------------------------
@dataclass
class Ingested:
    """Bytes received into a temporary file of the team's staging folder."""

    path: Path
    size: int
    sha256: str
    md5: str


class Files:
    """Files and uploads of the caller's team, in `session`, kept in `store`."""

    def __init__(
        self, session: Session, *, settings: FileSettings, artifact_root: Path, store: FileStore
    ) -> None:
        self.session = session
        self.settings = settings
        self.artifact_root = Path(artifact_root)
        self.store = store

    # where things are
    def area(self, team_id: str) -> Path:
        return team_area(self.artifact_root, team_id)

    def key(self, team_id: str, *parts: str) -> str:
        return "/".join(("teams", team_id, FILES_DIR, *parts))

    def staging(self, team_id: str) -> Path:
        return real_dir(self.area(team_id) / FILES_DIR / STAGING_DIR, self.artifact_root)

    # receiving bytes
    def ingest(self, team_id: str, source: IO[bytes], *, limit: int, field: str = "file") -> Ingested:
        """Copy `source` into a temporary file of the team's staging folder, counting and hashing; past `limit`
        bytes 413 and nothing kept."""
        tmp = self.staging(team_id) / f"{uuid.uuid4().hex}.part"
        sha, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
        try:
            with open(tmp, "xb") as out:
                while chunk := source.read(1024 * 1024):
                    size += len(chunk)
                    if size > limit:
                        raise TooLarge(
                            f"{field} is larger than {_gib(limit)}",
                            issues=[
                                SpecIssue(
                                    "file.too_large",
                                    field,
                                    f"larger than {limit} bytes",
                                    "send a large file in parts: POST /v1/uploads (relaxctl files upload does)",
                                )
                            ],
                        )
                    sha.update(chunk)
                    md5.update(chunk)
                    out.write(chunk)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return Ingested(tmp, size, sha.hexdigest(), md5.hexdigest())

    def used_bytes(self, team_id: str, *, except_upload: str | None = None) -> int:
        """What the team keeps: its files (with their unpacked folders) and what its live uploads declared."""
        files = self.session.scalar(
            sa.select(sa.func.coalesce(sa.func.sum(StoredFile.stored_bytes), 0)).where(
                StoredFile.team_id == team_id
            )
        )
        q = sa.select(sa.func.coalesce(sa.func.sum(FileUpload.bytes), 0)).where(
            FileUpload.team_id == team_id,
            FileUpload.status == UploadStatus.PENDING,
            FileUpload.expires_at > utcnow(),
        )
        if except_upload is not None:
            q = q.where(FileUpload.id != except_upload)
        return int(files or 0) + int(self.session.scalar(q) or 0)

    def check_quota(self, team: Team, adding: int, *, except_upload: str | None = None) -> None:
        quota = self.settings.team_quota_bytes
        used = self.used_bytes(team.id, except_upload=except_upload)
        if used + adding > quota:
            message = f"team {team.name!r} keeps {_gib(used)} of its {_gib(quota)} quota: {_gib(adding)} more does not fit"
            raise TooLarge(
                message,
                code="file.over_quota",
                issues=[
                    SpecIssue(
                        "file.over_quota",
                        "file",
                        message,
                        "delete files the team no longer needs (relaxctl files delete ID), or ask an admin to raise "
                        "RELAX_FILES_TEAM_QUOTA_BYTES",
                    )
                ],
                details={"quota_bytes": quota, "used_bytes": used},
            )

    # files
    def create(
        self,
        principal: Principal,
        source: IO[bytes],
        *,
        filename: str | None,
        purpose: str,
        content_type: str | None,
        team: str | None = None,
    ) -> StoredFile:
        """A file sent whole (`POST /v1/files`)."""
        principal.require(WRITE)
        target = team_for(self.session, principal, team)
        purpose = check_purpose(purpose)
        name = check_filename(filename, "file")
        ctype = check_content_type(content_type)
        got = self.ingest(target.id, source, limit=self.settings.max_file_bytes)
        return self._keep(principal, target, got, filename=name, purpose=purpose, content_type=ctype)

    def _keep(
        self,
        principal: Principal,
        team: Team,
        got: Ingested,
        *,
        filename: str,
        purpose: str,
        content_type: str,
        except_upload: str | None = None,
    ) -> StoredFile:
        """Store ingested bytes as a new file of `team` (quota, archive, store); the temporary file is consumed."""
        file_id = new_id("file")
        unpacked_rel: str | None = None
        entries: int | None = None
        stored = got.size
        unpacked_dir: Path | None = None
        try:
            self.check_quota(team, got.size, except_upload=except_upload)
            if is_archive(filename, purpose):
                room = (
                    self.settings.team_quota_bytes
                    - self.used_bytes(team.id, except_upload=except_upload)
                    - got.size
                )
                limit = max(0, min(self.settings.max_unpacked_bytes, room))
                if self.store.name == "local":  # unpacked once, now
                    unpacked_dir = self.staging(team.id) / f"{uuid.uuid4().hex}.d"
                    entries, size, inner = unpack_archive(
                        got.path, unpacked_dir, max_entries=self.settings.max_archive_entries, max_bytes=limit
                    )
                    unpacked_rel = str(PurePosixPath(MODEL_DIR) / inner) if str(inner) != "." else MODEL_DIR
                else:  # S3: checked now, unpacked into the cache when a job uses it
                    entries, size = scan_archive(
                        got.path, max_entries=self.settings.max_archive_entries, max_bytes=limit
                    )
                    unpacked_rel = None
                stored += size
            key = self.key(team.id, file_id, filename)
            self.store.put(key, got.path)
            _written(self.session, self.store, self.key(team.id, file_id, filename))
            unpacked_key = None
            if unpacked_dir is not None:
                final = self.area(team.id) / FILES_DIR / file_id / MODEL_DIR
                os.replace(unpacked_dir, final)
                unpacked_dir = None
                unpacked_key = self.key(team.id, file_id, unpacked_rel or MODEL_DIR)
                _written(self.session, self.artifact_root, self.key(team.id, file_id))
        finally:
            got.path.unlink(missing_ok=True)
            if unpacked_dir is not None:
                shutil.rmtree(unpacked_dir, ignore_errors=True)
        row = StoredFile(
            id=file_id,
            team_id=team.id,
            filename=filename,
            purpose=purpose,
            content_type=content_type,
            bytes=got.size,
            stored_bytes=stored,
            sha256=got.sha256,
            store=self.store.name,
            key=key,
            unpacked_key=unpacked_key,
            archive_entries=entries,
            created_by=principal.key_id,
        )
        self.session.add(row)
        self.session.flush()
        return row

    def list(
        self,
        principal: Principal,
        *,
        purpose: str | None = None,
        team: str | None = None,
        after: str | None = None,
        limit: int = 50,
        order: str = "desc",
    ) -> tuple[list[StoredFile], str | None]:
        """The team's files (an admin: every team's, or `team`'s), newest first (`order=asc`: oldest first);
        `after` is the id of the last file of the previous page."""
        principal.require(READ)
        q = sa.select(StoredFile)
        if team is not None or not principal.is_admin:
            q = q.where(StoredFile.team_id == team_for(self.session, principal, team).id)
        if purpose is not None:
            q = q.where(StoredFile.purpose == check_purpose(purpose))
        if after:
            q = q.where(StoredFile.id < after if order == "desc" else StoredFile.id > after)
        q = q.order_by(StoredFile.id.desc() if order == "desc" else StoredFile.id.asc()).limit(limit + 1)
        rows = list(self.session.scalars(q))
        return rows[:limit], (rows[limit - 1].id if len(rows) > limit else None)

    def get(self, principal: Principal, file_id: str) -> StoredFile:
        principal.require(READ)
        row = self.session.get(StoredFile, file_id) if len(file_id) <= 40 else None
        if row is None or not principal.can_see_team(row.team_id):
            raise NotFound(f"file {file_id[:100]!r} not found", code="file.not_found")
        return row

    def delete(self, principal: Principal, file_id: str) -> StoredFile:
        """Remove a file; its bytes (and its unpacked folder, its cached copy) go once the removal commits. A job
        that already resolved it to a path keeps reading the copy it has only if it is in the cache."""
        principal.require(WRITE)
        row = self.get(principal, file_id)
        self.session.delete(row)
        self.session.flush()
        _remove_after_commit(self.session, self.store, row.key)
        _remove_after_commit(self.session, self.artifact_root, self.key(row.team_id, row.id))
        _remove_after_commit(self.session, self.artifact_root, self.key(row.team_id, CACHE_DIR, row.id))
        return row

    # uploads in parts
    def create_upload(
        self,
        principal: Principal,
        *,
        filename: str,
        purpose: str,
        size: int,
        mime_type: str,
        team: str | None = None,
    ) -> FileUpload:
        principal.require(WRITE)
        target = team_for(self.session, principal, team)
        purpose = check_purpose(purpose)
        name = check_filename(filename)
        ctype = check_content_type(mime_type, "mime_type")
        if size > self.settings.max_upload_bytes:
            raise TooLarge(
                f"bytes: {size} is more than an upload may hold ({_gib(self.settings.max_upload_bytes)})",
                issues=[
                    SpecIssue(
                        "file.too_large",
                        "bytes",
                        "too large",
                        "ask an admin to raise RELAX_FILES_MAX_UPLOAD_BYTES",
                    )
                ],
            )
        self._sweep_expired(target.id)
        self.check_quota(target, size)
        upload = FileUpload(
            id=new_id("upload"),
            team_id=target.id,
            filename=name,
            purpose=purpose,
            mime_type=ctype,
            bytes=size,
            status=UploadStatus.PENDING,
            expires_at=utcnow() + timedelta(seconds=self.settings.upload_expiry_seconds),
            created_by=principal.key_id,
        )
        self.session.add(upload)
        self.session.flush()
        return upload

    def _sweep_expired(self, team_id: str) -> None:
        """Mark the team's uploads past their time expired, and remove their parts once that commits."""
        expired = list(
            self.session.scalars(
                sa.select(FileUpload).where(
                    FileUpload.team_id == team_id,
                    FileUpload.status == UploadStatus.PENDING,
                    FileUpload.expires_at <= utcnow(),
                )
            )
        )
        for upload in expired:
            upload.status = UploadStatus.EXPIRED
            self.session.execute(sa.delete(FileUploadPart).where(FileUploadPart.upload_id == upload.id))
            _remove_after_commit(self.session, self.artifact_root, self.key(team_id, UPLOADS_DIR, upload.id))

    def get_upload(
        self, principal: Principal, upload_id: str, *, pending: bool = False, write: bool = False
    ) -> FileUpload:
        principal.require(WRITE if pending or write else READ)
        upload = self.session.get(FileUpload, upload_id) if len(upload_id) <= 40 else None
        if upload is None or not principal.can_see_team(upload.team_id):
            raise NotFound(f"upload {upload_id[:100]!r} not found", code="upload.not_found")
        if pending:
            state = upload_status(upload)
            if state != UploadStatus.PENDING:
                raise Conflict(
                    f"upload {upload.id} is {state}",
                    code=f"upload.{state}",
                    details={
                        "field": "upload_id",
                        "hint": "start a new upload (POST /v1/uploads)"
                        if state != UploadStatus.COMPLETED
                        else f"the file is {upload.file_id}",
                    },
                )
        return upload

    def add_part(self, principal: Principal, upload_id: str, source: IO[bytes]) -> FileUploadPart:
        """A part of a pending upload. The same bytes sent again are the same part (its id is answered again)."""
        upload = self.get_upload(principal, upload_id, pending=True)
        got = self.ingest(upload.team_id, source, limit=self.settings.max_part_bytes, field="data")
        try:
            same = self.session.scalar(
                sa.select(FileUploadPart).where(
                    FileUploadPart.upload_id == upload.id, FileUploadPart.digest == got.sha256
                )
            )
            folder = real_dir(
                self.area(upload.team_id) / FILES_DIR / UPLOADS_DIR / upload.id, self.artifact_root
            )
            if same is not None:  # the same bytes: the same part (its file laid anew, whatever became of it)
                os.replace(got.path, folder / same.id)
                return same
            have = self.session.scalar(
                sa.select(sa.func.coalesce(sa.func.sum(FileUploadPart.bytes), 0)).where(
                    FileUploadPart.upload_id == upload.id
                )
            )
            if int(have or 0) + got.size > upload.bytes:
                raise Conflict(
                    f"upload {upload.id} declared {upload.bytes} bytes; its parts would hold {int(have or 0) + got.size}",
                    code="upload.too_many_bytes",
                    details={
                        "field": "data",
                        "hint": "send the file's bytes once each; start a new upload for a larger file",
                    },
                )
            part = FileUploadPart(id=new_id("part"), upload_id=upload.id, bytes=got.size, digest=got.sha256)
            os.replace(got.path, folder / part.id)
            _written(
                self.session, self.artifact_root, self.key(upload.team_id, UPLOADS_DIR, upload.id, part.id)
            )
            self.session.add(part)
            self.session.flush()
            return part
        finally:
            got.path.unlink(missing_ok=True)

    def complete_upload(
        self, principal: Principal, upload_id: str, *, part_ids: list[str], md5: str | None
    ) -> tuple[FileUpload, StoredFile]:
        """The parts, in the order given (a part may be named more than once), become the file."""
        upload = self.get_upload(principal, upload_id, pending=True)
        parts = {
            p.id: p
            for p in self.session.scalars(
                sa.select(FileUploadPart).where(FileUploadPart.upload_id == upload.id)
            )
        }
        unknown = [p for p in part_ids if p not in parts]
        if unknown or not part_ids:
            raise _invalid(
                f"part_ids: {unknown[:5] if unknown else 'none given'} {'are no parts of' if unknown else 'for'} upload {upload.id}",
                "part_ids",
                "list the ids POST /v1/uploads/{id}/parts answered, in the file's order",
                code="upload.unknown_part",
            )
        total = sum(parts[p].bytes for p in part_ids)
        if total != upload.bytes:
            raise _invalid(
                f"part_ids: the parts hold {total} bytes, the upload declared {upload.bytes}",
                "part_ids",
                "send the missing parts, then complete with every part id in order",
                code="upload.size_mismatch",
            )
        if md5 is not None and not _MD5.match(md5):
            raise _invalid("md5 is not 32 hex digits", "md5", "give the file's MD5 as hex, or leave it out")
        folder = self.area(upload.team_id) / FILES_DIR / UPLOADS_DIR / upload.id
        team = self.session.get(Team, upload.team_id)
        assert team is not None
        real_dir(folder, self.artifact_root)
        got = self.ingest(
            upload.team_id, _Joined((folder / p, parts[p].digest) for p in part_ids), limit=upload.bytes
        )
        if md5 is not None and md5.lower() != got.md5:
            got.path.unlink(missing_ok=True)
            raise _invalid(
                f"md5: the parts' MD5 is {got.md5}, not {md5.lower()}",
                "md5",
                "a part was corrupted or is out of order: send it again and complete with the ids in the file's order",
                code="upload.md5_mismatch",
            )
        file = self._keep(
            principal,
            team,
            got,
            filename=upload.filename,
            purpose=upload.purpose,
            content_type=upload.mime_type,
            except_upload=upload.id,
        )
        upload.status = UploadStatus.COMPLETED
        upload.file_id = file.id
        self.session.execute(sa.delete(FileUploadPart).where(FileUploadPart.upload_id == upload.id))
        _remove_after_commit(
            self.session, self.artifact_root, self.key(upload.team_id, UPLOADS_DIR, upload.id)
        )
        self.session.flush()
        return upload, file

    def cancel_upload(self, principal: Principal, upload_id: str) -> FileUpload:
        upload = self.get_upload(principal, upload_id, pending=True)
        upload.status = UploadStatus.CANCELLED
        self.session.execute(sa.delete(FileUploadPart).where(FileUploadPart.upload_id == upload.id))
        _remove_after_commit(
            self.session, self.artifact_root, self.key(upload.team_id, UPLOADS_DIR, upload.id)
        )
        self.session.flush()
        return upload


def upload_status(upload: FileUpload) -> UploadStatus:
    """The upload's status as answered: a pending one past its time is expired (its row says so once the team
    next starts an upload)."""
    if upload.status == UploadStatus.PENDING and upload.expires_at <= utcnow():
        return UploadStatus.EXPIRED
    return UploadStatus(upload.status)


class _Joined:
    """The part files of `parts` (path, sha256), read one after the other as one stream: each opened without
    following a link and checked against the digest it had when received (the team's jobs may write in its
    area: a part replaced meanwhile would otherwise bring in bytes the uploader never sent)."""

    def __init__(self, parts: Iterable[tuple[Path, str]]) -> None:
        self._parts: Iterator[tuple[Path, str]] = iter(parts)
        self._fh: IO[bytes] | None = None
        self._digest = ""
        self._path = Path()
        self._sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        while True:
            if self._fh is None:
                nxt = next(self._parts, None)
                if nxt is None:
                    return b""
                self._path, self._digest = nxt
                try:
                    self._fh = os.fdopen(os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW), "rb")
                except OSError:
                    raise self._changed(self._path) from None
                self._sha = hashlib.sha256()
            chunk = self._fh.read(n)
            if chunk:
                self._sha.update(chunk)
                return chunk
            self._fh.close()
            self._fh = None
            if self._sha.hexdigest() != self._digest:
                raise self._changed(self._path)

    @staticmethod
    def _changed(path: Path) -> Conflict:
        return Conflict(
            f"part {path.name} is not what was received (it was changed or removed in the team's area)",
            code="upload.part_changed",
            details={"field": "part_ids", "hint": "send that part again, then complete"},
        )


# Byte ranges -------------------------------------------------------------------------------------------------
class RangeNotSatisfiable(DomainError):
    code = "file.range_not_satisfiable"
    status_code = 416


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one range [start, end) a `Range` header asks of `size` bytes; None to send the whole file (no header,
    another unit, several ranges); 416 for a range that is malformed or lies past the end."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes":
        return None
    if "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    bad = RangeNotSatisfiable(
        f"range {header[:100]!r} is not satisfiable for {size} bytes",
        details={
            "field": "Range",
            "size": size,
            "hint": f"ask for bytes=START-END within 0-{max(size - 1, 0)}",
        },
    )
    if (
        not dash
        or not (first.isdigit() or last.isdigit())
        or (first and not first.isdigit())
        or (last and not last.isdigit())
    ):
        raise bad
    if not first:  # the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            raise bad
        return max(0, size - n), size
    start = int(first)
    end = int(last) + 1 if last else size
    if start >= size or end <= start:
        raise bad
    return start, min(end, size)


# file:// in a job's spec -------------------------------------------------------------------------------------
def resolve_file_ref(
    session: Session, *, team_id: str, artifact_root: Path, ref: str, settings: FileSettings | None = None
) -> Path | None:
    """The local path a job opens for `file://<ref>` of team `team_id`: the file itself (a model archive: its
    unpacked folder) in the local store, or its copy in the team's cache (`files/cache/<id>/`) for the S3 store,
    materialised now if missing. None when the team has no such file (another team's is none of its own)."""
    row = session.get(StoredFile, ref) if 0 < len(ref) <= 40 else None
    if row is None or row.team_id != team_id:
        return None
    root = Path(artifact_root)
    if row.store == "local":
        return root / (row.unpacked_key or row.key)
    store = store_of_root(root)
    if store is None or store.name != row.store:
        from scheduler.settings import get_settings

        store = store_for(settings or get_settings().files, root)
    return materialise(row, store=store, artifact_root=root, settings=settings or FileSettings())


def materialise(row: StoredFile, *, store: FileStore, artifact_root: Path, settings: FileSettings) -> Path:
    """A local copy of a file kept elsewhere (S3), in its team's cache; made once, appearing whole."""
    cache = team_area(artifact_root, row.team_id) / FILES_DIR / CACHE_DIR / row.id
    if cache.is_dir():
        return _cached_path(cache, row)
    staging = team_area(artifact_root, row.team_id) / FILES_DIR / STAGING_DIR
    staging.mkdir(parents=True, exist_ok=True)
    work = staging / f"{uuid.uuid4().hex}.cache"
    try:
        work.mkdir()
        store.fetch(row.key, work / row.filename)
        if is_archive(row.filename, row.purpose):
            _, _, inner = unpack_archive(
                work / row.filename,
                work / MODEL_DIR,
                max_entries=settings.max_archive_entries,
                max_bytes=max(row.stored_bytes - row.bytes, 0),
            )
            (work / row.filename).unlink()
            (work / ".root").write_text(str(PurePosixPath(MODEL_DIR) / inner))
        cache.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(work, cache)
        except OSError:
            if not cache.is_dir():  # another submission made it meanwhile otherwise
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _cached_path(cache, row)


def _cached_path(cache: Path, row: StoredFile) -> Path:
    marker = cache / ".root"
    if marker.is_file():
        return cache / marker.read_text().strip()
    return cache / row.filename
