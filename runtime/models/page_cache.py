"""`--warm-hf-checkpoint-page-cache`: read a checkpoint's files once into the OS page cache before the roles
load them (each role's loader then maps or reads pages already in memory: what helps NFS-backed storage).

As Relax does it: once per node per checkpoint. The first process on a node to ask streams every file of the
folder (sequential reads of `CHUNK` bytes, the data discarded) under an exclusive lock; the others wait for that
lock and then find the folder's done-marker and read nothing. The marker is keyed by the folder's real path and
the names, sizes and modification times of its files, so a changed checkpoint is read again. Markers live in a
node-local directory (`RELAX_PAGE_CACHE_DIR`, else the system's temporary directory).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK = 8 << 20
# the folders the roles of a job warm before loading, separated by os.pathsep (set by `roles.start_roles`)
WARM_ENV = "RELAX_WARM_PAGE_CACHE"
MARKER_DIR_ENV = "RELAX_PAGE_CACHE_DIR"


def _files(folder: Path) -> list[Path]:
    if folder.is_file():
        return [folder]
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _key(folder: Path, files: list[Path]) -> str:
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for path in files:
        stat = path.stat()
        digest.update(
            f"\0{path.relative_to(folder) if path != folder else path.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
        )
    return digest.hexdigest()[:32]


def warm_page_cache(
    folder: str | os.PathLike[str], *, marker_dir: str | os.PathLike[str] | None = None
) -> int:
    """Stream every file under `folder` once on this node; returns the bytes read here (0 when another process
    on the node already did, or is doing it and finished while this one waited)."""
    root = Path(folder)
    if not root.exists():
        return 0  # not a local folder (a hub id, an unresolved reference): nothing to warm
    files = _files(root)
    markers = Path(marker_dir or os.environ.get(MARKER_DIR_ENV) or tempfile.gettempdir()) / "relax-page-cache"
    markers.mkdir(parents=True, exist_ok=True)
    key = _key(root, files)
    done = markers / f"{key}.done"
    if done.exists():
        return 0
    with open(markers / f"{key}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if done.exists():
                return 0
            total = 0
            for path in files:
                with open(path, "rb", buffering=0) as f:
                    while chunk := f.read(CHUNK):
                        total += len(chunk)
            done.write_text(f"{root.resolve()}\n{total}\n")
            log.info("warmed the page cache with %s: %d files, %.1f MiB", root, len(files), total / 2**20)
            return total
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def warm_from_env() -> int:
    """The folders `WARM_ENV` names, warmed (what each role's process does before loading its model)."""
    folders = [p for p in os.environ.get(WARM_ENV, "").split(os.pathsep) if p]
    return sum(warm_page_cache(folder) for folder in folders)
