"""The job stream (`GET /v1/jobs/{id}/stream`): every row of a job once, its own id on each message, exact
resumption after any id, `end` only after the last row, reads by cursor."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from client.sdk import sse_messages
from scheduler.db.models import Checkpoint, JobEvent, LogLine, Metric, Prediction, Rollout
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.stream import BATCH, StreamCursor, read_after
from tests.factories import grpo_spec

#: The stream's kinds that are rows, and the table of each.
ROW_KINDS = {
    "event": JobEvent,
    "metric": Metric,
    "log": LogLine,
    "checkpoint": Checkpoint,
    "rollout": Rollout,
    "prediction": Prediction,
}


def _add_rows(db, job_id: str, *, metrics: int, logs: int, first_step: int = 0) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    with db.session() as s:
        if metrics:
            s.execute(
                sa.insert(Metric),
                [
                    {
                        "job_id": job_id,
                        "attempt": 1,
                        "step": first_step + i // 10,
                        "name": f"m/{i % 10}",
                        "value": float(i),
                        "time": now,
                    }
                    for i in range(metrics)
                ],
            )
        if logs:
            s.execute(
                sa.insert(LogLine),
                [
                    {
                        "job_id": job_id,
                        "attempt": 1,
                        "time": now,
                        "level": "INFO",
                        "source": "driver",
                        "message": f"line {i}",
                    }
                    for i in range(logs)
                ],
            )
        step = first_step
        s.add(
            Checkpoint(
                job_id=job_id, attempt=1, step=step, path=f"/c/{step}", size_bytes=1, format="torch", time=now
            )
        )
        s.add(
            Rollout(
                job_id=job_id,
                attempt=1,
                rollout_id=step,
                split="train",
                path=f"/r/{step}",
                num_samples=4,
                time=now,
            )
        )
        s.add(Prediction(job_id=job_id, attempt=1, step=step, path=f"/p/{step}", num_samples=2, time=now))
        s.add(JobEvent(job_id=job_id, kind="driver", reason=f"rows of step {step}"))


def _read(
    client, job_id: str, headers: dict[str, str] | None = None, params: dict[str, str] | None = None
) -> list[tuple[str, str | None, Any]]:  # type: ignore[no-untyped-def]
    """(kind, id, data) of every message, `end` included."""
    with client.stream("GET", f"/v1/jobs/{job_id}/stream", headers=headers or {}, params=params) as r:
        assert r.status_code == 200
        return list(sse_messages(r.iter_lines()))


def _rows(messages: list[tuple[str, str | None, Any]]) -> list[tuple[str, int]]:
    return [(kind, data["id"]) for kind, _, data in messages if kind in ROW_KINDS]


def _stored(db, job_id: str) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    with db.session(read_only=True) as s:
        return {
            kind: list(s.scalars(sa.select(t.id).where(t.job_id == job_id).order_by(t.id)))
            for kind, t in ROW_KINDS.items()
        }


def _by_kind(rows: list[tuple[str, int]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {kind: [] for kind in ROW_KINDS}
    for kind, row_id in rows:
        out[kind].append(row_id)
    return out


def test_a_finished_job_streams_every_row_once_and_resumes_after_any_id(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    db = client.app.state.db
    job = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()
    _add_rows(db, job["id"], metrics=12_000, logs=2_500)
    client.post(f"/v1/jobs/{job['id']}/cancel")
    assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "CANCELLED"

    full = _read(client, job["id"])
    stored = _stored(db, job["id"])
    assert len(stored["metric"]) == 12_000 and len(stored["log"]) == 2_500
    # everything, each once, in id order per kind; the job as it ended first; `end` last and only once
    assert _by_kind(_rows(full)) == stored
    assert full[0][0] == "status" and full[0][2]["status"] == "CANCELLED"
    assert [k for k, _, _ in full].count("end") == 1 and full[-1][0] == "end"
    # every message but `end` has its own id, and the id names the position after it
    ids = [i for k, i, _ in full if k != "end"]
    assert None not in ids and len(set(ids)) == len(ids)
    for kind, msg_id, data in full:
        if kind in ROW_KINDS:
            key = next(k for k, (name) in zip("emlcrp", ROW_KINDS, strict=True) if name == kind)
            assert StreamCursor.parse(msg_id).positions[key] == data["id"]

    # resuming after any message gives exactly what followed it (each kind in order; how kinds interleave
    # depends on where the polls' batches fall)
    rows = [(k, i, d) for k, i, d in full if k != "end"]
    for n in (0, 1, 9_999, 12_001, len(rows) - 2, len(rows) - 1):
        again = _read(client, job["id"], {"Last-Event-ID": rows[n][1]})
        assert _by_kind(_rows(again)) == _by_kind(_rows(rows[n + 1 :])), n
        assert again[-1][0] == "end"
    # the query parameter does the same, and wins over the header
    n = 5_000
    again = _read(client, job["id"], {"Last-Event-ID": rows[0][1]}, {"after": rows[n][1]})
    assert _by_kind(_rows(again)) == _by_kind(_rows(rows[n + 1 :]))
    # after the last message: nothing but the end (the status is the one already sent)
    assert [k for k, _, _ in _read(client, job["id"], {"Last-Event-ID": rows[-1][1]})] == ["end"]


def test_a_running_job_streams_rows_as_they_come_and_ends_after_the_last(api) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = api
    db = client.app.state.db
    job = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()

    def run() -> None:  # a driver's reports, then the job's end
        for step in range(0, 60, 6):
            _add_rows(db, job["id"], metrics=1_100, logs=40, first_step=step)
            time.sleep(0.05)
        with db.session() as s:
            svc = JobLifecycle(s)
            svc.transition(job["id"], "CANCELLED", expected_from="QUEUED", reason="test: the end")

    writer = threading.Thread(target=run)
    writer.start()
    try:
        got = _read(client, job["id"])
    finally:
        writer.join()
    stored = _stored(db, job["id"])
    assert len(stored["metric"]) == 11_000
    assert _by_kind(_rows(got)) == stored
    assert got[-1][0] == "end"
    statuses = [d["status"] for k, _, d in got if k == "status"]
    assert statuses[0] == "QUEUED" and statuses[-1] == "CANCELLED"
    transitions = [d["to_status"] for k, _, d in got if k == "event" and d["kind"] == "transition"]
    assert transitions[-1] == "CANCELLED"


def test_reads_are_by_cursor_and_batched(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    db = client.app.state.db
    job = client.post("/v1/jobs", json={"spec": grpo_spec()}).json()
    _add_rows(db, job["id"], metrics=BATCH + 5, logs=3)
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append(statement)

    cursor = StreamCursor()
    sa.event.listen(db.engine, "before_cursor_execute", record)
    try:
        with db.session(read_only=True) as s:
            first = read_after(s, job["id"], cursor)
            assert not first.drained
            for _, key, row in first.rows:
                cursor.positions[key] = row.id
            second = read_after(s, job["id"], cursor)
            assert second.drained
            assert [k for k, _, _ in second.rows] == ["metric"] * 5
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", record)
    assert len(statements) == 12  # one a source a poll
    for sql in statements:
        flat = " ".join(sql.split())
        assert ".id > " in flat and "ORDER BY" in flat and "LIMIT" in flat, flat
