"""How the driver reports to the platform (HTTP) or to the console and JSONL (standalone), never raising into training."""

from __future__ import annotations

import json
import logging
import random
import sys
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

import httpx

from runtime.redaction import redact
from runtime.train.checkpoint import CheckpointRecord

# The reporter's own trouble goes to stderr only: forwarding it through the reporter would loop.
_internal = logging.getLogger("runtime.reporter.internal")
_internal.propagate = False
if not _internal.handlers:
    _internal.addHandler(logging.StreamHandler(sys.stderr))
    _internal.setLevel(logging.WARNING)

REPORT_LISTS = ("metrics", "logs", "checkpoints", "rollouts", "predictions", "events")
MAX_ITEMS_PER_REPORT = 1000  # per list, keeps request bodies small after an outage
MAX_PENDING_LOGS = 20_000  # beyond this the oldest log lines are dropped (metrics never are)


class Phase(StrEnum):
    RUNNING = "running"  # the roles are up; moves the job STARTING -> RUNNING


class EventKind(StrEnum):
    MODEL_LOADED = "model_loaded"  # the roles loaded hf-checkpoint (and, on resume, the checkpoint)
    RESUMED = "resumed"  # training continues from a checkpoint under `load`
    CHECKPOINT_SAVED = "checkpoint_saved"
    CHECKPOINT_REMOVED = "checkpoint_removed"  # max-actor-ckpt-to-keep / rotate-ckpt let it go
    HF_EXPORTED = "hf_exported"
    PREDICTIONS_WRITTEN = "predictions_written"  # an SFT predictions file
    STOP_REQUESTED = "stop_requested"  # the platform asked the driver to stop between steps
    FINISHED = "finished"  # the loop ended normally
    FAILED = "failed"  # the driver is exiting on an error


class RolloutSplit(StrEnum):
    TRAIN = "train"
    EVAL = "eval"


@dataclass
class _Pending:
    lists: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {k: [] for k in REPORT_LISTS})
    phase: str | None = None
    dropped_logs: int = 0

    def empty(self) -> bool:
        return self.phase is None and not any(self.lists.values())


class Reporter(ABC):
    """Collects report items from the training thread; a background thread ships them in batches.

    Every ~`flush_interval` s whatever is pending goes out as one report with the next sequence number;
    a failed report is retried as is (same seq) with exponential backoff while new items wait behind it.
    With nothing to say, a heartbeat (an empty report) goes out every `heartbeat_interval` s: its answer
    is how the platform asks the driver to stop.
    """

    def __init__(
        self,
        *,
        attempt: int = 0,
        flush_interval: float = 1.0,
        heartbeat_interval: float = 5.0,
        max_backoff: float = 10.0,
    ) -> None:
        self.attempt = attempt
        self.flush_interval = flush_interval
        self.heartbeat_interval = heartbeat_interval
        self.max_backoff = max_backoff
        self._cond = threading.Condition()
        self._pending = _Pending()
        self._progress: dict[str, int] | None = None
        self._inflight: dict[str, Any] | None = None
        self._seq = 0
        self._last_sent = 0.0
        self._flush_now = False
        self._closed = False
        self._abandoned = False  # close() gave up on what is left
        self._stop = threading.Event()
        self.sent_reports = 0
        self.failed_sends = 0
        self._thread = threading.Thread(target=self._run, name=f"{type(self).__name__}-sender", daemon=True)
        self._thread.start()

    # -- what the driver calls ---------------------------------------------------------------------------
    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Mark a stop as requested from this side (e.g. on SIGTERM)."""
        self._stop.set()

    def metrics(self, step: int, values: dict[str, float]) -> None:
        now = time.time()
        self._add(
            "metrics", [{"step": step, "name": k, "value": float(v), "time": now} for k, v in values.items()]
        )

    def log(self, level: str, message: str, *, source: str = "driver", when: float | None = None) -> None:
        item = {"time": when or time.time(), "level": level, "source": source, "message": redact(message)}
        self._add("logs", [item])

    def checkpoint(self, record: CheckpointRecord) -> None:
        self._add("checkpoints", [record.to_report()])

    def rollout(self, rollout_id: int, split: RolloutSplit, path: str, num_samples: int) -> None:
        item = {"rollout_id": rollout_id, "split": str(split), "path": path, "num_samples": num_samples}
        self._add("rollouts", [item])

    def prediction(self, step: int, path: str, num_samples: int) -> None:
        """An SFT predictions file (`<save>/predict/predictions_step_<step>.jsonl`)."""
        item = {"step": step, "path": path, "num_samples": num_samples, "time": time.time()}
        self._add("predictions", [item])

    def event(self, kind: EventKind, message: str = "") -> None:
        self._add("events", [{"time": time.time(), "kind": str(kind), "message": redact(message)}])

    def set_phase(self, phase: Phase) -> None:
        with self._cond:
            self._pending.phase = str(phase)
            self._flush_now = True
            self._cond.notify_all()

    def set_progress(self, step: int, total_steps: int) -> None:
        with self._cond:
            self._progress = {"step": step, "total_steps": total_steps}

    def flush(self, timeout: float = 10.0) -> bool:
        """Send everything pending now; True if it all went out within `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._flush_now = True
            self._cond.notify_all()
            while not (self._pending.empty() and self._inflight is None):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(remaining, 0.1))
        return True

    def close(self, timeout: float = 30.0) -> bool:
        """Flush (giving up after `timeout`) and stop the sender thread; True if nothing was left unsent."""
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._abandoned = not done
            self._cond.notify_all()
        self._thread.join(timeout=15.0)
        if not done:
            _internal.warning("reporter closed with unsent reports (%d failed sends)", self.failed_sends)
        self._on_close()
        return done

    # -- the sender thread ---------------------------------------------------------------------------
    def _add(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self._cond:
            bucket = self._pending.lists[kind]
            bucket.extend(items)
            if kind == "logs" and len(bucket) > MAX_PENDING_LOGS:
                excess = len(bucket) - MAX_PENDING_LOGS
                del bucket[:excess]
                self._pending.dropped_logs += excess

    def _take_batch(self, heartbeat_due: bool) -> dict[str, Any] | None:
        """Move up to MAX_ITEMS_PER_REPORT of each list into a new numbered report (caller holds the lock)."""
        pending = self._pending
        if pending.empty() and not heartbeat_due:
            return None
        if pending.dropped_logs:
            pending.lists["logs"].append(
                {
                    "time": time.time(),
                    "level": "WARNING",
                    "source": "reporter",
                    "message": f"{pending.dropped_logs} log lines dropped while the API was unreachable",
                }
            )
            pending.dropped_logs = 0
        payload: dict[str, Any] = {
            "attempt": self.attempt,
            "seq": self._seq,
            "phase": pending.phase,
            "progress": self._progress,
        }
        for kind in REPORT_LISTS:
            bucket = pending.lists[kind]
            payload[kind], pending.lists[kind] = bucket[:MAX_ITEMS_PER_REPORT], bucket[MAX_ITEMS_PER_REPORT:]
        pending.phase = None
        self._seq += 1
        return payload

    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._cond:
                if backoff == 0.0 and not self._flush_now and not self._closed:
                    self._cond.wait(self.flush_interval)
                elif backoff:
                    self._cond.wait(backoff)  # close() or flush() wakes us early for one more try
                if self._abandoned or (self._closed and self._inflight is None and self._pending.empty()):
                    return
                if self._inflight is None:
                    due = time.monotonic() - self._last_sent >= self.heartbeat_interval
                    self._inflight = self._take_batch(heartbeat_due=due)
                payload = self._inflight
                self._flush_now = False
            if payload is None:
                continue
            try:
                stop = self._deliver(payload)
            except Exception as exc:  # noqa: BLE001 - any failure means "keep the batch and retry"
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
            with self._cond:
                self._inflight = None
                self._last_sent = time.monotonic()
                self.sent_reports += 1
                if not self._pending.empty():
                    self._flush_now = True
                self._cond.notify_all()

    @abstractmethod
    def _deliver(self, payload: dict[str, Any]) -> bool:
        """Send one report; return whether the platform asked to stop. Raise to have it retried."""

    def _on_close(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Release resources after the last send."""


class HttpReporter(Reporter):
    """Reports to `POST {api_url}/v1/internal/jobs/{job_id}/report` with the attempt's bearer token (kept
    in the HTTP client's headers only; httpx leaves it out of their repr)."""

    def __init__(
        self, api_url: str, job_id: str, token: str, *, attempt: int = 0, timeout: float = 10.0, **kwargs: Any
    ) -> None:
        self.url = f"{api_url.rstrip('/')}/v1/internal/jobs/{job_id}/report"
        self._client = httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {token}"})
        super().__init__(attempt=attempt, **kwargs)

    def _deliver(self, payload: dict[str, Any]) -> bool:
        response = self._client.post(self.url, json=payload)
        if not response.is_success:
            raise RuntimeError(f"HTTP {response.status_code}")
        try:
            return bool(response.json().get("stop_requested", False))
        except ValueError:
            return False

    def _on_close(self) -> None:
        self._client.close()


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
