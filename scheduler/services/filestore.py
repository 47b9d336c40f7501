"""Where uploaded files' bytes live: one interface (`FileStore`), two stores.

- `LocalStore`: the platform's artifact root; a team's files lie in its own area (`teams/<team>/files/<id>/`),
  where jobs open them as they are. The embedded default.
- `S3Store`: an S3-compatible bucket (AWS, MinIO, Ceph …) under a prefix, through boto3 (the `s3` extra). A job
  reads a local copy, materialised into the team's area (`files/cache/<id>/`) before it runs.

Keys are relative POSIX paths made by the platform (`teams/<team id>/files/<file id>/<name>`), never a user's
string. Nothing half-written is ever seen under a key: each store writes elsewhere first (a temporary name, or
S3's own multipart upload) and makes it appear whole.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Protocol

from scheduler.domain.errors import Conflict
from scheduler.settings import FileSettings

CHUNK = 1024 * 1024


class FileStore(Protocol):
    name: str

    def put(self, key: str, source: Path) -> None:
        """Store the file `source` under `key` whole (it may be moved: the caller no longer needs it)."""

    def size(self, key: str) -> int | None:
        """The stored size, or None when nothing is there."""

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The bytes [start, end) (end None: to the end), in chunks."""

    def delete(self, key: str) -> None:
        """Remove the object (or the folder) under `key`; nothing there is no error."""

    def local_path(self, key: str) -> Path | None:
        """The file's path on this machine, when the store keeps it on one (jobs open it there)."""

    def fetch(self, key: str, dest: Path) -> None:
        """Write the object to `dest` (a temporary name, renamed when whole)."""


def check_key(key: str) -> PurePosixPath:
    p = PurePosixPath(key)
    if p.is_absolute() or not p.parts or any(part in ("", ".", "..") for part in p.parts) or "\x00" in key:
        raise ValueError(f"not a store key: {key!r}")
    return p


def temporary_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.part")


class UnsafeLocation(Conflict):
    """A folder or file of the store leads elsewhere through a link (a team's jobs write in its area)."""

    code = "file.store_link"


def real_dir(path: Path, root: Path) -> Path:
    """`path`, a folder under `root`, made if missing; refused when a link anywhere below `root` makes it lead
    elsewhere (a team's jobs may write in its area, and so replace a folder of it by a link)."""
    path.mkdir(parents=True, exist_ok=True)
    expected = Path(os.path.realpath(root)) / Path(path).relative_to(root)
    if Path(os.path.realpath(path)) != expected:
        raise UnsafeLocation(
            f"{path} leads elsewhere through a symbolic link",
            details={"hint": "remove the link from your team's area (files/ is the platform's)"},
        )
    return path


class LocalStore:
    """Files under the artifact root (each in its team's area)."""

    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, source: Path) -> None:
        target = self.path(key)
        real_dir(target.parent, self.root)
        tmp = temporary_sibling(target)
        try:
            try:
                os.rename(source, tmp)  # the same file system: nothing is copied
            except OSError:
                shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def size(self, key: str) -> int | None:
        try:
            return self.path(key).stat().st_size
        except OSError:
            return None

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        with open(self.path(key), "rb") as fh:
            fh.seek(start)
            left = None if end is None else end - start
            while left is None or left > 0:
                chunk = fh.read(CHUNK if left is None else min(CHUNK, left))
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk

    def delete(self, key: str) -> None:
        path = self.path(key)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def local_path(self, key: str) -> Path | None:
        """The file's path; refused when a link leads it elsewhere."""
        path = self.path(key)
        if os.path.realpath(path) != str(Path(os.path.realpath(self.root)) / check_key(key)):
            raise UnsafeLocation(
                f"the file {key} leads elsewhere through a symbolic link",
                details={"hint": "upload it again; do not replace files/ in your team's area"},
            )
        return path

    def fetch(self, key: str, dest: Path) -> None:
        tmp = temporary_sibling(dest)
        try:
            shutil.copyfile(self.path(key), tmp)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)


class S3Store:
    """Objects in an S3-compatible bucket, under `prefix`."""

    name = "s3"

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
    ) -> None:
        try:
            import boto3
            from boto3.s3.transfer import TransferConfig
        except ImportError as err:  # pragma: no cover - depends on the install
            raise RuntimeError("RELAX_FILES_STORE=s3 needs boto3: pip install 'relax-platform[s3]'") from err
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
        )
        self.transfer = TransferConfig(multipart_threshold=64 * CHUNK, multipart_chunksize=64 * CHUNK)

    def object_key(self, key: str) -> str:
        return self.prefix + str(check_key(key))

    def put(self, key: str, source: Path) -> None:
        # a file over the threshold goes as S3's multipart upload: the object appears only once it is whole
        self.client.upload_file(str(source), self.bucket, self.object_key(key), Config=self.transfer)

    def size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))["ContentLength"])
        except ClientError:
            return None

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        args = {"Bucket": self.bucket, "Key": self.object_key(key)}
        if start or end is not None:
            args["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        body = self.client.get_object(**args)["Body"]
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key))

    def local_path(self, key: str) -> Path | None:
        return None

    def fetch(self, key: str, dest: Path) -> None:
        tmp = temporary_sibling(dest)
        try:
            self.client.download_file(self.bucket, self.object_key(key), str(tmp), Config=self.transfer)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)


_STORES: dict[tuple[object, ...], FileStore] = {}


def store_for(settings: FileSettings, artifact_root: Path) -> FileStore:
    """The store the settings name (one per configuration and process: an S3 client is made once)."""
    if settings.store == "local":
        ident: tuple[object, ...] = ("local", str(artifact_root))
    else:
        ident = (
            "s3",
            settings.s3_endpoint_url,
            settings.s3_bucket,
            settings.s3_prefix,
            settings.s3_access_key_id,
            str(artifact_root),
        )
    store = _STORES.get(ident)
    if store is None:
        if settings.store == "local":
            store = LocalStore(artifact_root)
        else:
            if not settings.s3_bucket:
                raise RuntimeError("RELAX_FILES_STORE=s3 needs RELAX_FILES_S3_BUCKET")
            store = S3Store(
                bucket=settings.s3_bucket,
                prefix=settings.s3_prefix,
                endpoint_url=settings.s3_endpoint_url,
                region=settings.s3_region,
                access_key_id=settings.s3_access_key_id,
                secret_access_key=settings.s3_secret_access_key,
            )
        _STORES[ident] = store
    _BY_ROOT[str(artifact_root)] = store
    return store


_BY_ROOT: dict[str, FileStore] = {}


def store_of_root(artifact_root: Path) -> FileStore | None:
    """The store this process last used for the platform of `artifact_root` (the path resolution of a
    submission materialises S3 files through it)."""
    return _BY_ROOT.get(str(artifact_root))
