"""Elastic rollout in the scheduling pass (scheduler/policy/elastic.py): engines taken back before a
preemption, idle GPUs lent to elastic jobs and taken back by anyone."""

from __future__ import annotations

import functools

import pytest

from scheduler.policy import Assignment, Decision, Gang, JobView, Placement, PolicyConfig, schedule
from scheduler.policy.elastic import as_resize, resized
from scheduler.policy.invariants import check
from tests.unit.policy.snapshots import decide, nodes, preempted, queue, queued, snapshot
from wire.jobs import JobStatus

RIGID = PolicyConfig(elastic_shrink=False, elastic_grow=False)


def rl_job(
    job_id: str,
    q: str,
    engines_on: list[str],
    *,
    actor_on: str = "n0",
    actor_gpus: int = 2,
    min_count: int = 1,
    max_count: int = 8,
    base: int | None = None,
    priority: int = 0,
    started_at: float = 0.0,
) -> JobView:
    """A running RL job: a trainer on `actor_on` and one 1-GPU engine on each of `engines_on`."""
    engines = Gang("rollout", 1, len(engines_on), min_count=min_count, max_count=max_count, base_count=base)
    placement = Placement(
        (
            Assignment("actor", 0, actor_on, actor_gpus),
            *(Assignment("rollout", r, node, 1) for r, node in enumerate(engines_on)),
        )
    )
    return JobView(
        job_id,
        q,
        started_at,
        (Gang("actor", actor_gpus), engines),
        priority=priority,
        state=JobStatus.RUNNING,
        placement=placement,
        started_at=started_at,
        last_checkpoint_at=started_at,
    )


def test_a_higher_class_takes_engines_back_instead_of_preempting_the_job():
    # one 8-GPU node: the RL job (trainer 2 GPUs + 6 engines, at least 2) fills it; a 4-GPU job of a
    # higher class arrives. Rigid: the RL job is preempted. Elastic: 4 of its engines go, nothing else.
    rl = rl_job("rl", "a", ["n0"] * 6, min_count=2, base=6)
    hi = queued("hi", "a", 4, priority=10, submit=100.0)
    snap = snapshot(200.0, nodes(1), [queue("a", 8)], [rl, hi])

    rigid = decide(functools.partial(schedule, config=RIGID), snap)
    assert preempted(rigid) == ["rl"] and not rigid.resize

    elastic = decide(schedule, snap)
    assert preempted(elastic) == []
    assert [job for job, _ in elastic.admit] == ["hi"]
    (r,) = elastic.resize
    assert (r.job_id, r.role, r.before, r.after, r.gpus) == ("rl", "rollout", 6, 2, -4)
    assert sum(g for _, g in r.placement.node_gpus) == 4  # trainer 2 + 2 engines
    assert "hi needs" in r.reason


def test_engines_are_never_taken_below_min_count():
    # the RL job may give only 2 engines: not enough for a 6-GPU job, which preempts it whole
    rl = rl_job("rl", "a", ["n0"] * 6, min_count=4, base=6)
    hi = queued("hi", "a", 6, priority=10)
    d = decide(schedule, snapshot(200.0, nodes(1), [queue("a", 8)], [rl, hi]))
    assert not d.resize and preempted(d) == ["rl"]


def test_an_equal_job_takes_only_engines_lent_above_base_count():
    # rl grew from its 2 engines to 6 into idle GPUs; a same-class job of another queue may take back
    # the 4 lent ones at once, but not the 2 its spec asked for (it could not preempt rl for them)
    rl = rl_job("rl", "a", ["n0"] * 6, min_count=1, base=2)
    small = queued("b4", "b", 4)
    d = decide(schedule, snapshot(200.0, nodes(1), [queue("a", 4), queue("b", 4)], [rl, small]))
    (r,) = d.resize
    assert (r.before, r.after) == (6, 2) and [j for j, _ in d.admit] == ["b4"]
    big = queued("b5", "b", 5)
    d = decide(schedule, snapshot(200.0, nodes(1), [queue("a", 4), queue("b", 4)], [rl, big]))
    assert not d.resize and not d.admit and not preempted(d)


def test_idle_gpus_grow_elastic_jobs_round_robin_up_to_max_count_and_quota():
    # two RL jobs on two nodes, nobody waiting: they grow one engine at a time, each up to its max
    a = rl_job("ra", "a", ["n0"], actor_on="n0", max_count=3)
    b = rl_job("rb", "b", ["n1"], actor_on="n1", max_count=8, started_at=10.0)
    d = decide(schedule, snapshot(300.0, nodes(2), [queue("a", 8), queue("b", 8)], [a, b]))
    grown = {r.job_id: (r.before, r.after) for r in d.resize}
    assert grown == {"ra": (1, 3), "rb": (1, 8)}
    assert all(r.reason == "idle GPUs in the pool" for r in d.resize)
    # 16 GPUs: ra 2+3, rb 2+8 = 15 (ra stops at its max); a job waiting for capacity stops growth
    waiting = queued("w", "b", 8, count=2)
    d = decide(schedule, snapshot(300.0, nodes(2), [queue("a", 8), queue("b", 8)], [a, b, waiting]))
    assert not d.resize
    d = decide(functools.partial(schedule, config=RIGID), snapshot(300.0, nodes(2), [queue("a", 8)], [a]))
    assert not d.resize


def test_a_gang_outside_its_elastic_range_is_refused():
    with pytest.raises(ValueError, match="min_count"):
        Gang("rollout", 1, 2, min_count=3, max_count=4)
    with pytest.raises(ValueError, match="own"):
        Gang("rollout", 1, 2, min_count=1, colocate_with="actor")


def test_a_shrunk_job_gets_its_engines_back_when_the_gpus_are_idle_again():
    # shrunk to 2 of the 6 engines its spec asks for; nobody waits: back to 6, beyond only with grow
    rl = rl_job("rl", "a", ["n0"] * 2, min_count=1, max_count=8, base=6)
    snap = snapshot(300.0, nodes(1), [queue("a", 8)], [rl])
    no_grow = decide(functools.partial(schedule, config=PolicyConfig(elastic_grow=False)), snap)
    assert [(r.before, r.after) for r in no_grow.resize] == [(2, 6)]
    assert [(r.before, r.after) for r in decide(schedule, snap).resize] == [(2, 6)]  # 2 + 6 fill the node


def test_a_resize_never_leaves_the_range_and_check_reports_one_onto_taken_gpus():
    rl = rl_job("rl", "a", ["n0"] * 2, min_count=2, max_count=4)
    with pytest.raises(ValueError, match="min_count"):
        resized(rl, "rollout", [0])  # one engine: below min_count 2
    other = JobView(
        "x",
        "a",
        0.0,
        (Gang("w", 4),),
        state=JobStatus.RUNNING,
        placement=Placement((Assignment("w", 0, "n0", 4),)),
    )
    snap = snapshot(0.0, nodes(1), [queue("a", 16)], [rl, other])
    extra = [Assignment("rollout", 2, "n0", 1), Assignment("rollout", 3, "n0", 1)]
    decision = Decision(resize=[as_resize(rl, resized(rl, "rollout", [0, 1], extra), "test")])
    assert check(snap, decision) == ["node n0 has 10 GPUs allocated of 8"]
