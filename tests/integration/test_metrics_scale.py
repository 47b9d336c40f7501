"""The scrape stays cheap: GET /metrics over 5,000 jobs and their ~21,000 events, on SQLite and PostgreSQL
(docs/observability.md gives the times measured). Run with `-s` to see them."""

from __future__ import annotations

import random
import statistics
import time
from datetime import timedelta

import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from scheduler.db.engine import Database
from scheduler.db.models import Job, JobEvent, Queue, utcnow
from scheduler.db.spec_column import DEFAULTS_KEY, current_defaults
from scheduler.domain.ids import new_id
from tests.integration.test_metrics import _cluster

JOBS = 5000
# (final status, its path through the lifecycle, failure_reason)
PATHS = [
    ("QUEUED", ["QUEUED"], None),
    ("RUNNING", ["QUEUED", "ADMITTED", "STARTING", "RUNNING"], None),
    ("SUCCEEDED", ["QUEUED", "ADMITTED", "STARTING", "RUNNING", "SUCCEEDED"], None),
    ("FAILED", ["QUEUED", "ADMITTED", "STARTING", "RUNNING", "FAILED"], "user_code"),
    ("CANCELLED", ["QUEUED", "CANCELLED"], None),
    (
        "SUCCEEDED",
        [
            "QUEUED",
            "ADMITTED",
            "STARTING",
            "RUNNING",
            "PREEMPTING",
            "QUEUED",
            "ADMITTED",
            "STARTING",
            "SUCCEEDED",
        ],
        None,
    ),
]


def _fill(db: Database) -> tuple[int, int]:
    """5,000 jobs of two queues, most of them finished, with the events of their paths (hours old). Each job's
    spec is stored as a job of every default's is (scheduler/db/spec_column.py), not as `{}`: `{}` lacks every
    parameter, and was stored listing all ~1,060 as absent (~30 kB a row). The rows go in as two INSERTs of
    many rows: with `render_nulls` every row binds the same columns, where the ORM left a None out of its row
    and so cut the rows into runs of a few (~11,000 INSERT statements a database). 4.6 s -> 0.9 s on SQLite and 12.3 s ->
    1.8 s on PostgreSQL (load 1.5-4.5)."""
    rng = random.Random(5)
    all_defaults = {DEFAULTS_KEY: current_defaults()[0]}
    now = utcnow()
    jobs, events = [], []
    with db.session(read_only=True) as s:
        teams = dict(s.execute(sa.select(Queue.name, Queue.team_id)).all())
    for i in range(JOBS):
        status, path, failure = PATHS[i % len(PATHS)] if i % 10 else PATHS[0]
        job_id = new_id("job")
        queue = ("math", "vision")[i % 2]
        t = now - timedelta(hours=rng.uniform(1, 72))
        jobs.append(
            {
                "id": job_id,
                "name": f"j{i}",
                "team_id": teams[queue],
                "queue": queue,
                "pool": "h200",
                "status": status,
                "failure_reason": failure,
                "priority_class": "normal",
                "labels": {},
                "spec": dict(all_defaults),
                "submitted": {},
                "demand": {"groups": [], "total_gpus": 1},
                "total_gpus": 1,
                "output_dir": f"/tmp/none/{job_id}",
                "queued_at": t,
                "last_report_at": now if status == "RUNNING" else None,
            }
        )
        src = None
        for k, to in enumerate(path):
            reason = "queue math reclaims GPUs lent to queue vision, for job_x" if to == "PREEMPTING" else "x"
            events.append(
                {
                    "job_id": job_id,
                    "time": t + timedelta(seconds=k),
                    "kind": "transition",
                    "from_status": src,
                    "to_status": to,
                    "reason": reason,
                }
            )
            src = to
    with db.session() as s:
        # none of the columns given None (failure_reason, last_report_at, from_status) has a default: NULL either way
        s.execute(sa.insert(Job).execution_options(render_nulls=True), jobs)
        s.execute(sa.insert(JobEvent).execution_options(render_nulls=True), events)
    return len(jobs), len(events)


def test_a_scrape_over_5000_jobs_is_cheap(api) -> None:  # type: ignore[no-untyped-def]
    client, _settings, _broker = api
    db: Database = client.app.state.db
    _cluster(db)
    n_jobs, n_events = _fill(db)

    def scrape() -> tuple[float, str]:
        t0 = time.perf_counter()
        r = client.get("/metrics")
        assert r.status_code == 200
        return time.perf_counter() - t0, r.text

    first, text = scrape()  # this API process reads every event once
    counts = client.app.state.metric_events
    first_rows = counts.rows_read
    warm = []
    for _ in range(20):  # then only those after the last settled one: none here
        warm.append(scrape()[0])
        assert counts.rows_read == 0, counts.rows_read
    with db.session(read_only=True) as s:  # every event is hours old: all settled, none read again
        assert counts.settled_id == s.scalar(sa.select(sa.func.max(JobEvent.id)))
    # the first scrape brought back grouped counts and the preemptions' own rows, not every event
    assert 0 < first_rows < n_events // 10, (first_rows, n_events)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    done = sum(1 for i in range(JOBS) if i % 10 and PATHS[i % len(PATHS)][0] == "SUCCEEDED")
    key = ("relax_job_outcomes_total", (("failure_reason", ""), ("pool", "h200"), ("status", "SUCCEEDED")))
    assert samples[key] == done
    assert samples[("relax_preemptions_total", (("pool", "h200"), ("reason", "reclaim")))] > 0
    median = statistics.median(warm)
    print(
        f"\n{db.dialect}: {n_jobs} jobs, {n_events} events: first scrape {first * 1000:.1f} ms, "
        f"then median {median * 1000:.1f} ms (max {max(warm) * 1000:.1f} ms) over {len(warm)}; event rows read "
        f"{first_rows}, then none"
    )


def test_paths_are_valid() -> None:
    from scheduler.domain.jobs import JobStatus, can_transition

    for _, path, _ in PATHS:
        for a, b in zip(path, path[1:], strict=False):
            assert can_transition(JobStatus(a), JobStatus(b)), (a, b)
