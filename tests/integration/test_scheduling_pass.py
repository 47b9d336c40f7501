"""The database-backed scheduling pass with the real policy: one pass at a time across processes,
no GPU booked twice, wait reasons, preemption of borrowed capacity (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from scheduler.db.engine import Database
from scheduler.db.models import Allocation, Job, JobEvent, JobWait, Node
from scheduler.dispatch import CeleryDispatcher
from scheduler.scheduling import _write_waits, run_scheduling_pass
from scheduler.services.auth import Principal
from scheduler.services.lifecycle import JobLifecycle
from tests.factories import bootstrap, make_broker_app, make_job, two_team_gpu_pool

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)


@pytest.fixture
def cluster(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Pool h200 of 4 nodes x 8 GPUs; queues math (16 nominal) and vision (16 nominal)."""
    db = Database(db_url)
    bootstrap(db, tmp_path)
    two_team_gpu_pool(db)
    yield db
    db.dispose()


def _dispatcher(tmp_path: Path) -> CeleryDispatcher:
    return CeleryDispatcher(make_broker_app(f"sqla+sqlite:///{tmp_path / 'broker.db'}", tmp_path))


def _booked(db: Database) -> dict[tuple[str, str], int]:
    with db.session(read_only=True) as s:
        rows = s.execute(
            sa.select(Allocation.pool, Allocation.node, sa.func.sum(Allocation.gpus))
            .where(sa.not_(Allocation.shared))
            .group_by(Allocation.pool, Allocation.node)
        ).all()
        caps = {(n.pool, n.name): n.gpus for n in s.scalars(sa.select(Node))}
    booked = {(p, n): int(g) for p, n, g in rows}
    assert all(g <= caps[k] for k, g in booked.items()), (booked, caps)
    return booked


def test_gangs_are_placed_whole_and_waiting_jobs_say_why(cluster: Database, tmp_path: Path) -> None:
    big = make_job(cluster, queue="math", gpus_per_replica=8, replicas=2, name="big")
    small = [make_job(cluster, queue="vision", gpus_per_replica=1, name=f"s{i}") for i in range(3)]
    r = run_scheduling_pass(cluster, _dispatcher(tmp_path))
    assert not r.violations and set(r.admitted) == {big, *small}
    with cluster.session(read_only=True) as s:
        allocs = s.scalars(
            sa.select(Allocation).where(Allocation.job_id == big, sa.not_(Allocation.shared))
        ).all()
    assert sorted(a.gpus for a in allocs) == [8, 8] and len({a.node for a in allocs}) == 2
    # 13 GPUs are left; a 16-GPU job of math (over its nominal 16) must wait, with the numbers
    waiting = make_job(cluster, queue="math", gpus_per_replica=8, replicas=2, name="waits")
    r = run_scheduling_pass(cluster, _dispatcher(tmp_path))
    assert waiting in r.waiting and "2 groups of 8 GPUs" in r.waiting[waiting]
    with cluster.session(read_only=True) as s:
        job = s.get(Job, waiting)
        assert job.queue_position == 1 and job.wait_reason == r.waiting[waiting]
    _booked(cluster)


def test_two_schedulers_never_double_book(cluster: Database, db_url: str, tmp_path: Path) -> None:
    jobs = [
        make_job(cluster, queue=("math", "vision")[i % 2], gpus_per_replica=(1, 2, 4, 8)[i % 4], name=f"j{i}")
        for i in range(40)
    ]
    env = os.environ | {
        "RELAX_DATABASE_URL": db_url,
        "RELAX_HOME": str(tmp_path),
        "RELAX_BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.db'}",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "scheduler.scheduling", "--passes", "15"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outputs]
    passes = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
    assert len(passes) == 30 and all(not p["violations"] for p in passes)
    admitted = [j for p in passes for j in p["admitted"]]
    assert len(admitted) == len(set(admitted)), "a job was admitted by both schedulers"
    booked = _booked(cluster)
    assert 0 < sum(booked.values()) <= 32
    with cluster.session(read_only=True) as s:
        for job_id in jobs:
            admissions = s.scalar(
                sa.select(sa.func.count())
                .select_from(JobEvent)
                .where(JobEvent.job_id == job_id, JobEvent.to_status == "ADMITTED")
            )
            assert admissions <= 1


def test_lent_capacity_is_taken_back_by_preemption(cluster: Database, tmp_path: Path) -> None:
    from scheduler.policy import PolicyConfig

    # vision borrows all 32 GPUs while math is idle
    lenders = [make_job(cluster, queue="vision", gpus_per_replica=8, name=f"v{i}") for i in range(4)]
    run_scheduling_pass(cluster, _dispatcher(tmp_path))
    with cluster.session() as s:
        svc = JobLifecycle(s)
        for j in lenders:
            svc.transition(j, "STARTING", expected_from="ADMITTED", reason="test")
            svc.transition(j, "RUNNING", expected_from="STARTING", reason="test")
    owner = make_job(cluster, queue="math", gpus_per_replica=8, replicas=2, name="owner")
    config = PolicyConfig(reclaim_after_s=0, min_runtime_s=0)  # reclaim at once in this test
    r = run_scheduling_pass(cluster, _dispatcher(tmp_path), config=config)
    assert owner in r.waiting and len(r.preempted) == 2, r
    with cluster.session(read_only=True) as s:
        statuses = {j: s.get(Job, j).status for j in lenders}
    assert sorted(statuses.values()) == ["PREEMPTING", "PREEMPTING", "RUNNING", "RUNNING"]
    # the freed nodes are nominated for the owner: the next pass keeps them for it
    victims = [j for j, st in statuses.items() if st == "PREEMPTING"]
    with cluster.session(read_only=True) as s:
        victim_nodes = sorted(
            {f"h200/{n}" for n in s.scalars(sa.select(Allocation.node).where(Allocation.job_id.in_(victims)))}
        )
        assert s.get(Job, owner).nominated_nodes == victim_nodes
    # the victims stop (their drivers saved and exited): back to the queue, their GPUs free
    with cluster.session() as s:
        svc = JobLifecycle(s)
        for j in victims:
            svc.transition(j, "QUEUED", expected_from="PREEMPTING", reason="test: stopped")
    r = run_scheduling_pass(cluster, _dispatcher(tmp_path), config=config)
    assert r.admitted == [owner] and not r.preempted, r
    with cluster.session(read_only=True) as s:
        got = s.get(Job, owner)
        assert got.status == "ADMITTED" and got.nominated_nodes is None
        nodes = sorted(
            {f"h200/{n}" for n in s.scalars(sa.select(Allocation.node).where(Allocation.job_id == owner))}
        )
        assert nodes == victim_nodes
        assert all(s.get(Job, j).nominated_nodes is None for j in victims)
    _booked(cluster)


def test_queued_jobs_move_up_when_the_head_is_admitted_and_their_waits_are_written_in_one_statement(
    cluster: Database, tmp_path: Path
) -> None:
    """Each pass rewrites the wait of every queued job whose place or reason moved (`job_waits`, a narrow table
    of its own): on PostgreSQL one statement for all of them; an admitted job's row goes; a job that left
    QUEUED while the pass ran gets none."""
    full = [make_job(cluster, queue="math", gpus_per_replica=8, name=f"full{i}") for i in range(4)]
    r = run_scheduling_pass(cluster, _dispatcher(tmp_path))
    assert set(r.admitted) == set(full)
    queued = [make_job(cluster, queue="vision", gpus_per_replica=8, name=f"q{i}") for i in range(6)]
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append(statement)

    sa.event.listen(cluster.engine, "before_cursor_execute", count)
    try:
        r = run_scheduling_pass(cluster, _dispatcher(tmp_path))
    finally:
        sa.event.remove(cluster.engine, "before_cursor_execute", count)
    assert not r.admitted and set(r.waiting) == set(queued)
    writes = [s for s in statements if "job_waits" in s and s.lstrip().upper().startswith("INSERT")]
    assert len(writes) == 1, statements  # PostgreSQL: one statement; SQLite: one executemany
    with cluster.session(read_only=True) as s:
        places = {j: s.get(Job, j).queue_position for j in queued}
    assert sorted(places.values()) == [1, 2, 3, 4, 5, 6], places
    head = min(places, key=lambda j: places[j])
    assert "5 jobs ahead" in r.waiting[max(places, key=lambda j: places[j])]

    # a job that left QUEUED while a pass ran gets no wait row from it (the pass writes what it read)
    with cluster.session() as s:
        JobLifecycle(s).cancel(queued[-1], ADMIN)
        s.execute(sa.delete(JobWait).where(JobWait.job_id == queued[-1]))
        _write_waits(
            s,
            [{"id": queued[-1], "queue_position": 6, "wait_reason": "stale", "nominated_nodes": ["h200/n0"]}],
        )
    # the head's turn: a running job ends, the next pass admits the head and the others move up
    with cluster.session() as s:
        assert JobLifecycle(s).transition(full[0], "FAILED", expected_from="ADMITTED", reason="test: ended")
        s.execute(sa.delete(Allocation).where(Allocation.job_id == full[0]))
    r = run_scheduling_pass(cluster, _dispatcher(tmp_path))
    assert r.admitted == [head], r
    r = run_scheduling_pass(cluster, _dispatcher(tmp_path))  # the order of a pass counts what it admitted
    with cluster.session(read_only=True) as s:
        assert s.get(Job, head).queue_position is None and s.get(Job, head).wait_reason is None
        left = {j: s.get(Job, j).queue_position for j in queued[:-1] if j != head}
        rows = set(s.scalars(sa.select(JobWait.job_id)))
    assert all(left[j] == places[j] - 1 for j in left), (places, left)  # each moved up one place
    assert rows == set(left), rows


def test_a_queued_jobs_stream_sends_its_new_place_when_a_pass_moves_it(cluster: Database) -> None:
    """The wait is written apart from the job's row (`job_waits`): the stream's status token still sees it."""
    from scheduler.services.stream import JobStream, StreamCursor

    job_id = make_job(cluster, queue="math", gpus_per_replica=8, name="waits")
    stream = JobStream(StreamCursor())

    def poll() -> Job | None:
        with cluster.session(read_only=True) as s:
            return stream.poll(s, s.get(Job, job_id)).status

    assert poll() is not None  # the first poll sends the status
    assert poll() is None  # nothing changed
    for place in (3, 2):
        with cluster.session() as s:
            _write_waits(
                s,
                [
                    {
                        "id": job_id,
                        "queue_position": place,
                        "wait_reason": f"{place - 1} jobs ahead",
                        "nominated_nodes": None,
                    }
                ],
            )
        sent = poll()
        assert sent is not None and sent.queue_position == place, place
        assert poll() is None


def test_the_driver_gets_the_pass_allocations_on_their_ray_nodes(cluster: Database, tmp_path: Path) -> None:
    """The allocation is the placement: the spec the driver fetches carries what the pass wrote, each GPU on its
    node's Ray node id (`jobspec.demand.gpu_nodes`), which the driver pins its bundles to."""
    from jobspec.demand import PLACEMENT_KEY, gpu_nodes
    from scheduler.services.reports import JobReports

    with cluster.session() as s:
        for node in s.scalars(sa.select(Node)):
            node.ray_node_id = f"ray-{node.name}"
    job_id = make_job(cluster, queue="math", gpus_per_replica=8, replicas=2, name="big")
    assert job_id in run_scheduling_pass(cluster, _dispatcher(tmp_path)).admitted
    with cluster.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        spec = JobReports(s).driver_spec(job)
        own = s.scalars(
            sa.select(Allocation)
            .where(Allocation.job_id == job_id, sa.not_(Allocation.shared))
            .order_by(Allocation.replica)
        ).all()
    nodes = gpu_nodes(spec[PLACEMENT_KEY])
    # the actor's 16 GPUs replica by replica on the nodes the pass chose; the colocated rollout holds none of its own
    assert nodes == {"actor": [f"ray-{a.node}" for a in own for _ in range(a.gpus)]}
    assert {p["role"] for p in spec[PLACEMENT_KEY] if p["shared"]} == {"rollout"}


@pytest.mark.parametrize("grant", [None, ["high", "normal"]], ids=["default-grant", "high-granted"])
def test_an_eval_job_preempts_its_teams_training_job_and_borrows_only_as_its_training_class(
    cluster: Database, tmp_path: Path, grant: list[str] | None
) -> None:
    """docs/adr/0011: the eval class ranks above the team's training jobs within its queue; where the eval would
    borrow, it ranks at its team's highest granted training class against other queues' jobs (read by the pass
    from the team's grant), so it never takes another team's borrowed job its training class could not."""
    from scheduler.services.platform import update_queue, update_team

    with cluster.session() as s:  # 8 of the 32 GPUs are nobody's: vision borrows them
        for q in ("math", "vision"):
            update_queue(s, ADMIN, q, {"nominal_gpus": 12})
        update_team(s, ADMIN, "math", {"allowed_priority_classes": grant})
    math = [make_job(cluster, queue="math", gpus_per_replica=4, name=f"m{i}") for i in range(3)]
    vision = [
        make_job(cluster, queue="vision", gpus_per_replica=g, name=f"v{g}-{i}")
        for i, g in enumerate((8, 8, 4))
    ]
    r = run_scheduling_pass(cluster, _dispatcher(tmp_path))
    assert set(r.admitted) == {*math, *vision}, r
    # math at its nominal 12, vision borrowing 8, the pool full: math's eval would borrow 4
    ev = make_job(cluster, queue="math", gpus_per_replica=4, priority_class="eval", name="eval")
    r = run_scheduling_pass(cluster, _dispatcher(tmp_path))
    assert ev in r.waiting and len(r.preempted) == 1, r
    if grant is None:  # training at `normal`: vision's `normal` jobs are not its to take, its own team's are
        assert r.preempted[0] in math
    else:  # math may train at `high`: beyond its quota the eval ranks at min(eval, high) = eval
        assert r.preempted == [vision[2]]
    with cluster.session() as s:
        JobLifecycle(s).transition(
            r.preempted[0], "QUEUED", expected_from="PREEMPTING", reason="test: stopped"
        )
    r = run_scheduling_pass(cluster, _dispatcher(tmp_path))
    assert r.admitted == [ev] and not r.preempted, r
    _booked(cluster)
