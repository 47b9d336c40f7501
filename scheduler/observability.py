"""Prometheus metrics of the platform (docs/observability.md).

Two kinds, because the platform runs as several processes (uvicorn workers, the Celery worker) and each sees
only its own requests and passes:

- **State, read from the database at scrape time** (`DatabaseCollector`): queue depth and oldest wait, jobs by
  status, pool capacity and nodes, and the counters of admissions, preemptions and outcomes, which count
  `job_events` rows (events are never deleted, so the counts only grow) rather than current rows. Every API
  worker answers the same numbers.
- **Measurements of one process** (request latency, scheduling pass duration, reports ingested): prometheus_client
  metrics in multiprocess mode. Each process writes its values to files under `PROMETHEUS_MULTIPROC_DIR`; a
  scrape merges the files of every process. The platform gives each of its parts its own folder under one root,
  `RELAX_METRICS_DIR` (api/embedded.py: `<home>/run/prometheus/<part>`), so a part can clean its folder at start
  without touching another's; a scrape merges `RELAX_METRICS_DIR/*/*.db`. Without either variable (tests, a
  single process), the values are this process's own.

`PROMETHEUS_MULTIPROC_DIR` must be set before prometheus_client is first imported (it picks its value store
then): the platform sets it in the environment of each part it starts.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from scheduler.db.engine import Database
from scheduler.db.models import Allocation, Job, JobEvent, Node, Pool, utcnow
from scheduler.domain.jobs import TERMINAL, JobStatus

# the root: one folder per part, each that part's PROMETHEUS_MULTIPROC_DIR
METRICS_DIR_ENV = "RELAX_METRICS_DIR"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# ---- measured in each process ------------------------------------------------------------------------------
# Module-level, as prometheus_client means them: in multiprocess mode each value lives in this process's file.
PROCESS = CollectorRegistry(auto_describe=True)

HTTP_LATENCY = Histogram(
    "relax_http_request_duration_seconds",
    "API requests by method, route template (never the raw path) and status code: time until the answer ended.",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=PROCESS,
)
PASS_DURATION = Histogram(
    "relax_scheduling_pass_duration_seconds",
    "Scheduling passes: wall time of each (lock, read, policy, write).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=PROCESS,
)
PASS_LAST = Gauge(
    "relax_scheduling_pass_last_timestamp_seconds",
    "When the last scheduling pass ended (Unix time).",
    multiprocess_mode="max",
    registry=PROCESS,
)
RAY_CONTACT = Gauge(
    "relax_pool_ray_last_contact_timestamp_seconds",
    "When a pool's reconciler last had an answer from the pool's Ray Jobs API (Unix time): a cluster that stops "
    "answering shows as a growing gap, whether or not jobs run on it.",
    ["pool"],
    multiprocess_mode="max",
    registry=PROCESS,
)
RAY_FAILURES = Counter(
    "relax_pool_ray_unanswered",
    "Reconciler calls to a pool's Ray Jobs API that got no answer.",
    ["pool"],
    registry=PROCESS,
)
REPORTS = Counter(
    "relax_reports_ingested",
    "Driver report batches applied (a resend of an applied batch is not counted).",
    registry=PROCESS,
)
REPORT_POINTS = Counter(
    "relax_report_metric_points",
    "Metric points stored from driver reports.",
    registry=PROCESS,
)


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    """`route` is the matched route's template; `method` is the client's, so an unknown one is `other` (a label
    must not take whatever a client sends)."""
    HTTP_LATENCY.labels(method if method in _METHODS else "other", route, str(status)).observe(seconds)


def observe_pass(seconds: float) -> None:
    PASS_DURATION.observe(seconds)
    PASS_LAST.set(time.time())


def observe_ray(pool: str, answered: bool) -> None:
    """A reconciler's call to `pool`'s Ray: answered, or not."""
    if answered:
        RAY_CONTACT.labels(pool).set(time.time())
    else:
        RAY_FAILURES.labels(pool).inc()


def count_report(metric_points: int) -> None:
    REPORTS.inc()
    if metric_points:
        REPORT_POINTS.inc(metric_points)


class _MergedFiles:
    """The values of every process that writes under `root/*/` (one folder per part)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def collect(self) -> Iterator[Metric]:
        files = sorted(str(p) for p in self.root.glob("*/*.db"))
        return iter(MultiProcessCollector.merge(files, accumulate=True))


def process_metrics() -> bytes:
    """The per-process measurements in Prometheus text: every part's, or this process's alone."""
    root = os.environ.get(METRICS_DIR_ENV)
    if root:
        return generate_latest(_MergedFiles(Path(root)))  # type: ignore[arg-type]
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(PROCESS)


def clean_dir(path: Path) -> None:
    """Remove a part's old value files (at its start, as prometheus_client's docs ask)."""
    path.mkdir(parents=True, exist_ok=True)
    for f in path.glob("*.db"):
        f.unlink(missing_ok=True)


# ---- read from the database at scrape time -----------------------------------------------------------------
# A preemption's reason, as the policy (scheduler/policy/policy.py), a lost node or a drain
# (scheduler/services/nodes.py, scheduler/policy/pass_state.py) word it: a label of few values.
_PREEMPT_REASONS = (
    ("priority", re.compile(r"needs GPUs held at priority")),
    ("reclaim", re.compile(r"reclaims GPUs lent to queue")),
    ("fair_share", re.compile(r"GPU-h run so far")),
    ("node_down", re.compile(r"is down")),
    ("drain", re.compile(r"is being drained")),
)
_WATCHED = [JobStatus.ADMITTED, JobStatus.PREEMPTING, JobStatus.QUEUED, *sorted(TERMINAL)]


def preempt_reason(reason: str | None) -> str:
    for label, pattern in _PREEMPT_REASONS:
        if reason and pattern.search(reason):
            return label
    return "other"


@dataclass
class EventCounts:
    """Admissions, preemptions and outcomes counted from `job_events`, incrementally: each scrape reads only the
    events after the last settled id (a primary-key range), so a scrape stays cheap however long the history.
    The events up to the first one younger than `settle_s` are settled: counted in the database, grouped (only
    the preemptions' rows come back, for their reasons), and never read again. The younger ones are re-read at
    each scrape, so an event whose transaction committed after a later id was read (ids are taken at insert,
    not at commit) is still counted."""

    settle_s: float = 300.0
    settled_id: int = 0
    settled: dict[str, Tally] = field(
        default_factory=lambda: {"admit": Tally(), "preempt": Tally(), "end": Tally()}
    )
    lock: threading.Lock = field(default_factory=threading.Lock)
    rows_read: int = (
        0  # event rows (one each) the last `read` brought back: its cost beyond two index lookups
    )

    def read(self, session: sa.orm.Session, now: datetime) -> dict[str, Tally]:
        with self.lock:
            rows = 0
            cut = now - timedelta(seconds=self.settle_s)
            after = JobEvent.id > self.settled_id
            young = session.scalar(sa.select(sa.func.min(JobEvent.id)).where(after, JobEvent.time >= cut))
            top = session.scalar(sa.select(sa.func.max(JobEvent.id)).where(after))
            settle_to = (young - 1) if young is not None else top
            if settle_to is not None and settle_to > self.settled_id:
                upto = JobEvent.id <= settle_to
                for r in session.execute(_grouped(after, upto)):
                    rows += 1
                    if not _preemption_like(r.to_status, r.from_status):
                        _count(self.settled, r, r.n)
                for r in session.execute(
                    _rows(after, upto, _preemption_like(JobEvent.to_status, JobEvent.from_status))
                ):
                    rows += 1
                    _count(self.settled, r)
                self.settled_id = settle_to
            fresh = {k: Tally() for k in self.settled}
            for r in session.execute(_rows(JobEvent.id > self.settled_id)):
                rows += 1
                _count(fresh, r)
            self.rows_read = rows
            return {k: self.settled[k] + fresh[k] for k in self.settled}


def _watched(*where: Any) -> list[Any]:
    return [
        *where,
        JobEvent.kind == "transition",
        JobEvent.to_status.in_(_WATCHED),
    ]


def _grouped(*where: Any) -> sa.Select:
    return (
        sa.select(
            Job.pool, JobEvent.to_status, JobEvent.from_status, Job.failure_reason, sa.func.count().label("n")
        )
        .join(Job, Job.id == JobEvent.job_id)
        .where(*_watched(*where))
        .group_by(Job.pool, JobEvent.to_status, JobEvent.from_status, Job.failure_reason)
    )


def _rows(*where: Any) -> sa.Select:
    return (
        sa.select(JobEvent.from_status, JobEvent.to_status, JobEvent.reason, Job.pool, Job.failure_reason)
        .join(Job, Job.id == JobEvent.job_id)
        .where(*_watched(*where))
    )


def _preemption_like(to: Any, src: Any) -> Any:
    """A transition that may be a preemption: to PREEMPTING, or an admitted job sent back to the queue (its
    reason says whether it was one). Works on values and on columns."""
    if isinstance(to, str):
        return to == JobStatus.PREEMPTING or (to == JobStatus.QUEUED and src == JobStatus.ADMITTED)
    return sa.or_(to == JobStatus.PREEMPTING, sa.and_(to == JobStatus.QUEUED, src == JobStatus.ADMITTED))


def _count(into: dict[str, Tally], r: Any, n: int = 1) -> None:
    to, src = r.to_status, r.from_status
    if to == JobStatus.ADMITTED:
        into["admit"][(r.pool,)] += n
    elif to == JobStatus.PREEMPTING or (
        to == JobStatus.QUEUED and src == JobStatus.ADMITTED and preempt_reason(r.reason) != "other"
    ):  # a launched job preempted, or an admitted one sent back before it launched
        into["preempt"][(r.pool, preempt_reason(r.reason))] += n
    elif to in TERMINAL:
        into["end"][(r.pool, to, r.failure_reason or "")] += n


class DatabaseCollector:
    """The platform's state at scrape time: a few grouped queries over indexed columns (jobs by status and
    pool: ix_jobs_status_pool) and the incremental event counts."""

    def __init__(self, db: Database, events: EventCounts) -> None:
        self.db, self.events = db, events

    def collect(self) -> Iterator[Metric]:
        now = utcnow()
        with self.db.session(read_only=True) as s:
            by_status = s.execute(
                sa.select(Job.pool, Job.status, sa.func.count()).group_by(Job.pool, Job.status)
            ).all()
            queues = s.execute(
                sa.select(Job.queue, Job.pool, sa.func.count(), sa.func.min(Job.queued_at))
                .where(Job.status == JobStatus.QUEUED)
                .group_by(Job.queue, Job.pool)
            ).all()
            capacity = s.execute(sa.select(Node.pool, sa.func.sum(Node.gpus)).group_by(Node.pool)).all()
            allocated = s.execute(
                sa.select(Allocation.pool, sa.func.sum(Allocation.gpus))
                .where(sa.not_(Allocation.shared))
                .group_by(Allocation.pool)
            ).all()
            nodes = s.execute(
                sa.select(Node.pool, Node.alive, Node.cordoned, sa.func.count()).group_by(
                    Node.pool, Node.alive, Node.cordoned
                )
            ).all()
            pools = s.execute(sa.select(Pool.name, Pool.cordoned)).all()
            heard = s.execute(
                sa.select(Job.pool, sa.func.max(Job.last_report_at))
                .where(Job.status.in_([JobStatus.STARTING, JobStatus.RUNNING]))
                .group_by(Job.pool)
            ).all()
            counts = self.events.read(s, now)

        g = GaugeMetricFamily("relax_jobs", "Jobs by pool and status.", labels=["pool", "status"])
        for pool, status, n in by_status:
            g.add_metric([pool, status], n)
        yield g
        depth = GaugeMetricFamily(
            "relax_queue_depth", "Jobs waiting (QUEUED) in each queue.", labels=["queue", "pool"]
        )
        oldest = GaugeMetricFamily(
            "relax_queue_oldest_wait_seconds",
            "How long the queue's longest-waiting job has waited since it (last) entered QUEUED.",
            labels=["queue", "pool"],
        )
        for queue, pool, n, first in queues:
            depth.add_metric([queue, pool], n)
            oldest.add_metric(
                [queue, pool], max(0.0, (now - _aware(first)).total_seconds()) if first else 0.0
            )
        yield depth
        yield oldest
        cap = GaugeMetricFamily(
            "relax_pool_gpus", "GPUs (or CPU slots) of each pool's nodes.", labels=["pool"]
        )
        for pool, n in capacity:
            cap.add_metric([pool], int(n or 0))
        yield cap
        alloc = GaugeMetricFamily(
            "relax_pool_allocated_gpus", "GPUs (or slots) allocated to jobs.", labels=["pool"]
        )
        for pool, n in allocated:
            alloc.add_metric([pool], int(n or 0))
        yield alloc
        node_g = GaugeMetricFamily(
            "relax_pool_nodes",
            "Nodes of each pool by state: alive, down (marked dead), cordoned (alive, taking no new jobs).",
            labels=["pool", "state"],
        )
        tally: Tally = Tally()
        for pool, alive, cordoned, n in nodes:
            tally[(pool, "down" if not alive else "cordoned" if cordoned else "alive")] += n
        for pool, _cordoned in pools:
            for state in ("alive", "down", "cordoned"):
                node_g.add_metric([pool, state], tally[(pool, state)])
        yield node_g
        pool_c = GaugeMetricFamily(
            "relax_pool_cordoned", "1 when the pool takes no new jobs.", labels=["pool"]
        )
        for pool, cordoned in pools:
            pool_c.add_metric([pool], 1 if cordoned else 0)
        yield pool_c
        last = GaugeMetricFamily(
            "relax_pool_last_driver_report_timestamp_seconds",
            "The newest report from a driver running on the pool's Ray cluster (Unix time): the platform last "
            "heard from the cluster then. Absent while no job runs there.",
            labels=["pool"],
        )
        for pool, t in heard:
            if t is not None:
                last.add_metric([pool], _aware(t).timestamp())
        yield last
        admit = CounterMetricFamily(
            "relax_admissions", "Jobs admitted by a scheduling pass.", labels=["pool"]
        )
        for (pool,), n in sorted(counts["admit"].items()):
            admit.add_metric([pool], n)
        yield admit
        pre = CounterMetricFamily(
            "relax_preemptions",
            "Jobs preempted, by reason: priority (a higher class needed the GPUs), reclaim (a queue took back "
            "GPUs it lent), fair_share, node_down, drain, other.",
            labels=["pool", "reason"],
        )
        for (pool, reason), n in sorted(counts["preempt"].items()):
            pre.add_metric([pool, reason], n)
        yield pre
        end = CounterMetricFamily(
            "relax_job_outcomes",
            "Jobs that ended, by final status and failure_reason (empty unless FAILED).",
            labels=["pool", "status", "failure_reason"],
        )
        for (pool, status, why), n in sorted(counts["end"].items()):
            end.add_metric([pool, status, why], n)
        yield end


def _aware(t: datetime) -> datetime:
    """The database's times are UTC (a driver that drops the zone gives them naive)."""
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def database_metrics(db: Database, events: EventCounts) -> bytes:
    return generate_latest(DatabaseCollector(db, events))  # type: ignore[arg-type]
