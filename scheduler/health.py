"""Heartbeats of the platform's processes and the readiness they add up to (`GET /readyz`).

- Each Celery worker records a heartbeat every `heartbeat_seconds` (a thread started when the worker is
  ready); each beat tick, when a worker runs it, records the tick. Both are rows of `scheduler_locks` named
  `heartbeat:…` (holder: who, acquired_at: when), so no schema change was needed.
- The embedded platform's supervisor (api/embedded.py) writes the state of every process it runs to a JSON
  file named by `RELAX_SUPERVISOR_STATE` in the API's environment; a part it reports down is down at once.

`readiness()` judges: the database (a query), the broker (a connection), the workers (the newest heartbeat
younger than `max(5 x heartbeat_seconds, 10 s)`), the beat (a tick younger than `max(5 x tick_seconds, 10
s)`), and under the supervisor each of its parts (Ray head, worker, beat, API) — a restarted worker or beat
counts as up only once it heartbeats or ticks again. Without a supervisor, a worker or beat that never
reported is not judged (an API started before its workers is ready); one that stopped reporting is down.
Docs: docs/reliability.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from runtime.redaction import redact
from scheduler.db.engine import Database
from scheduler.db.models import SchedulerLock, utcnow
from scheduler.settings import Settings

log = logging.getLogger(__name__)

WORKER_PREFIX = "heartbeat:worker:"
TICK = "heartbeat:tick"
SUPERVISOR_STATE_ENV = "RELAX_SUPERVISOR_STATE"


def worker_row(nodename: str) -> str:
    """The heartbeat row of one worker (row names are at most 40 characters)."""
    return WORKER_PREFIX + hashlib.sha1(nodename.encode()).hexdigest()[:16]


def record(db: Database, name: str, holder: str) -> None:
    """Set heartbeat row `name` to now (created on first use)."""
    now = utcnow()
    with db.session() as s:
        moved = s.execute(
            sa.update(SchedulerLock)
            .where(SchedulerLock.name == name)
            .values(holder=holder[:100], acquired_at=now)
        )
        if moved.rowcount:
            return
    try:
        with db.session() as s:
            s.add(SchedulerLock(name=name, holder=holder[:100], acquired_at=now))
    except sa.exc.IntegrityError:  # another process created it meanwhile: its beat counts as well
        pass


class WorkerHeartbeat:
    """A daemon thread recording this worker's heartbeat every `interval` seconds until stopped."""

    def __init__(self, db: Database, nodename: str, interval: float) -> None:
        self.db, self.interval = db, interval
        self.name = worker_row(nodename)
        self.holder = f"{nodename} pid {os.getpid()}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relax-worker-heartbeat", daemon=True)

    def start(self) -> WorkerHeartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                record(self.db, self.name, self.holder)
            except Exception:  # noqa: BLE001 - the database is briefly unavailable: the next beat retries
                log.warning("worker heartbeat not recorded", exc_info=True)
            self._stop.wait(self.interval)


@dataclass
class Part:
    ok: bool | None  # None: not judged (never seen, nothing to compare with)
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail}


@dataclass
class Readiness:
    parts: dict[str, Part] = field(default_factory=dict)

    @property
    def down(self) -> list[str]:
        return [name for name, p in self.parts.items() if p.ok is False]

    @property
    def ready(self) -> bool:
        return not self.down


def _age(t: datetime | None, now: datetime) -> float | None:
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return max(0.0, (now - t).total_seconds())


def _since(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, UTC) if ts else None


def read_supervisor_state(path: str | Path | None) -> dict[str, Any] | None:
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def readiness(settings: Settings, db: Database, *, supervisor_state: str | Path | None = None) -> Readiness:
    """Judge every part of the platform (see the module's docstring)."""
    r = Readiness()
    now = utcnow()
    worker_stale = max(5 * settings.scheduler.heartbeat_seconds, 10.0)
    tick_stale = max(5 * settings.scheduler.tick_seconds, 10.0)
    workers: list[tuple[str | None, datetime | None]] = []
    tick: tuple[str | None, datetime | None] | None = None
    try:
        with db.session(read_only=True) as s:
            s.execute(sa.text("SELECT 1"))
            rows = s.execute(
                sa.select(SchedulerLock.name, SchedulerLock.holder, SchedulerLock.acquired_at).where(
                    SchedulerLock.name.like("heartbeat:%")
                )
            ).all()
        r.parts["database"] = Part(True, db.dialect)
        for name, holder, at in rows:
            if name.startswith(WORKER_PREFIX):
                workers.append((holder, at))
            elif name == TICK:
                tick = (holder, at)
    except Exception as err:  # noqa: BLE001 - any failure of the database is its being down
        r.parts["database"] = Part(False, f"{type(err).__name__}: {err}"[:300])
    r.parts["broker"] = _broker(settings)

    state = read_supervisor_state(supervisor_state)
    sup_parts: dict[str, Any] = (state or {}).get("parts", {}) if state else {}
    if state is not None:
        age = time.time() - float(state.get("updated_at", 0))
        r.parts["supervisor"] = (
            Part(True, f"pid {state.get('pid')}")
            if age < 10
            else Part(False, f"pid {state.get('pid')} has not updated its state for {age:.0f}s")
        )

    # Workers: the newest heartbeat.
    newest_holder, newest = max(
        workers, key=lambda w: w[1] or datetime.min.replace(tzinfo=UTC), default=(None, None)
    )
    r.parts["worker"] = _judge_signal(
        "worker",
        sup_parts.get("worker"),
        newest,
        now,
        stale=worker_stale,
        none=("no worker heartbeat yet", "no worker has recorded a heartbeat yet"),
        old=f"no worker heartbeat for {{age:.0f}}s (last: {newest_holder})",
        restarted="the worker was restarted and has not recorded a heartbeat yet",
        fresh=f"heartbeat {{age:.1f}}s ago ({newest_holder})",
    )

    # Beat: the last tick a worker ran.
    r.parts["beat"] = _judge_signal(
        "beat",
        sup_parts.get("beat"),
        tick[1] if tick else None,
        now,
        stale=tick_stale,
        none=("no tick yet", "no tick yet"),
        old="no tick ran for {age:.0f}s (a beat or a worker is down)",
        restarted="the beat was restarted and no tick has run since",
        fresh="last tick {age:.1f}s ago",
    )

    # The rest of the supervisor's parts (the Ray head, the API itself).
    for name, part in sup_parts.items():
        if name in ("worker", "beat"):
            continue
        ok = part.get("state") == "running"
        r.parts[name] = Part(ok, _sup_detail(name, part) if not ok else part.get("detail") or "running")
    return r


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _sup_detail(name: str, part: dict[str, Any]) -> str:
    detail = part.get("detail") or ""
    return f"{name} is {part.get('state')}" + (f": {detail}" if detail else "")


def _broker(settings: Settings) -> Part:
    """Whether the Celery broker takes a connection (2 s at most)."""
    url = settings.broker_url
    try:
        if url.startswith("sqla+sqlite:///"):
            path = Path(url.removeprefix("sqla+sqlite:///"))
            if not path.exists():  # created by the first worker, beat or API that connects
                return Part(None, "the embedded broker's database is not created yet")
            import sqlite3

            with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2) as conn:
                conn.execute("SELECT 1")
            return Part(True, "embedded (SQLite)")
        from kombu import Connection

        with Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return Part(True, url.split("://", 1)[0])
    except Exception as err:  # noqa: BLE001 - any failure to connect is the broker being down
        return Part(False, redact(f"{type(err).__name__}: {err}")[:300])


def _judge_signal(
    name: str,
    supervised: dict[str, Any] | None,
    signal_at: datetime | None,
    now: datetime,
    *,
    stale: float,
    none: tuple[str, str],
    old: str,
    restarted: str,
    fresh: str,
) -> Part:
    """A part judged by its last signal (the worker's heartbeat, the beat's tick): down while its supervised
    process is not running, or with no signal yet (unknown when no supervisor watches it: `none` is (down,
    unknown) detail), or a signal older than `stale` seconds, or none since the supervisor restarted it;
    else up. `old` and `fresh` are formatted with `age` (seconds)."""
    age = _age(signal_at, now)
    if supervised is not None and supervised.get("state") != "running":
        return Part(False, _sup_detail(name, supervised))
    if age is None:
        return Part(False, none[0]) if supervised is not None else Part(None, none[1])
    if age > stale:
        return Part(False, old.format(age=age))
    since = _since(supervised.get("since")) if supervised is not None else None
    if since and signal_at and _aware(signal_at) < since:
        return Part(False, restarted)
    return Part(True, fresh.format(age=age))
