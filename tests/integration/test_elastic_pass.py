"""The scheduling pass applies `Decision.resize` (docs/reference/elastic-rollout.md), on SQLite and PostgreSQL: an
elastic job's rollout engines grow into idle GPUs, are taken back for a job that needs them (admitted in the same
pass, instead of a preemption) and come back once it has gone; requeued, it starts again at its spec's count. Each resize is the job's rollout allocation rows
(what its driver is told, `scheduler.services.elastic.granted_engines`), its GPU total and an event, written in
the pass's transaction; no GPU is ever booked twice. What the driver asks for (a report's `rollout_wish`, through
the internal report route) is kept on the job: the pass grows the job up to it, no further than its spec's count
before it, and gives engines above it back though nobody waits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from api.app import create_app
from scheduler.db.engine import Database
from scheduler.db.models import Allocation, Job, JobEvent, Node
from scheduler.dispatch import CeleryDispatcher
from scheduler.scheduling import RESIZE_EVENT, run_scheduling_pass
from scheduler.services.elastic import (
    STOPPED_EVENT,
    WISH_EVENT,
    granted_engines,
    release_followed,
    rollout_grant,
)
from scheduler.services.job_tokens import bootstrap_secret
from scheduler.services.lifecycle import JobLifecycle
from scheduler.settings import CelerySettings, DatabaseSettings, Settings
from tests.factories import bootstrap, make_broker_app, make_job


@pytest.fixture
def pool(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Pool `local`: one node of 3 GPUs (its Ray node id known), queue `default` of 3."""
    db = Database(db_url)
    bootstrap(db, tmp_path, slots=3)
    with db.session() as s:
        for node in s.scalars(sa.select(Node)):
            node.ray_node_id = f"ray-{node.name}"
    yield db
    db.dispose()


def _elastic_job(db: Database, most: int = 2) -> str:
    """A trainer of 1 GPU and 1 rollout engine of its own, elastic from 1 to `most` engines (as submission stores a
    job with --autoscaler-config: `scheduler.services.elastic.elastic_demand`)."""
    job_id = make_job(db, name="elastic", colocated_rollout=False)
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        rollout = {
            "role": "rollout",
            "replicas": 1,
            "gpus_per_replica": 1,
            "one_node": True,
            "shares_with": None,
            "min_replicas": 1,
            "max_replicas": most,
        }
        job.demand = {**job.demand, "groups": [*job.demand["groups"], rollout], "total_gpus": 2}
        job.total_gpus = 2
    return job_id


def _rollout_rows(db: Database, job_id: str, *, releasing: bool = False) -> list[tuple[int, str]]:
    """The job's rollout rows: those granted, or (`releasing`) those of engines taken back not yet stopped."""
    with db.session(read_only=True) as s:
        return [
            (a.replica, a.node) if not releasing else (a.gpus, a.node)
            for a in s.scalars(
                sa.select(Allocation)
                .where(
                    Allocation.job_id == job_id,
                    Allocation.role == "rollout",
                    Allocation.released_in.is_not(None) if releasing else Allocation.released_in.is_(None),
                )
                .order_by(Allocation.replica)
            )
        ]


def _booked(db: Database) -> int:
    with db.session(read_only=True) as s:
        booked = s.scalar(sa.select(sa.func.sum(Allocation.gpus)).where(sa.not_(Allocation.shared))) or 0
        capacity = s.scalar(sa.select(sa.func.sum(Node.gpus)))
    assert booked <= capacity, (booked, capacity)
    return int(booked)


def test_an_elastic_job_grows_into_idle_gpus_gives_one_back_for_a_job_and_grows_again(
    pool: Database, tmp_path: Path
) -> None:
    dispatcher = CeleryDispatcher(make_broker_app(f"sqla+sqlite:///{tmp_path / 'broker.db'}", tmp_path))
    elastic = _elastic_job(pool)
    assert run_scheduling_pass(pool, dispatcher).admitted == [elastic]
    assert _rollout_rows(pool, elastic) == [(0, "node-0")] and _booked(pool) == 2
    with pool.session() as s:  # its driver is up: its run counts from now
        JobLifecycle(s).transition(elastic, "STARTING", expected_from="ADMITTED", reason="test")

    # 1. Nobody waits, and its driver has asked for both engines: the job grows into the idle GPU
    with pool.session() as s:
        job = s.get(Job, elastic)
        assert job is not None
        job.rollout_wish = 2
    grown = run_scheduling_pass(pool, dispatcher)
    assert grown.resized == [elastic] and not grown.violations
    assert _rollout_rows(pool, elastic) == [(0, "node-0"), (1, "node-0")] and _booked(pool) == 3
    with pool.session(read_only=True) as s:
        job = s.get(Job, elastic)
        assert job is not None and job.total_gpus == 3
        assert job.service_gpu_s <= 0  # the run's service so far was at 2 GPUs: settled when it ends at 3
        # what its driver is told in the answer to its next report
        assert granted_engines(s, job) == [{"node": "node-0", "ray_node_id": "ray-node-0"}] * 2
    assert run_scheduling_pass(pool, dispatcher).resized == []  # at max_replicas: nothing more

    # 2. A job of one GPU arrives: the engine lent out is taken back (no preemption); its GPU stays held until the
    # driver has stopped it, the job nominated for it meanwhile; then the job is admitted there
    other = make_job(pool, name="other", colocated_rollout=False)
    shrunk = run_scheduling_pass(pool, dispatcher)
    assert (shrunk.resized, shrunk.admitted, shrunk.preempted) == ([elastic], [], [])
    assert shrunk.waiting[other].endswith(
        "1 rollout engine taken back for it, held until stopped; 0 jobs ahead"
    )
    assert _rollout_rows(pool, elastic) == [(0, "node-0")] and _booked(pool) == 3
    assert _rollout_rows(pool, elastic, releasing=True) == [(1, "node-0")]
    assert run_scheduling_pass(pool, dispatcher).admitted == []  # not stopped yet: still held
    with (
        pool.session() as s
    ):  # its driver has followed the grant (what its report says, test_elastic_wish_...)
        job = s.get(Job, elastic)
        assert job is not None
        engines, number = rollout_grant(s, job)  # type: ignore[misc]
        assert release_followed(s, job, number - 1) is None  # an older grant: the engine may still run
        assert release_followed(s, job, number) is not None
    assert run_scheduling_pass(pool, dispatcher).admitted == [other]
    assert _rollout_rows(pool, elastic, releasing=True) == [] and _booked(pool) == 3
    with pool.session(read_only=True) as s:
        job = s.get(Job, elastic)
        assert job is not None and job.total_gpus == 2 and job.status == "STARTING"
        reasons = list(
            s.scalars(
                sa.select(JobEvent.reason)
                .where(JobEvent.job_id == elastic, JobEvent.kind == RESIZE_EVENT)
                .order_by(JobEvent.id)
            )
        )
    assert len(reasons) == 2
    assert reasons[0].startswith(
        "rollout 1 -> 2: the pass granted 1 engine (idle GPUs in the pool; the job asked"
    )
    assert reasons[1].startswith(f"rollout 2 -> 1: the pass took back 1 engine ({other} needs GPUs")

    # 3. It ends: the engine comes back
    with pool.session() as s:
        JobLifecycle(s).transition(other, "CANCELLED", expected_from="ADMITTED", reason="test")
    assert run_scheduling_pass(pool, dispatcher).resized == [elastic]
    assert _rollout_rows(pool, elastic) == [(0, "node-0"), (1, "node-0")] and _booked(pool) == 3
    with pool.session(read_only=True) as s:
        rigid = s.get(Job, other)
        assert rigid is not None and granted_engines(s, rigid) is None  # a job not elastic: nothing to follow

    # 4. Requeued (a preemption, a lost node), it is admitted again at its spec's count, its total with it
    with pool.session() as s:
        svc = JobLifecycle(s)
        assert svc.preempt(elastic, "test") == "PREEMPTING"
        svc.transition(elastic, "QUEUED", expected_from="PREEMPTING", reason="test")
    assert run_scheduling_pass(pool, dispatcher).admitted == [elastic]
    assert _rollout_rows(pool, elastic) == [(0, "node-0")] and _booked(pool) == 2
    with pool.session(read_only=True) as s:
        job = s.get(Job, elastic)
        assert job is not None and job.total_gpus == 2


@pytest.fixture
def platform(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """(client signed in as admin, settings, dispatcher): the app over pool `local` of one node of 4 GPUs (its Ray
    node id known)."""
    settings = Settings(
        home=tmp_path,
        database=DatabaseSettings(url=db_url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
    )
    db = Database(db_url)
    key = bootstrap(db, tmp_path, slots=4)
    with db.session() as s:
        for node in s.scalars(sa.select(Node)):
            node.ray_node_id = f"ray-{node.name}"
    dispatcher = CeleryDispatcher(make_broker_app(settings.broker_url, tmp_path))
    app = create_app(settings, db=db, dispatcher=dispatcher)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {key}"
        yield client, settings, dispatcher
    db.dispose()


def _driver(client: TestClient, settings: Settings, job_id: str, attempt: int = 1):  # type: ignore[no-untyped-def]
    """The job's driver: its attempt's token, and a function sending its next report (seq 0, 1, ...) with a wish."""
    secret = bootstrap_secret(settings.signing_key(), job_id, attempt)
    r = client.post(f"/v1/internal/jobs/{job_id}/token", headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 200, r.text
    headers = {"Authorization": f"Bearer {r.json()['token']}"}
    seq = iter(range(1000))

    def report(wish: dict | None = None, **extra: Any) -> dict:
        body = {"attempt": attempt, "seq": next(seq), **({"rollout_wish": wish} if wish else {}), **extra}
        r = client.post(f"/v1/internal/jobs/{job_id}/report", json=body, headers=headers)
        assert r.status_code == 200, r.text
        return r.json()

    return report


def _wish(db: Database, job_id: str) -> tuple[int | None, str | None]:
    with db.session(read_only=True) as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.rollout_wish, job.rollout_wish_reason


def _resizes(db: Database, job_id: str) -> list[str]:
    with db.session(read_only=True) as s:
        return list(
            s.scalars(
                sa.select(JobEvent.reason)
                .where(JobEvent.job_id == job_id, JobEvent.kind == RESIZE_EVENT)
                .order_by(JobEvent.id)
            )
        )


def test_the_pass_grows_an_elastic_job_to_what_its_driver_asks_for_and_takes_back_what_it_no_longer_wants(
    platform,  # type: ignore[no-untyped-def]
) -> None:
    client, settings, dispatcher = platform
    db: Database = client.app.state.db

    def pass_():  # type: ignore[no-untyped-def]
        return run_scheduling_pass(db, dispatcher)

    elastic = _elastic_job(db, most=3)
    assert pass_().admitted == [elastic]
    with db.session() as s:
        JobLifecycle(s).transition(elastic, "STARTING", expected_from="ADMITTED", reason="test")
    report = _driver(client, settings, elastic)

    # 1. Before its driver has asked, 2 GPUs idle and nobody waiting: no growth beyond its spec's one engine
    first = report()
    assert first == {
        "stop_requested": False,
        "rollout_engines": [{"node": "node-0", "ray_node_id": "ray-node-0"}],
        "rollout_grant": first["rollout_grant"],
    }
    assert pass_().resized == [] and _rollout_rows(db, elastic) == [(0, "node-0")]

    # 2. Rollout-bound, it asks for 3: kept on the job with why, and the pass grows it to 3
    report({"step": 4, "engines": 3, "share": 0.72, "threshold": 0.6})
    assert _wish(db, elastic) == (3, "rollout 0.72 of the step > scale_out 0.6")
    grown = pass_()
    assert grown.resized == [elastic] and not grown.violations
    assert _rollout_rows(db, elastic) == [(0, "node-0"), (1, "node-0"), (2, "node-0")] and _booked(db) == 4
    assert len(report()["rollout_engines"]) == 3  # its next answer carries them
    assert pass_().resized == []  # at its wish (and its max)

    # 3. Its engines wait on the trainer, it asks for 1: the pass takes 2 back though nobody waits; their GPUs
    # stay held until the driver reports it runs the new grant (an earlier grant's number frees nothing)
    report({"step": 9, "engines": 1, "share": 0.12, "threshold": 0.2})
    shrunk = pass_()
    assert shrunk.resized == [elastic] and not shrunk.violations
    assert _rollout_rows(db, elastic) == [(0, "node-0")] and _booked(db) == 4
    assert _rollout_rows(db, elastic, releasing=True) == [(1, "node-0"), (1, "node-0")]  # one an engine
    shown = client.get(f"/v1/jobs/{elastic}").json()["allocations"]
    assert sorted((a["role"], a["gpus"], a["releasing"]) for a in shown) == [
        ("actor", 1, False),
        ("rollout", 1, False),
        ("rollout", 1, True),
        ("rollout", 1, True),
    ]
    answer = report()
    assert len(answer["rollout_engines"]) == 1 and answer["rollout_grant"] > first["rollout_grant"]
    report(rollout_followed=first["rollout_grant"])  # the driver still ran an earlier grant
    assert _booked(db) == 4
    report(rollout_followed=answer["rollout_grant"])  # it stopped the two engines: their GPUs are free
    assert _rollout_rows(db, elastic, releasing=True) == [] and _booked(db) == 2
    with db.session(read_only=True) as s:
        stopped = list(
            s.scalars(
                sa.select(JobEvent.reason).where(JobEvent.job_id == elastic, JobEvent.kind == STOPPED_EVENT)
            )
        )
    assert stopped == [
        "the driver has stopped the 2 rollout engines the pass took back: GPUs free (2 on node-0)"
    ]
    with db.session(read_only=True) as s:
        job = s.get(Job, elastic)
        assert job is not None and job.total_gpus == 2
        asked = list(
            s.scalars(
                sa.select(JobEvent.reason)
                .where(JobEvent.job_id == elastic, JobEvent.kind == WISH_EVENT)
                .order_by(JobEvent.id)
            )
        )
    assert asked == [
        "the driver asks for 3 rollout engines after step 4: rollout 0.72 of the step > scale_out 0.6",
        "the driver asks for 1 rollout engine after step 9: rollout 0.12 of the step < scale_in 0.2",
    ]
    resized = _resizes(db, elastic)
    assert resized[0].startswith(
        "rollout 1 -> 3: the pass granted 2 engines (idle GPUs in the pool; the job asked for 2 more: "
        "rollout 0.72 of the step > scale_out 0.6)"
    ), resized
    assert resized[1].startswith(
        "rollout 3 -> 1: the pass took back 2 engines (the job asked for 2 fewer: rollout 0.12 of the step < "
        "scale_in 0.2)"
    ), resized
    assert len(resized) == 2

    # 4. A job whose rollout is not elastic: a wish in its report changes nothing
    rigid = make_job(db, name="rigid")
    assert pass_().admitted == [rigid]
    with db.session() as s:
        JobLifecycle(s).transition(rigid, "STARTING", expected_from="ADMITTED", reason="test")
    assert _driver(client, settings, rigid)({"step": 1, "engines": 2, "share": 0.9, "threshold": 0.6}) == {
        "stop_requested": False
    }
    assert _wish(db, rigid) == (None, None)

    # 5. Requeued and admitted again: a new run asks anew (its spec's count until then)
    with db.session() as s:
        svc = JobLifecycle(s)
        assert svc.preempt(elastic, "test") == "PREEMPTING"
        svc.transition(elastic, "QUEUED", expected_from="PREEMPTING", reason="test")
    assert pass_().admitted == [elastic]
    assert _wish(db, elastic) == (None, None) and _rollout_rows(db, elastic) == [(0, "node-0")]
