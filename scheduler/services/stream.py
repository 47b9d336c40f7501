"""Reads for a job's live stream (`GET /v1/jobs/{id}/stream`): every source read by cursor, never re-read.

A stream position is one cursor per source (the last row id delivered of events, metrics, log lines,
checkpoints, rollouts, predictions) plus a token of the last job snapshot sent. It is written into every SSE
message's `id` as `e<id>.m<id>.l<id>.c<id>.r<id>.p<id>.s<token>`, so resuming after any message is exact:
each source is read again with `WHERE job_id = :job AND id > :cursor ORDER BY id LIMIT :batch`.

Why ids of one job only grow in the order they become visible: every writer of a running job's rows holds the
job's row first (a report's compare-and-set of `report_seq`, a transition's compare-and-set of `status`), so
a job's rows commit one writer after another; the rows written when a run ends (Ray's log tail, the reconciled
checkpoints, the spool's reports) are committed before, or with, the job's terminal transition.

When the stream ends: a poll that reads the job in a terminal status first, then reads every source to its
end (each read shorter than its batch), has read every row the job will have (reports are accepted only while
the job is on the cluster; a job is SUCCEEDED only once its driver's final report is stored). Only then is
`end` sent, so it never cuts data off."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler.db.models import (
    BIGINT_MAX,
    Checkpoint,
    Job,
    JobEvent,
    LogLine,
    Metric,
    Prediction,
    Rollout,
)

#: The sources of a stream in the order a poll reads and sends them: (id letter, SSE event name, table).
SOURCES: tuple[tuple[str, str, type[Any]], ...] = (
    ("e", "event", JobEvent),
    ("m", "metric", Metric),
    ("l", "log", LogLine),
    ("c", "checkpoint", Checkpoint),
    ("r", "rollout", Rollout),
    ("p", "prediction", Prediction),
)
#: The letter of the job snapshot's token in an id.
STATUS_KEY = "s"
#: Rows read of one source in one poll. A poll that reads a full batch of any source is followed by the
#: next at once; a short one means the source is read to its end.
BATCH = 1000
#: An id is at most this long (seven parts of at most 19 digits and their letters and dots).
MAX_ID_LENGTH = 200


@dataclass
class StreamCursor:
    """Where a subscriber is: the last row id delivered of each source and the last snapshot's token."""

    positions: dict[str, int] = field(default_factory=lambda: {key: 0 for key, _, _ in SOURCES})
    status: int = 0

    @classmethod
    def parse(cls, text: str | None) -> StreamCursor:
        """The position an id names. A part missing or not understood counts as 0 (from the start), so an
        empty or foreign id streams everything; an id of the older format (without `s`) resends the status."""
        cursor = cls()
        for part in (text or "")[:MAX_ID_LENGTH].split("."):
            key, digits = part[:1], part[1:]
            if not (digits.isascii() and digits.isdigit()) or int(digits) > BIGINT_MAX:
                continue
            if key in cursor.positions:
                cursor.positions[key] = int(digits)
            elif key == STATUS_KEY:
                cursor.status = int(digits)
        return cursor

    def format(self) -> str:
        parts = [f"{key}{self.positions[key]}" for key, _, _ in SOURCES]
        return ".".join([*parts, f"{STATUS_KEY}{self.status}"])


def status_token(job: Job) -> int:
    """A token of what a `status` message shows: it changes when the status, the progress or anything else
    of the job row changes (`updated_at` moves with every write), or a queued job's place or reason (its
    `JobWait`, written apart from the row), and is the same in every API process."""
    key = (
        f"{job.status}|{job.progress_step}|{job.total_steps}|{job.updated_at.isoformat()}"
        f"|{job.queue_position}|{job.wait_reason}"
    )
    return zlib.crc32(key.encode())


@dataclass
class StreamBatch:
    """One poll's rows in the order they are sent: (SSE event name, id letter, row)."""

    rows: list[tuple[str, str, Any]]
    #: every source was read to its end
    drained: bool


def read_after(
    session: Session,
    job_id: str,
    cursor: StreamCursor,
    *,
    kinds: frozenset[str] | None = None,
    batch: int = BATCH,
) -> StreamBatch:
    """The rows of every source (of `kinds`, when given) after the cursor, at most `batch` of each, oldest
    first. The cursor is not moved: the caller moves it as it sends each row."""
    rows: list[tuple[str, str, Any]] = []
    drained = True
    for key, kind, table in SOURCES:
        if kinds is not None and kind not in kinds:
            continue
        # Core rows (attribute access, as the ORM's): a stream only reads, and loading ORM objects was half
        # of a poll's time
        columns = table.__table__.c
        found: Sequence[Any] = session.execute(
            sa.select(columns)
            .where(columns.job_id == job_id, columns.id > cursor.positions[key])
            .order_by(columns.id)
            .limit(batch)
        ).all()
        rows.extend((kind, key, row) for row in found)
        drained = drained and len(found) < batch
    return StreamBatch(rows=rows, drained=drained)


@dataclass
class StreamPoll:
    """What one poll found: the job's snapshot when it changed, the rows to send, whether the stream ends."""

    status: Job | None
    rows: list[tuple[str, str, Any]]
    #: every source was read to its end (else the next poll should come at once)
    drained: bool
    #: the job is terminal and every row of it is in `rows` or was sent before: send `end` after them
    ended: bool


class JobStream:
    """One subscriber's stream: its cursor, and when its next poll needs to read the job's rows.

    A job's rows are written with a write of its row (a report moves `report_seq`, a transition `status`;
    `updated_at` moves with both), so while the job row is as it was at a poll that read every source to its
    end, nothing new is there to read: such a poll reads the job row alone. Rows written without the job's
    (checkpoint records reconciled with the disk) are read by the full read every `full_read_every` polls."""

    def __init__(
        self,
        cursor: StreamCursor,
        *,
        kinds: frozenset[str] | None = None,
        batch: int = BATCH,
        full_read_every: int = 10,
    ) -> None:
        self.cursor, self.kinds, self.batch, self.full_read_every = cursor, kinds, batch, full_read_every
        self._read_to_end_at: int | None = None  # the job's token at the last poll that read every source
        self._skipped = 0

    def poll(self, session: Session, job: Job) -> StreamPoll:
        """Read what is new for the job (already loaded, by the caller, in this session: before the rows, so a
        terminal status read here means every row is there). The cursor's status moves here; its row
        positions are the caller's to move as it sends each row."""
        token = status_token(job)
        terminal = job.status.is_terminal()
        status = None
        if token != self.cursor.status:
            self.cursor.status = token
            status = job
        if token == self._read_to_end_at and not terminal and self._skipped + 1 < self.full_read_every:
            self._skipped += 1
            return StreamPoll(status=status, rows=[], drained=True, ended=False)
        batch = read_after(session, job.id, self.cursor, kinds=self.kinds, batch=self.batch)
        self._skipped = 0
        self._read_to_end_at = token if batch.drained else None
        return StreamPoll(
            status=status, rows=batch.rows, drained=batch.drained, ended=terminal and batch.drained
        )
