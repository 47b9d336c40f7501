"""A pool's nodes follow its Ray cluster's node list (`tasks.sync_pool_nodes`, run by every tick's reconcile
task): the embedded pool's node takes its Ray node id, a node Ray adds joins the pool, and a node Ray loses is
marked down, after which the pass requeues its jobs (to resume from their latest checkpoint). Real SQLite and
PostgreSQL, the real broker; Ray's node list is a fake (tests/ray/test_pinned_placement.py reads a real one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from runtime.launcher import RayNode
from scheduler import tasks
from scheduler.db.engine import Database
from scheduler.db.models import Allocation, Job, JobEvent, Node
from scheduler.dispatch import CeleryDispatcher
from scheduler.domain.jobs import JobStatus
from scheduler.scheduling import run_scheduling_pass
from scheduler.services.auth import Principal
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.submission import JobSubmission, Submission
from scheduler.settings import CelerySettings, DatabaseSettings, Settings
from tests.factories import bootstrap, grpo_spec, make_broker_app

ADMIN = Principal(key_id="key_test", role="admin", team_id=None)
HEAD = "aa" * 28


class FakeRayNodes:
    """Ray's node list as a test sets it."""

    def __init__(self) -> None:
        self.listed: list[RayNode] = []

    def nodes(self) -> list[RayNode]:
        return list(self.listed)


def _node(node_id: str, name: str, *, alive: bool = True, gpus: int = 0) -> RayNode:
    return RayNode(node_id, name, name, alive, {"CPU": 8.0, **({"GPU": float(gpus)} if gpus else {})}, {})


@pytest.fixture
def world(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    db = Database(db_url)
    bootstrap(db, tmp_path, slots=2)
    settings = Settings(
        home=tmp_path,
        database=DatabaseSettings(url=db_url),
        celery=CelerySettings(broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
    )
    app = make_broker_app(settings.broker_url, tmp_path)
    ctx = tasks.WorkerContext(settings=settings, app=app)
    ctx.__dict__["db"] = db
    ctx.__dict__["dispatcher"] = CeleryDispatcher(app)
    ray = FakeRayNodes()
    monkeypatch.setattr(tasks, "launcher_for", lambda address, token=None: ray)
    yield ctx, ray
    db.dispose()


def _nodes(db: Database) -> dict[str, tuple[str | None, int, bool]]:
    with db.session(read_only=True) as s:
        return {n.name: (n.ray_node_id, n.gpus, n.alive) for n in s.scalars(sa.select(Node))}


def test_nodes_follow_ray_and_a_lost_node_requeues_its_jobs(world) -> None:  # type: ignore[no-untyped-def]
    ctx, ray = world
    # the embedded pool's one node (named after the host) is the one Ray node (named by its IP)
    ray.listed = [_node(HEAD, "127.0.0.1")]
    change = tasks.sync_pool_nodes(ctx, "local")
    assert change is not None and not (change.added or change.down)
    assert _nodes(ctx.db) == {"node-0": (HEAD, 2, True)}  # a CPU pool keeps its slots

    with ctx.db.session() as s:
        job, _ = JobSubmission(s, artifact_root=ctx.settings.artifacts, home=ctx.settings.home).submit(
            ADMIN, Submission(spec=grpo_spec(save="ckpt"))
        )
        job_id = job.id
    assert run_scheduling_pass(ctx.db, ctx.dispatcher).admitted == [job_id]
    with ctx.db.session() as s:
        JobLifecycle(s).transition(
            job_id, JobStatus.STARTING, expected_from=JobStatus.ADMITTED, reason="launch"
        )
        JobLifecycle(s).transition(
            job_id, JobStatus.RUNNING, expected_from=JobStatus.STARTING, reason="running"
        )

    # a second Ray node joins the pool under Ray's name and id
    ray.listed.append(_node("bb" * 28, "10.0.0.2"))
    change = tasks.sync_pool_nodes(ctx, "local")
    assert change is not None and change.added == ("10.0.0.2",)
    assert _nodes(ctx.db)["10.0.0.2"] == ("bb" * 28, 8, True)  # on a CPU pool, as many slots as its CPUs

    # Ray loses the head: the node is down, and the next pass requeues the job running there
    ray.listed[0] = _node(HEAD, "127.0.0.1", alive=False)
    change = tasks.sync_pool_nodes(ctx, "local")
    assert change is not None and change.down == ("node-0",)
    assert _nodes(ctx.db)["node-0"][2] is False
    run_scheduling_pass(ctx.db, ctx.dispatcher)
    with ctx.db.session(read_only=True) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == JobStatus.PREEMPTING
        reason = s.scalars(
            sa.select(JobEvent.reason).where(JobEvent.job_id == job_id).order_by(JobEvent.id.desc())
        ).first()
        assert reason is not None and "node-0" in reason and "down" in reason
        assert s.scalar(sa.select(sa.func.count()).select_from(Allocation).where(Allocation.job_id == job_id))
    # Ray brings it back: up again; a node it no longer lists at all goes down
    ray.listed = [_node(HEAD, "127.0.0.1")]
    change = tasks.sync_pool_nodes(ctx, "local")
    assert change is not None and change.up == ("node-0",) and change.down == ("10.0.0.2",)


def test_a_ray_that_does_not_answer_leaves_the_nodes_as_they_are(world, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ctx, _ = world

    def refuse(address: str, token: str | None = None) -> FakeRayNodes:
        raise ConnectionError("refused")

    monkeypatch.setattr(tasks, "launcher_for", refuse)
    assert tasks.sync_pool_nodes(ctx, "local") is None
    assert _nodes(ctx.db) == {"node-0": (None, 2, True)}


def test_ray_nodes_are_not_added_beside_nodes_registered_by_other_names(world) -> None:  # type: ignore[no-untyped-def]
    """A pool whose nodes an admin registered by hostname, on a Ray that names its nodes by IP: the Ray nodes
    may be those, so none is added (their GPUs would count twice); a node named as Ray names it binds."""
    ctx, ray = world
    with ctx.db.session() as s:
        s.add(Node(pool="local", name="10.0.0.3", gpus=2, labels={}))
    ray.listed = [_node(HEAD, "10.0.0.1"), _node("cc" * 28, "10.0.0.3")]
    change = tasks.sync_pool_nodes(ctx, "local")
    assert change is not None and change.skipped == ("10.0.0.1",) and not change.added
    assert _nodes(ctx.db) == {"node-0": (None, 2, True), "10.0.0.3": ("cc" * 28, 2, True)}
