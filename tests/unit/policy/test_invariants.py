"""Safety invariants: hold after every pass of every policy on random snapshots; catch real breaks."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.policy import (
    Assignment,
    Decision,
    Gang,
    JobView,
    Node,
    Placement,
    PolicyConfig,
    Queue,
    Snapshot,
    fifo,
    fifo_backfill,
    schedule,
)
from scheduler.policy.invariants import check
from scheduler.policy.placement import PoolCapacity, place_demand
from tests.unit.policy.snapshots import nodes, queue, queued, running, snapshot
from wire.jobs import HOLDING_SLOTS, STOPPING, JobStatus

LABELS = ("gpu=h200", "ib")


@st.composite
def snapshots(draw) -> Snapshot:
    pools = draw(st.sampled_from([("p",), ("p", "q")]))
    node_list = [
        Node(
            f"n{i}",
            draw(st.sampled_from(pools)),
            draw(st.sampled_from([4, 8])),
            labels=frozenset(draw(st.lists(st.sampled_from(LABELS), max_size=2))),
            schedulable=draw(st.booleans().map(lambda b: b or draw(st.integers(0, 4)) > 0)),
            alive=draw(st.integers(0, 9)) > 0,
        )
        for i in range(draw(st.integers(1, 6)))
    ]
    queues = [
        Queue(
            f"q{i}",
            draw(st.sampled_from(pools)),
            f"t{i}",
            draw(st.integers(0, 24)),
            borrowing_limit=draw(st.none() | st.integers(0, 16)),
            lending_limit=draw(st.none() | st.integers(0, 16)),
            weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
        )
        for i in range(draw(st.integers(1, 4)))
    ]
    now = 100_000.0
    jobs: list[JobView] = []
    # Running jobs are placed for real, so the snapshot itself is consistent.
    caps = {}
    for pool in pools:
        cap = PoolCapacity(pool, [n for n in node_list if n.pool == pool])
        cap.blocked.clear()  # jobs may have started before a node was cordoned or died
        cap.index()
        caps[pool] = cap
    for i in range(draw(st.integers(0, 12))):
        q = draw(st.sampled_from(queues))
        demand = draw(demands())
        placement = place_demand(caps[q.pool], demand, frozenset())
        if placement is None:
            continue
        started = draw(st.floats(0, now))
        jobs.append(
            JobView(
                f"r{i}",
                q.name,
                started - 10,
                demand,
                priority=draw(st.integers(0, 3)),
                preemptible=draw(st.integers(0, 5)) > 0,
                state=draw(st.sampled_from(sorted(HOLDING_SLOTS))),
                placement=placement,
                started_at=started,
                last_checkpoint_at=draw(st.none() | st.floats(started, now)),
            )
        )
    for i in range(draw(st.integers(0, 15))):
        q = draw(st.sampled_from(queues + [Queue("ghost", "p", "t", 0)] * (i == 0)))
        jobs.append(
            JobView(
                f"j{i}",
                q.name,
                draw(st.floats(0, now)),
                draw(demands()),
                priority=draw(st.integers(0, 3)),
                node_selector=frozenset(draw(st.lists(st.sampled_from(LABELS), max_size=1))),
                preemptions=draw(st.integers(0, 2)),
            )
        )
    return Snapshot(now, tuple(node_list), tuple(queues), tuple(jobs))


@st.composite
def demands(draw) -> tuple[Gang, ...]:
    gangs = [Gang("actor", draw(st.sampled_from([1, 2, 4, 8])), draw(st.integers(1, 3)), draw(st.booleans()))]
    if draw(st.booleans()):
        gangs.append(Gang("critic", draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 2))))
    if draw(st.booleans()):
        gangs.append(Gang("rollout", 1, draw(st.integers(1, 2)), True, colocate_with="actor"))
    return tuple(gangs)


CONFIGS = [
    PolicyConfig(),
    PolicyConfig(reservations=3, small_job_headroom=0.1, reclaim_after_s=0, aging_step_s=60),
    PolicyConfig(preempt_to_reclaim=False, preempt_for_priority=False, reservations=0),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=snapshots(), config=st.sampled_from(CONFIGS))
def test_every_policy_is_safe_on_random_snapshots(snap, config):
    for policy in (schedule, fifo, fifo_backfill):
        decision = policy(snap, config=config)
        assert check(snap, decision) == [], policy.__name__


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=snapshots())
def test_passes_applied_in_sequence_stay_safe(snap):
    """Apply each decision (admit, preempt) and run the next pass: still safe, and it settles."""
    for _ in range(4):
        decision = schedule(snap)
        assert check(snap, decision) == []
        snap = apply(snap, decision)


def apply(snap: Snapshot, decision: Decision) -> Snapshot:
    placements = dict(decision.admit)
    stopped = {job_id for job_id, _ in decision.preempt}
    jobs = []
    for j in snap.jobs:
        if j.id in placements:
            j = dataclasses.replace(
                j, state=JobStatus.ADMITTED, placement=placements[j.id], started_at=snap.now
            )
        elif j.id in stopped or j.state in STOPPING:
            j = dataclasses.replace(
                j,
                state=JobStatus.QUEUED,
                placement=None,
                started_at=None,
                queued_at=snap.now,
                preemptions=j.preemptions + 1,
            )
        jobs.append(j)
    return Snapshot(snap.now + 60, snap.nodes, snap.queues, tuple(jobs))


# -- the checker catches what it should --------------------------------------------------------


def test_check_reports_a_gpu_allocated_twice():
    snap = snapshot(0, nodes(1), [queue("q", 16)], [running("r", "q", {"n0": 6}), queued("j", "q", 4)])
    bad = Decision(admit=[("j", Placement((Assignment("worker", 0, "n0", 4),)))])
    assert check(snap, bad) == ["node n0 has 10 GPUs allocated of 8"]


def test_check_reports_cordoned_and_dead_nodes():
    node_list = [Node("c", "p", 8, schedulable=False), Node("d", "p", 8, alive=False)]
    snap = snapshot(0, node_list, [queue("q", 16)], [queued("j", "q", 4, 2)])
    bad = Decision(
        admit=[("j", Placement((Assignment("worker", 0, "c", 4), Assignment("worker", 1, "d", 4))))]
    )
    assert check(snap, bad) == ["j placed on cordoned node c", "j placed on dead node d"]


def test_check_reports_a_group_not_placed_whole():
    snap = snapshot(0, nodes(2), [queue("q", 16)], [queued("j", "q", 8, 2)])
    split = Placement((Assignment("worker", 0, "n0", 4), Assignment("worker", 0, "n1", 4)))
    errors = check(snap, Decision(admit=[("j", split)]))
    assert "j: worker[0] split over nodes but must sit on one" in errors
    assert "j: worker[1] is not placed" in errors


def test_check_reports_quota_overruns_and_unexplained_jobs():
    snap = snapshot(
        0,
        nodes(2),
        [queue("q", 4, borrowing_limit=2), queue("o", 12)],
        [queued("j", "q", 8), queued("k", "q", 1)],
    )
    bad = Decision(admit=[("j", Placement((Assignment("worker", 0, "n0", 8),)))])
    errors = check(snap, bad)
    assert "queue q uses 8 GPUs, above nominal 4 + borrowing limit 2" in errors
    assert "queued k neither admitted nor told why it waits" in errors
