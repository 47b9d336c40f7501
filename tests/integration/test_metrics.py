"""GET /metrics over SQLite and PostgreSQL: jobs submitted, admitted by a real scheduling pass, preempted,
finished; the scrape parsed with prometheus_client's parser (scheduler/observability.py, docs/observability.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.report_protocol import Report
from scheduler.db.engine import Database
from scheduler.domain.jobs import FailureReason, JobStatus
from scheduler.observability import METRICS_DIR_ENV, MULTIPROC_ENV
from scheduler.policy import PolicyConfig
from scheduler.scheduling import run_scheduling_pass
from scheduler.services.auth import Principal
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.reports import JobReports
from tests.factories import make_job, two_team_gpu_pool

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)
REPO = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client) -> Samples:  # type: ignore[no-untyped-def]
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def names(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for n, labels in samples if n == name]


def _cluster(db: Database) -> None:
    two_team_gpu_pool(db)


def test_metrics_follow_admissions_preemptions_and_outcomes(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client, _settings, broker = api
    db: Database = client.app.state.db
    dispatcher = client.app.state.dispatcher
    _cluster(db)
    before = scrape(client)
    passes0 = value(before, "relax_scheduling_pass_duration_seconds_count")
    reports0 = value(before, "relax_reports_ingested_total")
    points0 = value(before, "relax_report_metric_points_total")

    # vision borrows all 32 GPUs while math is idle; one more vision job waits
    lenders = [make_job(db, queue="vision", gpus_per_replica=8, name=f"v{i}") for i in range(4)]
    waiting = make_job(db, queue="vision", gpus_per_replica=8, name="waits")
    r = run_scheduling_pass(db, dispatcher)
    assert sorted(r.admitted) == sorted(lenders), r
    with db.session() as s:
        svc = JobLifecycle(s)
        for j in lenders:
            svc.transition(j, JobStatus.STARTING, expected_from=JobStatus.ADMITTED, reason="test")
        # a driver's report: 3 metric points
        job = svc.get(lenders[0])
        points = [{"step": i, "name": "loss", "value": 1.0 / (i + 1), "time": 1.0 + i} for i in range(3)]
        JobReports(s).ingest_report(job, Report(attempt=1, seq=0, phase="running", metrics=points))
        for j in lenders[1:]:
            svc.transition(j, JobStatus.RUNNING, expected_from=JobStatus.STARTING, reason="test")

    mid = scrape(client)
    assert value(mid, "relax_queue_depth", queue="vision", pool="h200") == 1
    assert value(mid, "relax_queue_depth", queue="math", pool="h200") == 0  # no series: nothing waits
    assert 0 <= value(mid, "relax_queue_oldest_wait_seconds", queue="vision", pool="h200") < 300
    assert value(mid, "relax_admissions_total", pool="h200") == 4
    assert value(mid, "relax_jobs", pool="h200", status="RUNNING") == 4
    assert value(mid, "relax_pool_gpus", pool="h200") == 32
    assert value(mid, "relax_pool_allocated_gpus", pool="h200") == 32
    assert value(mid, "relax_pool_nodes", pool="h200", state="alive") == 4
    assert value(mid, "relax_pool_nodes", pool="h200", state="down") == 0
    assert value(mid, "relax_pool_last_driver_report_timestamp_seconds", pool="h200") > time.time() - 300
    assert value(mid, "relax_reports_ingested_total") - reports0 == 1
    assert value(mid, "relax_report_metric_points_total") - points0 == 3

    # math comes for its GPUs: two vision jobs are preempted (reclaim), then stop and queue again
    owner = make_job(db, queue="math", gpus_per_replica=8, replicas=2, name="owner")
    config = PolicyConfig(reclaim_after_s=0, min_runtime_s=0)
    r = run_scheduling_pass(db, dispatcher, config=config)
    assert len(r.preempted) == 2, r
    with db.session() as s:
        svc = JobLifecycle(s)
        for j in r.preempted:
            svc.transition(j, JobStatus.QUEUED, expected_from=JobStatus.PREEMPTING, reason="test: stopped")
        survivors = [j for j in lenders if j not in r.preempted]
        svc.transition(survivors[0], JobStatus.SUCCEEDED, expected_from=JobStatus.RUNNING, reason="done")
        svc.transition(
            survivors[1],
            JobStatus.FAILED,
            expected_from=(JobStatus.RUNNING, JobStatus.STARTING),
            reason="the driver exited 1",
            failure=FailureReason.USER_CODE,
        )
        svc.cancel(waiting, ADMIN)
    r = run_scheduling_pass(db, dispatcher, config=config)
    assert owner in r.admitted, r

    job_id = lenders[0]
    assert client.get(f"/v1/jobs/{job_id}").status_code == 200
    assert client.get("/v1/jobs/job_doesnotexist0000").status_code == 404
    after = scrape(client)
    assert value(after, "relax_preemptions_total", pool="h200", reason="reclaim") == 2
    assert value(after, "relax_job_outcomes_total", pool="h200", status="SUCCEEDED", failure_reason="") == 1
    assert (
        value(after, "relax_job_outcomes_total", pool="h200", status="FAILED", failure_reason="user_code")
        == 1
    )
    assert value(after, "relax_job_outcomes_total", pool="h200", status="CANCELLED", failure_reason="") == 1
    assert value(after, "relax_admissions_total", pool="h200") >= 5  # the 4, the owner (and a requeued one)
    assert value(after, "relax_queue_depth", queue="math", pool="h200") == 0
    assert value(after, "relax_scheduling_pass_duration_seconds_count") - passes0 == 3
    assert value(after, "relax_scheduling_pass_last_timestamp_seconds") > time.time() - 60
    # counters never go back; the request latency is labelled by route template, never by a job's id
    for (name, labels), v in mid.items():
        if name.endswith("_total"):
            assert after.get((name, labels), 0.0) >= v, (name, labels)
    routes = {labels["route"] for labels in names(after, "relax_http_request_duration_seconds_count")}
    assert "/v1/jobs/{job_id}" in routes and "/metrics" in routes
    assert not any(job_id in r or "doesnotexist" in r for r in routes), routes
    statuses = {
        (labels["route"], labels["status"])
        for labels in names(after, "relax_http_request_duration_seconds_count")
    }
    assert ("/v1/jobs/{job_id}", "200") in statuses and ("/v1/jobs/{job_id}", "404") in statuses


def test_metrics_keeps_its_credential(api) -> None:  # type: ignore[no-untyped-def]
    client, _settings, _broker = api
    assert client.get("/metrics", headers={"Authorization": ""}).status_code == 401


_RECORD = """
import sys
from fastapi.testclient import TestClient
from api.app import create_app
from scheduler.db.engine import Database
from scheduler.settings import CelerySettings, DatabaseSettings, Settings
home, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = Settings(home=home, database=DatabaseSettings(url=url),
                    celery=CelerySettings(broker_url=f"sqla+sqlite:///{home}/broker.db"))
with TestClient(create_app(settings, db=Database(url))) as client:
    for _ in range(n):
        assert client.get("/healthz").status_code == 200
"""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_one_scrape_merges_the_latency_of_every_process(
    api, db_url: str, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Two API processes (as two uvicorn workers, or the API and the scheduler, each in its own folder) answer
    /healthz; a scrape of a third merges both processes' observations."""
    client, _settings, _broker = api
    root = tmp_path / "prometheus"
    procs = []
    for part, n in (("api-a", 3), ("api-b", 4)):
        env = os.environ | {MULTIPROC_ENV: str(root / part), "PYTHONPATH": str(REPO)}
        (root / part).mkdir(parents=True)
        procs.append(
            subprocess.run(
                [sys.executable, "-c", _RECORD, str(tmp_path), db_url, str(n)],
                env=env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )
        )
    assert all(p.returncode == 0 for p in procs), [p.stderr[-2000:] for p in procs]
    assert all(list((root / part).glob("*.db")) for part in ("api-a", "api-b"))
    monkeypatch.setenv(METRICS_DIR_ENV, str(root))
    got = scrape(client)
    count = value(
        got, "relax_http_request_duration_seconds_count", method="GET", route="/healthz", status="200"
    )
    assert count == 7, json.dumps(names(got, "relax_http_request_duration_seconds_count"))


DASHBOARD = REPO / "docs" / "grafana" / "relax-platform.json"


def _exposed(text: str) -> set[str]:
    """Every series name a scrape declares: each family's samples, and the names its type implies."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    out: set[str] = set()
    for family in text_string_to_metric_families(text):
        out |= {s.name for s in family.samples}
        out |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return out


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_reads_only_what_metrics_exposes(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client, _settings, _broker = api
    db: Database = client.app.state.db
    _cluster(db)
    make_job(db, queue="math", gpus_per_replica=8, name="one")
    run_scheduling_pass(db, client.app.state.dispatcher)
    client.get("/healthz")
    exposed = _exposed(client.get("/metrics").text)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\brelax_[a-z_]+", e)}
    assert len(exprs) >= 15 and len(used) >= 12, used
    assert used <= exposed, sorted(used - exposed)
    # every panel sits on the grid and queries Prometheus through the dashboard's data source variable
    for p in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]


def test_settled_counts_match_a_full_recount(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Counts settled at once (settle_s=0), across scrapes as events arrive, equal a recount from scratch and the
    counts of events still within the window."""
    from scheduler.db.models import utcnow
    from scheduler.observability import EventCounts

    client, _settings, _broker = api
    db: Database = client.app.state.db
    _cluster(db)
    eager = EventCounts(settle_s=0)

    def read(events: EventCounts) -> dict:
        with db.session(read_only=True) as s:
            return events.read(s, utcnow())

    config = PolicyConfig(reclaim_after_s=0, min_runtime_s=0)
    for round_ in range(3):
        jobs = [make_job(db, queue="vision", gpus_per_replica=8, name=f"v{round_}{i}") for i in range(2)]
        run_scheduling_pass(db, client.app.state.dispatcher, config=config)
        with db.session() as s:
            svc = JobLifecycle(s)
            for j in jobs:
                svc.transition(j, JobStatus.STARTING, expected_from=JobStatus.ADMITTED, reason="test")
                svc.transition(j, JobStatus.SUCCEEDED, expected_from=JobStatus.STARTING, reason="done")
        assert read(eager) == read(EventCounts(settle_s=0)) == read(EventCounts())
    got = read(eager)
    assert eager.settled_id > 0 and sum(got["admit"].values()) == 6 and sum(got["end"].values()) == 6
