"""Secret files under $RELAX_HOME (`admin.key`, `secret.key`): readable by this user only from their
first byte, written whole or not at all, created once by whichever process comes first."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger(__name__)

SECRET_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def ensure_private_dir(path: Path) -> Path:
    """`path` (and missing parents) as a directory only this user can enter. An existing directory of
    this user that others may enter is narrowed to 0700 (never a shared, sticky one such as /tmp)."""
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_mode & 0o077:
        if st.st_uid == os.getuid() and not st.st_mode & stat.S_ISVTX:
            os.chmod(path, PRIVATE_DIR_MODE)
        else:
            log.warning("%s is open to other users; keep the platform's home in a private directory", path)
    return path


def create_secret_file(path: Path, content: str) -> bool:
    """Create `path` with `content`, mode 0600 from creation on (never world-readable, not even while
    written), atomically: readers see the whole file or none. True when this call created it; False
    when it existed already (it is then left as it is)."""
    ensure_private_dir(path.parent)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, SECRET_FILE_MODE)
    try:
        os.fchmod(fd, SECRET_FILE_MODE)  # the umask could only have narrowed it; make it exact
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fd = -1
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # fails when it exists: the first process to create it wins
        except FileExistsError:
            return False
        return True
    finally:
        if fd != -1:
            os.close(fd)
        tmp.unlink(missing_ok=True)


def read_secret_file(path: Path) -> str:
    """The stripped content of a secret file, narrowing its mode to 0600 first if an older version of the
    platform left it readable by others."""
    st = path.stat()
    if st.st_mode & 0o077 and st.st_uid == os.getuid():
        os.chmod(path, SECRET_FILE_MODE)
    return path.read_text(encoding="utf-8").strip()
