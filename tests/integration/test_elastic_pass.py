"""The scheduling pass applies `Decision.resize` (docs/reference/elastic-rollout.md), on SQLite and PostgreSQL: an
elastic job's rollout engines grow into idle GPUs, are taken back for a job that needs them (admitted in the same
pass, instead of a preemption) and come back once it has gone; requeued, it starts again at its spec's count. Each resize is the job's rollout allocation rows
(what its driver is told, `scheduler.services.elastic.granted_engines`), its GPU total and an event, written in
the pass's transaction; no GPU is ever booked twice."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from scheduler.db.engine import Database
from scheduler.db.models import Allocation, Job, JobEvent, Node
from scheduler.dispatch import CeleryDispatcher
from scheduler.scheduling import RESIZE_EVENT, run_scheduling_pass
from scheduler.services.elastic import granted_engines
from scheduler.services.lifecycle import JobLifecycle
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


def _elastic_job(db: Database) -> str:
    """A trainer of 1 GPU and 1 rollout engine of its own, elastic from 1 to 2 engines (as submission stores a
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
            "max_replicas": 2,
        }
        job.demand = {**job.demand, "groups": [*job.demand["groups"], rollout], "total_gpus": 2}
        job.total_gpus = 2
    return job_id


def _rollout_rows(db: Database, job_id: str) -> list[tuple[int, str]]:
    with db.session(read_only=True) as s:
        return [
            (a.replica, a.node)
            for a in s.scalars(
                sa.select(Allocation)
                .where(Allocation.job_id == job_id, Allocation.role == "rollout")
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

    # 1. Nobody waits: the job grows into the idle GPU
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

    # 2. A job of one GPU arrives: the engine lent out is taken back, and the job admitted in the same pass
    other = make_job(pool, name="other", colocated_rollout=False)
    shrunk = run_scheduling_pass(pool, dispatcher)
    assert (shrunk.resized, shrunk.admitted, shrunk.preempted) == ([elastic], [other], [])
    assert _rollout_rows(pool, elastic) == [(0, "node-0")] and _booked(pool) == 3
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
    assert reasons[0].startswith("rollout 1 -> 2: the pass granted 1 engine (idle GPUs in the pool)")
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
