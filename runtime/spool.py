"""The driver's report spool: every numbered report on disk until the platform has acknowledged it.

Layout: `<job output dir>/.relax/reports/attempt-<N>/seg-<first seq, 12 digits>.jsonl`, one report per
line, each line `<mac> <report as JSON>`, where mac = HMAC-SHA256(spool key, the JSON's bytes) and the spool
key is HMAC(attempt's token, "report-spool/v1"). Only the holder of the attempt's token (its driver) can
write a line the platform accepts, so a report read from the spool is as trustworthy as one sent over
HTTP with the token, and anyone else who can write the job's folder (other jobs run as the same OS user)
cannot forge one. Appends are flushed and fsynced before the report counts as spooled; a segment is
deleted once every report in it was acknowledged. A line cut short by a crash ends its segment (it was
never acknowledged, nor fsynced).

Both sides use this module: the driver's reporter (`runtime/reporter.py`) appends and delivers; the
platform's reconciler reads what an ended driver left (`scheduler/services/reports.py::collect_spool`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPOOL_PURPOSE = "report-spool/v1"
SPOOL_SUBDIR = Path(".relax") / "reports"
SEGMENT_PREFIX, SEGMENT_SUFFIX = "seg-", ".jsonl"
DEFAULT_SEGMENT_BYTES = 4 * 1024 * 1024

log = logging.getLogger("runtime.reporter.spool")  # runtime.reporter.*: never forwarded into reports


def spool_key(token: str) -> bytes:
    """The key that signs an attempt's spool lines, derived from its token (the token itself is never
    written anywhere)."""
    return hmac.new(token.encode(), SPOOL_PURPOSE.encode(), hashlib.sha256).digest()


def spool_dir(output_dir: str | Path, attempt: int) -> Path:
    """Where attempt `attempt` of the job whose folder is `output_dir` spools its reports."""
    return Path(output_dir) / SPOOL_SUBDIR / f"attempt-{int(attempt)}"


def seal(key: bytes, payload: dict[str, Any]) -> str:
    """One spool line (without its newline)."""
    body = json.dumps(payload, separators=(",", ":"), allow_nan=True)
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest() + " " + body


def unseal(key: bytes, line: str) -> dict[str, Any] | None:
    """The report of a spool line, or None when its MAC is wrong or the line is cut short."""
    mac, _, body = line.rstrip("\n").partition(" ")
    expected = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, expected):
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) and isinstance(payload.get("seq"), int) else None


def _segments(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    found = [
        p
        for p in directory.iterdir()
        if p.name.startswith(SEGMENT_PREFIX) and p.name.endswith(SEGMENT_SUFFIX) and not p.is_symlink()
    ]
    return sorted(found, key=lambda p: p.name)


@dataclass(frozen=True)
class SpooledReport:
    seq: int
    payload: dict[str, Any] | None  # None: the line's MAC did not verify (or it was cut short)


def read_spool(directory: str | Path, key: bytes) -> Iterator[SpooledReport]:
    """Every report in a spool folder, in sequence order (the platform's side). A line that does not
    verify is yielded with `payload=None` and ends its segment."""
    for segment in _segments(Path(directory)):
        try:
            with segment.open("r", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if not line.endswith("\n"):
                        break  # cut short by a crash: never fsynced, never acknowledged
                    payload = unseal(key, line)
                    if payload is None:
                        yield SpooledReport(-1, None)
                        break
                    yield SpooledReport(int(payload["seq"]), payload)
        except OSError as exc:
            log.warning("cannot read report spool segment %s: %s", segment, exc)
            return


class MemoryQueue:
    """Numbered reports waiting for acknowledgement, in memory (standalone runs, and a driver's first
    seconds before it knows its job's folder)."""

    def __init__(self) -> None:
        self._items: deque[tuple[int, dict[str, Any], int]] = deque()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def location(self) -> str | None:
        return None

    def append(self, payload: dict[str, Any]) -> None:
        size = len(json.dumps(payload, separators=(",", ":")))
        with self._lock:
            self._items.append((int(payload["seq"]), payload, size))
            self._bytes += size

    def peek(self) -> dict[str, Any] | None:
        with self._lock:
            return self._items[0][1] if self._items else None

    def ack(self, seq: int) -> None:
        """Drop every report up to and including `seq`."""
        with self._lock:
            while self._items and self._items[0][0] <= seq:
                self._bytes -= self._items.popleft()[2]

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return [p for _, p, _ in self._items]

    def drain(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        pass


class DiskSpool:
    """Numbered reports waiting for acknowledgement, on disk (see the module's docstring).

    One writer (the reporter's cutter thread appends) and one reader (its sender peeks and acknowledges),
    serialized by the reporter; `bytes` counts the segments still on disk. The folder starts empty (one
    driver per attempt); what a crashed driver left is read with `read_spool`."""

    def __init__(
        self, directory: str | Path, key: bytes, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES
    ) -> None:
        self.directory = Path(directory)
        self.key = key
        self.segment_bytes = segment_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._pending: deque[tuple[int, Path, int]] = deque()  # (seq, segment, offset of its line)
        self._segments: dict[Path, list[int]] = {}  # segment -> [size, last seq]
        self._writer: Any = None
        self._writer_path: Path | None = None

    @property
    def location(self) -> str:
        return str(self.directory)

    def append(self, payload: dict[str, Any]) -> None:
        """Write one report and fsync it; raises OSError (the caller keeps the report and retries)."""
        line = (seal(self.key, payload) + "\n").encode()
        seq = int(payload["seq"])
        with self._lock:
            if self._writer is None or self._segments[self._writer_path][0] >= self.segment_bytes:  # type: ignore[index]
                self._rotate(seq)
            assert self._writer is not None and self._writer_path is not None
            offset = self._segments[self._writer_path][0]
            try:
                self._writer.write(line)
                self._writer.flush()
                os.fsync(self._writer.fileno())
            except OSError:
                self._writer.truncate(offset)  # no half line stays behind
                raise
            self._segments[self._writer_path] = [offset + len(line), seq]
            self._pending.append((seq, self._writer_path, offset))

    def _rotate(self, seq: int) -> None:
        if self._writer is not None:
            self._writer.close()
        path = self.directory / f"{SEGMENT_PREFIX}{seq:012d}{SEGMENT_SUFFIX}"
        self._writer = path.open("ab")
        self._writer_path = path
        self._segments[path] = [path.stat().st_size, seq - 1]
        _fsync_dir(self.directory)

    def peek(self) -> dict[str, Any] | None:
        with self._lock:
            if not self._pending:
                return None
            seq, segment, offset = self._pending[0]
        with segment.open("rb") as fh:
            fh.seek(offset)
            payload = unseal(self.key, fh.readline().decode("utf-8", errors="replace"))
        if payload is None or payload["seq"] != seq:
            raise OSError(f"report seq {seq} in {segment} no longer reads back")
        return payload

    def ack(self, seq: int) -> None:
        """Drop every report up to and including `seq`; delete the segments that held only those."""
        with self._lock:
            while self._pending and self._pending[0][0] <= seq:
                self._pending.popleft()
            still = {segment for _, segment, _ in self._pending}
            for segment in [s for s in self._segments if s not in still and s != self._writer_path]:
                segment.unlink(missing_ok=True)
                del self._segments[segment]
            if not self._pending and self._writer_path is not None and self._writer is not None:
                # the writer's segment too: the next append opens a fresh one
                self._writer.close()
                self._writer = None
                self._writer_path.unlink(missing_ok=True)
                self._segments.pop(self._writer_path, None)
                self._writer_path = None

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(size for size, _ in self._segments.values())

    def __len__(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        """Close the open segment; remove the folder when nothing is left in it."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            if not self._pending:
                for segment in list(self._segments):
                    segment.unlink(missing_ok=True)
                self._segments.clear()
                for folder in (self.directory, self.directory.parent, self.directory.parent.parent):
                    try:
                        folder.rmdir()  # only when empty: `.relax/reports/` goes with its last attempt
                    except OSError:
                        break


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
