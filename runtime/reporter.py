"""How the driver reports to the platform (HTTP) or to the console and JSONL (standalone), never raising into
training and, with a spool on disk (`runtime/spool.py`), never losing a report the platform has not
acknowledged."""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

import httpx

from runtime.redaction import redact
from runtime.report_protocol import (  # Phase, EventKind, RolloutSplit: imported from here by the pipeline
    REPORT_LISTS,
    CheckpointItem,
    EventItem,
    EventKind,
    Grant,
    LogItem,
    MetricItem,
    Phase,
    PredictionItem,
    Progress,
    RolloutItem,
    RolloutSplit,
    RolloutWish,
)
from runtime.spool import DiskSpool, MemoryQueue, spool_key
from runtime.train.checkpoint import CheckpointRecord

# The reporter's own trouble goes to stderr only: forwarding it through the reporter would loop.
_internal = logging.getLogger("runtime.reporter.internal")
_internal.propagate = False
if not _internal.handlers:
    _internal.addHandler(logging.StreamHandler(sys.stderr))
    _internal.setLevel(logging.WARNING)

MAX_ITEMS_PER_REPORT = 1000  # per list, keeps request bodies small after an outage
MAX_PENDING_LOGS = 20_000  # beyond this the oldest log lines are dropped (metrics never are)
MAX_PENDING_ITEMS = 200_000  # other items waiting for room in a full spool: past this, their producer waits
DEFAULT_SPOOL_MAX_BYTES = 256 * 1024 * 1024
SPOOL_MAX_BYTES_ENV = "RELAX_REPORT_SPOOL_MAX_BYTES"


@dataclass
class _Pending:
    # a report's lists by name (REPORT_LISTS), each of its item type (runtime/report_protocol.py)
    lists: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in REPORT_LISTS})
    phase: str | None = None
    wish: RolloutWish | None = None  # an elastic job's latest wish (`Reporter.rollout_wish`)
    followed: int | None = None  # the grant its engines match now (`Reporter.rollout_followed`)
    dropped_logs: int = 0
    final: EventItem | None = None  # the end-of-run marker: goes out last, in the last report

    def empty(self) -> bool:
        return (
            self.phase is None
            and self.wish is None
            and self.followed is None
            and self.final is None
            and not any(self.lists.values())
        )

    def count(self) -> int:
        return sum(len(items) for kind, items in self.lists.items() if kind != "logs")


class MetricSink(Protocol):
    """Where else metric points go (runtime/trackers.py); it must not raise."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...


class ReportRefused(RuntimeError):
    """The platform will never take this attempt's reports (the attempt ended, or the token is not its)."""


def _env_number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


class Reporter(ABC):
    """Collects report items from any thread; two background threads number and deliver them.

    The *cutter* moves what is pending into one report (at most MAX_ITEMS_PER_REPORT per list) with the
    next sequence number every ~`flush_interval` s (at once on `flush`, `set_phase` and `close`) and appends
    it to the queue: on disk (`runtime/spool.py`, once `attach_spool` named the folder) or in memory. The
    *sender* delivers the queue's head, resending it unchanged (same seq) with exponential backoff until it
    is acknowledged, then drops it (on disk: deletes its segment). With nothing queued, a heartbeat (an
    empty report) goes out every `heartbeat_interval` s: its answer is how the platform asks the driver to
    stop. So an unreachable platform never stops training: reports pile up in the queue.

    The bound: while the queue holds `spool_max_bytes` (default 256 MiB, `$RELAX_REPORT_SPOOL_MAX_BYTES`)
    nothing more is cut; items wait in memory, and once `max_pending_items` metrics, checkpoints, rollouts,
    predictions and events wait, the call that adds one waits for room (training pauses, and a log line
    says for how long). Log lines never wait: past MAX_PENDING_LOGS the oldest are dropped and a log line
    says how many. Nothing is dropped silently. `close(final=...)` ends the run with a `final_report` event
    in the very last report: the platform marks a job SUCCEEDED only once that report is stored.
    """

    def __init__(
        self,
        *,
        attempt: int = 0,
        flush_interval: float = 1.0,
        heartbeat_interval: float = 5.0,
        max_backoff: float = 10.0,
        spool_max_bytes: int | None = None,
        max_pending_items: int = MAX_PENDING_ITEMS,
    ) -> None:
        self.attempt = attempt
        self.flush_interval = flush_interval
        self.heartbeat_interval = heartbeat_interval
        self.max_backoff = max_backoff
        self.spool_max_bytes = int(
            spool_max_bytes
            if spool_max_bytes is not None
            else _env_number(SPOOL_MAX_BYTES_ENV, DEFAULT_SPOOL_MAX_BYTES)
        )
        self.max_pending_items = max_pending_items
        self._cond = threading.Condition()
        self._qlock = threading.Lock()  # the queue: appends, peeks, acknowledgements, the swap to disk
        self._queue: MemoryQueue | DiskSpool = MemoryQueue()
        self._pending = _Pending()
        self._unwritten: list[dict[str, Any]] = []  # numbered, not yet in the queue (a write failed)
        self._progress: Progress | None = None
        self._seq = 0
        self._last_sent = 0.0
        self._flush_now = False
        self._hurry = False  # flush()/close(): retry now instead of after the backoff
        self._closing = False  # close() began: no new items; everything pending is cut
        self._closed = False  # close() ended: the threads leave
        self._abandoned = False  # close() gave up on what is left
        self._refused: str | None = None
        self._stop = threading.Event()
        self.sent_reports = 0
        self.failed_sends = 0
        self.blocked_seconds = 0.0  # how long producers waited for room in a full spool
        self.late_items = 0  # added after close() began: not sent
        self.spool_full = False
        self._persist_requests = 0  # persist(): cuts asked for ...
        self._persisted = 0  # ... and how many of them are written (the cut that served them is in the queue)
        self._durable_step: int | None = None  # durable_through(): persist at the metrics of this step
        self._sinks: list[MetricSink] = []  # add_sink(): experiment trackers (runtime/trackers.py)
        # an elastic job's rollout engines as the platform's last answer granted them (`grant`)
        self._grant: Grant | None = None
        self._cutter = threading.Thread(
            target=self._cut_loop, name=f"{type(self).__name__}-cutter", daemon=True
        )
        self._sender = threading.Thread(
            target=self._send_loop, name=f"{type(self).__name__}-sender", daemon=True
        )
        self._cutter.start()
        self._sender.start()

    # -- what the driver calls ---------------------------------------------------------------------------
    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    @property
    def refused(self) -> str | None:
        """Why the platform refuses this attempt's reports for good (None while it takes them)."""
        return self._refused

    @property
    def spool_location(self) -> str | None:
        return self._queue.location

    @property
    def unsent_reports(self) -> int:
        return len(self._queue) + len(self._unwritten)

    @property
    def grant(self) -> Grant | None:
        """An elastic job's rollout engines as the scheduling pass allocated them, in the platform's latest
        answer: the Ray node id of each (None: a node known by hostname only), and the grant's number. None until
        an answer has carried them (always, for a standalone run or a job whose rollout is not elastic). The
        driver follows them between steps (`runtime.roles.elastic`), then reports the number (`rollout_followed`)."""
        return self._grant

    @property
    def granted_engines(self) -> tuple[str | None, ...] | None:
        """`grant`'s engines."""
        grant = self._grant
        return None if grant is None else grant.engines

    def request_stop(self) -> None:
        """Mark a stop as requested from this side (e.g. on SIGTERM)."""
        self._stop.set()

    def add_sink(self, sink: MetricSink) -> None:
        """Also hand every metric point to `sink` (an experiment tracker), after it is queued for the platform."""
        self._sinks.append(sink)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        now = time.time()
        self._add(
            "metrics", [MetricItem(step=step, name=k, value=float(v), time=now) for k, v in values.items()]
        )
        for sink in self._sinks:
            sink.scalars(step, values)
        if values and self._durable_step is not None and step >= self._durable_step:
            self._durable_step = None
            self.persist()

    def durable_through(self, step: int) -> None:
        """A checkpoint of `step` is about to be written. Once it is on disk a resumed attempt starts after
        it, so nothing reported up to it may be lost with the driver: what is pending is persisted now, and
        the metrics of `step` itself (the loop reports a step after its save) as soon as they come. Without
        this a SIGKILL lost the ~1 s of points not yet cut before the checkpoint, for good (chaos trials)."""
        self._durable_step = step
        self.persist()

    def persist(self, timeout: float = 5.0) -> bool:
        """Cut what is pending into a report now and wait until it is written to the queue (to the spool
        on disk once `attach_spool` named it), not for the platform to take it. True when written within
        `timeout`; False when it could not be (the spool full or failing: items then wait as usual)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._closing or threading.current_thread() in (self._cutter, self._sender):
                return False
            self._persist_requests += 1
            want = self._persist_requests
            self._flush_now = True
            self._cond.notify_all()
            while self._persisted < want:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.spool_full or not self._cutter.is_alive():
                    return False
                self._cond.wait(min(remaining, 0.1))
        return True

    def log(self, level: str, message: str, *, source: str = "driver", when: float | None = None) -> None:
        item = LogItem(time=when or time.time(), level=level, source=source, message=redact(message))
        self._add("logs", [item])

    def checkpoint(self, record: CheckpointRecord) -> None:
        item = CheckpointItem(
            step=record.step,
            path=record.path,
            size_bytes=record.size_bytes,
            format=str(record.format),
            time=record.time,
        )
        self._add("checkpoints", [item])

    def rollout(self, rollout_id: int, split: RolloutSplit, path: str, num_samples: int) -> None:
        item = RolloutItem(rollout_id=rollout_id, split=str(split), path=path, num_samples=num_samples)
        self._add("rollouts", [item])

    def prediction(self, step: int, path: str, num_samples: int) -> None:
        """An SFT predictions file (`<save>/predict/predictions_step_<step>.jsonl`)."""
        item = PredictionItem(step=step, path=path, num_samples=num_samples, time=time.time())
        self._add("predictions", [item])

    def event(self, kind: EventKind, message: str = "") -> None:
        self._add("events", [EventItem(time=time.time(), kind=str(kind), message=redact(message))])

    def set_phase(self, phase: Phase) -> None:
        with self._cond:
            self._pending.phase = str(phase)
            self._flush_now = True
            self._cond.notify_all()

    def rollout_wish(self, wish: RolloutWish) -> None:
        """An elastic job's driver asks the scheduling pass for this many rollout engines (`runtime.roles.elastic`):
        goes out in the next report (a later wish before it replaces this one)."""
        with self._cond:
            if self._closing:
                self.late_items += 1
                return
            self._pending.wish = wish

    def rollout_followed(self, number: int) -> None:
        """An elastic job's engines match grant `number` now (`grant`): the platform frees the GPUs of the engines
        it took back before. Goes out in the next report."""
        with self._cond:
            if self._closing:
                self.late_items += 1
                return
            self._pending.followed = number

    def set_progress(self, step: int, total_steps: int) -> None:
        with self._cond:
            self._progress = Progress(step=step, total_steps=total_steps)

    def flush(self, timeout: float = 10.0) -> bool:
        """Send everything pending now; True if it all was acknowledged within `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._flush_now = True
            self._hurry = True
            self._cond.notify_all()
            while not self._drained():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._refused is not None or not self._sender.is_alive():
                    return False
                self._cond.wait(min(remaining, 0.1))
        return True

    def close(self, timeout: float = 30.0, *, final: str | None = None) -> bool:
        """Stop taking items, send everything (with `final`: the run's end marker, in the last report),
        waiting up to `timeout` s for the platform, then stop the threads. True if nothing was left unsent;
        otherwise what is left stays in the spool on disk (when there is one) for the platform to collect
        after the driver's Ray job has ended."""
        with self._cond:
            if final is not None and not self._closing:
                self._pending.final = EventItem(
                    time=time.time(), kind=str(EventKind.FINAL_REPORT), message=redact(final)
                )
            self._closing = True
            self._cond.notify_all()
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._abandoned = not done
            self._cond.notify_all()
        self._cutter.join(timeout=15.0)
        self._sender.join(timeout=15.0)
        with self._qlock:
            left, where = len(self._queue) + len(self._unwritten), self._queue.location
            self._queue.close()
        if not done:
            why = (
                f"the platform refused them ({self._refused})"
                if self._refused
                else f"{self.failed_sends} failed sends"
            )
            if where:
                _internal.warning(
                    "reporter closed with %d unsent reports (%s); they stay in the spool at %s, which the "
                    "platform collects once the driver's Ray job has ended",
                    left,
                    why,
                    where,
                )
            else:
                _internal.warning(
                    "reporter closed with %d unsent reports (%s) and no spool: they are lost", left, why
                )
        if self.late_items:
            _internal.warning("%d report items came after close() and were not sent", self.late_items)
        self._on_close()
        return done

    # -- the threads ---------------------------------------------------------------------------------------
    def _drained(self) -> bool:
        return self._pending.empty() and not self._unwritten and len(self._queue) == 0

    def _add(self, kind: str, items: list[Any]) -> None:
        with self._cond:
            if self._closing:
                self.late_items += len(items)
                return
            bucket = self._pending.lists[kind]
            if kind == "logs":
                bucket.extend(items)
                if len(bucket) > MAX_PENDING_LOGS:
                    excess = len(bucket) - MAX_PENDING_LOGS
                    del bucket[:excess]
                    self._pending.dropped_logs += excess
                return
            if self._pending.count() >= self.max_pending_items and self._may_wait():
                self._wait_for_room()
            self._pending.lists[kind].extend(items)  # not `bucket`: cutting replaced the list meanwhile

    def _may_wait(self) -> bool:
        return (
            threading.current_thread() not in (self._cutter, self._sender)
            and self._refused is None
            and not self._closing
            and self._cutter.is_alive()
            and self._sender.is_alive()
        )

    def _wait_for_room(self) -> None:
        """The spool is full and the items waiting to enter it hit their bound: wait (caller holds the lock)."""
        started = time.monotonic()
        _internal.warning(
            "report spool full (%.0f MiB at %s): waiting for the platform to take reports before going on",
            self._queue.bytes / 2**20,
            self._queue.location or "memory",
        )
        while self._pending.count() >= self.max_pending_items and self._may_wait():
            self._flush_now = True
            self._cond.notify_all()
            self._cond.wait(1.0)
        waited = time.monotonic() - started
        self.blocked_seconds += waited
        self._pending.lists["logs"].append(
            LogItem(
                time=time.time(),
                level="WARNING",
                source="reporter",
                message=f"the driver waited {waited:.1f}s for room in its report spool (full at "
                f"{self.spool_max_bytes / 2**20:.0f} MiB) while the platform took no reports",
            )
        )

    def _take_batch(self, heartbeat_due: bool) -> dict[str, Any] | None:
        """Move up to MAX_ITEMS_PER_REPORT of each list into a new numbered report (caller holds the lock)."""
        pending = self._pending
        if pending.empty() and not heartbeat_due:
            return None
        if pending.dropped_logs:
            pending.lists["logs"].append(
                LogItem(
                    time=time.time(),
                    level="WARNING",
                    source="reporter",
                    message=f"{pending.dropped_logs} log lines dropped while the API was unreachable",
                )
            )
            pending.dropped_logs = 0
        payload: dict[str, Any] = {
            "attempt": self.attempt,
            "seq": self._seq,
            "phase": pending.phase,
            "progress": self._progress,
        }
        if pending.wish is not None:
            payload["rollout_wish"] = pending.wish
            pending.wish = None
        if pending.followed is not None:
            payload["rollout_followed"] = pending.followed
            pending.followed = None
        for kind in REPORT_LISTS:
            bucket = pending.lists[kind]
            payload[kind], pending.lists[kind] = bucket[:MAX_ITEMS_PER_REPORT], bucket[MAX_ITEMS_PER_REPORT:]
        if (
            pending.final is not None
            and not any(pending.lists.values())
            and len(payload["events"]) < MAX_ITEMS_PER_REPORT
        ):
            payload["events"].append(pending.final)  # the last report: nothing can follow it
            pending.final = None
        pending.phase = None
        self._seq += 1
        return payload

    def _cut_loop(self) -> None:
        write_failures = 0
        while True:
            with self._cond:
                nothing_to_cut = self._pending.empty() and not self._unwritten
                if not self._flush_now and (not self._closing or nothing_to_cut):
                    self._cond.wait(self.flush_interval)
                if self._closed:
                    return
                self._flush_now = False
                closing = self._closing
                serving = self._persist_requests  # persist() calls this pass answers
                while True:
                    full = self._queue.bytes >= self.spool_max_bytes
                    self.spool_full = full
                    if full and not closing:
                        break  # items wait in memory (bounded by _add) until the sender makes room
                    idle = not self._unwritten and len(self._queue) == 0
                    due = (
                        idle and not closing and time.monotonic() - self._last_sent >= self.heartbeat_interval
                    )
                    payload = self._take_batch(heartbeat_due=due)
                    if payload is None:
                        break
                    self._unwritten.append(payload)
                    if due:
                        break
                cut_all = not any(self._pending.lists.values())
                todo = list(self._unwritten)
            written = 0
            for payload in todo:
                try:
                    with self._qlock:
                        self._queue.append(payload)
                except OSError as exc:
                    write_failures += 1
                    if write_failures in (1, 10) or write_failures % 100 == 0:
                        _internal.warning(
                            "cannot write report seq=%s to the spool (%s); retrying", payload["seq"], exc
                        )
                    break
                written += 1
            with self._cond:
                del self._unwritten[:written]
                if cut_all and not self._unwritten:
                    self._persisted = max(self._persisted, serving)
                self._cond.notify_all()

    def _send_loop(self) -> None:
        backoff = 0.0
        while True:
            with self._cond:
                if backoff:
                    retry_at = time.monotonic() + backoff
                    while not (self._hurry or self._closed) and time.monotonic() < retry_at:
                        self._cond.wait(retry_at - time.monotonic())
                elif len(self._queue) == 0 and not self._closed:
                    self._cond.wait(self.flush_interval)
                self._hurry = False
                if self._closed and (self._abandoned or len(self._queue) == 0):
                    return
            try:
                with self._qlock:
                    payload = self._queue.peek()
            except OSError as exc:
                _internal.warning("cannot read the report spool (%s); retrying", exc)
                backoff = min(self.max_backoff, max(0.25, backoff * 2))
                continue
            if payload is None:
                backoff = 0.0
                continue
            try:
                stop = self._deliver(payload)
            except ReportRefused as exc:
                _internal.error(
                    "the platform refuses this attempt's reports (%s): stopping; %d reports not delivered",
                    exc,
                    len(self._queue),
                )
                self._stop.set()
                with self._cond:
                    self._refused = str(exc)
                    self._cond.notify_all()
                return
            except Exception as exc:  # noqa: BLE001 - any other failure means "keep the report and retry"
                self.failed_sends += 1
                backoff = min(self.max_backoff, max(0.25, backoff * 2)) * (1 + 0.2 * random.random())
                if self.failed_sends in (1, 10) or self.failed_sends % 100 == 0:
                    _internal.warning(
                        "report seq=%s failed (%s); retrying in %.1fs", payload["seq"], exc, backoff
                    )
                continue
            backoff = 0.0
            if stop:
                self._stop.set()
            with self._qlock:
                self._queue.ack(int(payload["seq"]))
            with self._cond:
                self._last_sent = time.monotonic()
                self.sent_reports += 1
                self._cond.notify_all()

    @abstractmethod
    def _deliver(self, payload: dict[str, Any]) -> bool:
        """Send one report; return whether the platform asked to stop. Raise to have it retried;
        ReportRefused when it never will be taken."""

    def _on_close(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Release resources after the last send."""


class HttpReporter(Reporter):
    """Reports to `POST {api_url}/v1/internal/jobs/{job_id}/report` with the attempt's bearer token (kept
    in the HTTP client's headers only; httpx leaves it out of their repr). `attach_spool` moves the queue
    onto disk, signed with a key derived from the token (`runtime.spool.spool_key`)."""

    def __init__(
        self, api_url: str, job_id: str, token: str, *, attempt: int = 0, timeout: float = 10.0, **kwargs: Any
    ) -> None:
        self.url = f"{api_url.rstrip('/')}/v1/internal/jobs/{job_id}/report"
        self._client = httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {token}"})
        self._spool_key = spool_key(token)
        super().__init__(attempt=attempt, **kwargs)

    def attach_spool(self, directory: str | Path) -> None:
        """From now on every report is on disk under `directory` until acknowledged (those numbered so far
        are moved there first). Raises OSError when the folder cannot be used (the queue stays in memory)."""
        directory = Path(directory)
        for part in (directory.parent.parent, directory.parent, directory):
            if part.is_symlink():
                raise OSError(f"{part} is a symbolic link: the report spool never follows one")
        if directory.exists() and any(directory.iterdir()):
            # Another process of this attempt spooled there (it cannot have: one driver per attempt), or
            # the folder is not what it seems: keep it aside rather than mix two numberings.
            directory.rename(directory.with_name(f"{directory.name}.stale-{int(time.time())}"))
        spool = DiskSpool(directory, self._spool_key)
        with self._qlock:
            old = self._queue
            if isinstance(old, DiskSpool):
                raise RuntimeError("the reporter already spools to disk")
            for payload in old.items():
                spool.append(payload)
            self._queue = spool
            old.drain()

    def _deliver(self, payload: dict[str, Any]) -> bool:
        response = self._client.post(self.url, json=payload)
        if not response.is_success:
            code = _error_code(response)
            if response.status_code == 401 or code in ("job.not_running", "job.stale_attempt"):
                raise ReportRefused(f"HTTP {response.status_code} {code}".strip())
            raise RuntimeError(f"HTTP {response.status_code} {code}".strip())
        try:
            answer = response.json()
        except ValueError:
            return False
        if not isinstance(answer, dict):
            return False
        engines = answer.get("rollout_engines")
        # an elastic job's engines: ReportAck.rollout_engines (docs/adr/0013-elastic-rollout-follows-the-pass.md)
        if isinstance(engines, list):
            number = answer.get("rollout_grant")
            self._grant = Grant(
                tuple(e.get("ray_node_id") or None if isinstance(e, dict) else None for e in engines),
                number if isinstance(number, int) and not isinstance(number, bool) else None,
            )
        return bool(answer.get("stop_requested", False))

    def _on_close(self) -> None:
        self._client.close()


def _error_code(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except Exception:  # noqa: BLE001 - any body: name none
        return ""


class LocalReporter(Reporter):
    """Standalone runs: prints one line per step's metrics and every checkpoint and event to `stream`, and
    appends metrics to `<out_dir>/metrics.jsonl` and every report body (rollouts and logs included) to
    `<out_dir>/reports.jsonl`."""

    def __init__(self, out_dir: str | Path, *, stream: TextIO | None = None, **kwargs: Any) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.reports_path = self.out_dir / "reports.jsonl"
        self.stream = stream or sys.stdout
        self._stop_file = self.out_dir / "STOP"  # touch it to ask a standalone run to stop
        self._stop_file.unlink(missing_ok=True)  # a request to an earlier run, not to this one
        kwargs.setdefault("heartbeat_interval", 1.0)
        super().__init__(**kwargs)

    def _deliver(self, payload: dict[str, Any]) -> bool:
        with self.reports_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(payload) + "\n")
        if payload["metrics"]:
            with self.metrics_path.open("a", encoding="utf-8") as fh:
                for item in payload["metrics"]:
                    fh.write(json.dumps(item) + "\n")
            by_step: dict[int, list[str]] = {}
            for item in payload["metrics"]:
                by_step.setdefault(item["step"], []).append(f"{item['name']}={item['value']:.4g}")
            for step, parts in by_step.items():
                print(f"[metrics] step {step}: " + " ".join(parts), file=self.stream, flush=True)
        for item in payload["checkpoints"]:
            print(
                f"[checkpoint] step {item['step']} {item['format']} {item['size_bytes']} B {item['path']}",
                file=self.stream,
                flush=True,
            )
        for item in payload["predictions"]:
            print(
                f"[predictions] step {item['step']} {item['num_samples']} rows {item['path']}",
                file=self.stream,
                flush=True,
            )
        for item in payload["events"]:
            print(f"[event] {item['kind']} {item['message']}", file=self.stream, flush=True)
        return self._stop_file.exists()


class ReporterLogHandler(logging.Handler):
    """Forwards the driver's log records (formatted, tracebacks included) into the reporter's `logs`."""

    def __init__(self, reporter: Reporter, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.reporter = reporter

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("runtime.reporter"):
            return
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            source = getattr(record, "source", "driver")
            self.reporter.log(record.levelname, message, source=source, when=record.created)
        except Exception:  # noqa: BLE001 - logging must never break the caller
            self.handleError(record)
