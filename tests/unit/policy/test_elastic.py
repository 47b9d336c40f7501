"""Elastic rollout in the scheduling pass (scheduler/policy/elastic.py): engines taken back before a
preemption, idle GPUs lent to elastic jobs and taken back by anyone."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from scheduler.policy import Assignment, Decision, Gang, JobView, Placement, PolicyConfig, Snapshot, schedule
from scheduler.policy.elastic import as_resize, elastic_gang, plan_shrink, released, resized
from scheduler.policy.invariants import check
from scheduler.policy.pass_state import prepare
from tests.unit.policy.snapshots import admitted, decide, nodes, preempted, queue, queued, snapshot
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
    wish: int | None = None,
    why: str = "",
    priority: int = 0,
    started_at: float = 0.0,
) -> JobView:
    """A running RL job: a trainer on `actor_on` and one 1-GPU engine on each of `engines_on`; its driver asks
    for `wish` engines (`why`), or has not asked (None)."""
    engines = Gang(
        "rollout",
        1,
        len(engines_on),
        min_count=min_count,
        max_count=max_count,
        base_count=base,
        wish=wish,
        wish_reason=why,
    )
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


def after(snap: Snapshot, d: Decision, *, stopped: bool, now: float | None = None) -> Snapshot:
    """The next pass's snapshot once `d` is applied as the platform applies it: resized jobs hold their new
    placement, the GPUs taken back still held (`releasing`) until their drivers have `stopped` those engines;
    admitted jobs run; nominations are the queued jobs'."""
    resized_to = {r.job_id: r for r in d.resize}
    placed = dict(d.admit)
    jobs = []
    for j in snap.jobs:
        if j.id in resized_to:
            r = resized_to[j.id]
            new = dataclasses.replace(j, demand=r.demand, placement=r.placement)
            gone = () if stopped else tuple(released(j, new))
            j = dataclasses.replace(new, releasing=j.releasing + gone if not stopped else ())
        elif j.id in placed:
            j = dataclasses.replace(j, state=JobStatus.RUNNING, placement=placed[j.id], started_at=snap.now)
        elif j.state is JobStatus.QUEUED:
            j = dataclasses.replace(j, nominated_nodes=frozenset(d.nominate.get(j.id, ())))
        elif stopped:
            j = dataclasses.replace(j, releasing=())
        jobs.append(j)
    return dataclasses.replace(snap, now=snap.now + 1 if now is None else now, jobs=tuple(jobs))


def test_a_higher_class_takes_engines_back_instead_of_preempting_the_job():
    # one 8-GPU node: the RL job (trainer 2 GPUs + 6 engines, at least 2) fills it; a 4-GPU job of a
    # higher class arrives. Rigid: the RL job is preempted. Elastic: 4 of its engines go, nothing else; the job
    # waits on the node until the RL job's driver has stopped them (its GPUs held as a preempted job's are).
    rl = rl_job("rl", "a", ["n0"] * 6, min_count=2, base=6)
    hi = queued("hi", "a", 4, priority=10, submit=100.0)
    snap = snapshot(200.0, nodes(1), [queue("a", 8)], [rl, hi])

    rigid = decide(functools.partial(schedule, config=RIGID), snap)
    assert preempted(rigid) == ["rl"] and not rigid.resize

    elastic = decide(schedule, snap)
    assert preempted(elastic) == [] and not elastic.admit
    (r,) = elastic.resize
    assert (r.job_id, r.role, r.before, r.after, r.gpus) == ("rl", "rollout", 6, 2, -4)
    assert sum(g for _, g in r.placement.node_gpus) == 4  # trainer 2 + 2 engines
    assert "hi needs" in r.reason
    assert elastic.nominate == {"hi": ("n0",)} and elastic.waiting["hi"].code == "preempting"
    assert "4 rollout engines taken back for it, held until stopped" in elastic.waiting["hi"].reason
    assert elastic.pools["p"]["n0"] == 8  # this pass places nothing where the engines still run
    # the driver has not stopped them yet: still held, nothing more taken, nobody placed there
    held = decide(schedule, after(snap, elastic, stopped=False))
    assert (
        not held.resize and not held.admit and not preempted(held) and held.waiting["hi"].code == "preempting"
    )
    assert held.nominate == {"hi": ("n0",)}
    # stopped: the job is admitted where they ran
    freed = decide(schedule, after(after(snap, elastic, stopped=False), held, stopped=True))
    assert admitted(freed).keys() == {"hi"} and not freed.resize


def test_engines_are_never_taken_below_min_count():
    # the RL job may give only 2 engines: not enough for a 6-GPU job, which preempts it whole
    rl = rl_job("rl", "a", ["n0"] * 6, min_count=4, base=6)
    hi = queued("hi", "a", 6, priority=10)
    d = decide(schedule, snapshot(200.0, nodes(1), [queue("a", 8)], [rl, hi]))
    assert not d.resize and preempted(d) == ["rl"]


def test_an_equal_job_takes_only_engines_lent_above_base_count():
    # rl grew from its 2 engines to 6 into idle GPUs; a same-class job of another queue may take back
    # the 4 lent ones at once, but not the 2 its spec asked for (it could not preempt rl for them)
    rl = rl_job("rl", "a", ["n0"] * 6, min_count=1, base=2, wish=6)
    small = queued("b4", "b", 4)
    d = decide(schedule, snapshot(200.0, nodes(1), [queue("a", 4), queue("b", 4)], [rl, small]))
    (r,) = d.resize
    assert (r.before, r.after) == (6, 2) and d.nominate == {"b4": ("n0",)}
    big = queued("b5", "b", 5)
    d = decide(schedule, snapshot(200.0, nodes(1), [queue("a", 4), queue("b", 4)], [rl, big]))
    assert not d.resize and not d.admit and not preempted(d)


def test_idle_gpus_grow_elastic_jobs_round_robin_up_to_max_count_and_quota():
    # two RL jobs on two nodes whose drivers ask for all they may have, nobody waiting: they grow one engine at a
    # time, each up to its max (ra asks for 5: held to its max_count 3)
    why = "rollout 0.9 of the step > scale_out 0.6"
    a = rl_job("ra", "a", ["n0"], actor_on="n0", max_count=3, wish=5, why=why)
    b = rl_job("rb", "b", ["n1"], actor_on="n1", max_count=8, wish=8, why=why, started_at=10.0)
    d = decide(schedule, snapshot(300.0, nodes(2), [queue("a", 8), queue("b", 8)], [a, b]))
    grown = {r.job_id: (r.before, r.after) for r in d.resize}
    assert grown == {"ra": (1, 3), "rb": (1, 8)}
    assert {r.job_id: r.reason for r in d.resize} == {
        "ra": f"idle GPUs in the pool; the job asked for 2 more: {why}",
        "rb": f"idle GPUs in the pool; the job asked for 7 more: {why}",
    }
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


IDLE = "rollout 0.12 of the step < scale_in 0.2"
BUSY = "rollout 0.72 of the step > scale_out 0.6"


def test_growth_stops_at_what_the_driver_asks_for_and_at_base_count_before_it_has_asked():
    # one node of 8 GPUs, nobody waiting: a job whose driver has not asked stays at its spec's 2 engines; asked
    # for 4, it grows to 4 (not to its max of 6); shrunk below its spec's count, it gets back to it either way
    snap = lambda rl: snapshot(300.0, nodes(1), [queue("a", 8)], [rl])  # noqa: E731
    assert not decide(schedule, snap(rl_job("rl", "a", ["n0"] * 2, max_count=6, base=2))).resize
    (r,) = decide(schedule, snap(rl_job("rl", "a", ["n0"] * 2, max_count=6, base=2, wish=4, why=BUSY))).resize
    assert (r.before, r.after, r.reason) == (2, 4, f"idle GPUs in the pool; the job asked for 2 more: {BUSY}")
    (r,) = decide(schedule, snap(rl_job("rl", "a", ["n0"], max_count=6, base=2))).resize
    assert (r.before, r.after, r.reason) == (1, 2, "idle GPUs in the pool")
    # elastic_grow off: back to base_count only, even asked for more
    no_grow = functools.partial(schedule, config=PolicyConfig(elastic_grow=False))
    (r,) = decide(no_grow, snap(rl_job("rl", "a", ["n0"], max_count=6, base=2, wish=4, why=BUSY))).resize
    assert (r.before, r.after) == (1, 2)


def test_engines_above_the_wish_go_back_to_the_pool_though_nobody_waits():
    # holding 5 engines, its driver asks for 2: three go back (the newest), never below min_count
    rl = rl_job("rl", "a", ["n0"] * 5, min_count=1, max_count=6, base=3, wish=2, why=IDLE)
    d = decide(schedule, snapshot(300.0, nodes(1), [queue("a", 8)], [rl]))
    (r,) = d.resize
    assert (r.before, r.after, r.gpus) == (5, 2, -3)
    assert r.reason == f"the job asked for 3 fewer: {IDLE}"
    assert sorted(a.replica for a in r.placement.assignments if a.role == "rollout") == [0, 1]
    assert d.pools["p"]["n0"] == 2 + 5  # held until its driver has stopped the three engines ...
    back = decide(schedule, after(snapshot(300.0, nodes(1), [queue("a", 8)], [rl]), d, stopped=True))
    assert not back.resize and back.pools["p"]["n0"] == 2 + 2  # ... then the pool's again
    floor = rl_job("rl", "a", ["n0"] * 3, min_count=2, max_count=6, base=3, wish=1, why=IDLE)
    (r,) = decide(schedule, snapshot(300.0, nodes(1), [queue("a", 8)], [floor])).resize
    assert (r.before, r.after) == (3, 2)  # asked for 1: min_count 2 stays
    at_wish = rl_job("rl", "a", ["n0"] * 2, max_count=6, base=3, wish=2, why=IDLE)
    assert not decide(schedule, snapshot(300.0, nodes(1), [queue("a", 8)], [at_wish])).resize
    rigid = decide(
        functools.partial(schedule, config=RIGID), snapshot(300.0, nodes(1), [queue("a", 8)], [rl])
    )
    assert not rigid.resize


def test_a_job_that_needs_gpus_takes_engines_above_the_wish_first():
    # one node of 8 GPUs, full: x (trainer 1, 3 engines of its spec's 3) asks for 1 engine; y (trainer 1, 3 engines
    # of its spec's 1) asks for its 3. A 2-GPU job of another queue comes: x's two unwanted engines make room, y's
    # two lent ones are not touched (before this change they were the first taken).
    x = rl_job("x", "a", ["n0"] * 3, actor_on="n0", actor_gpus=1, base=3, wish=1, why=IDLE)
    y = rl_job("y", "a", ["n0"] * 3, actor_on="n0", actor_gpus=1, base=1, wish=3, why=BUSY, started_at=5.0)
    job = queued("b2", "b", 2)
    snap = snapshot(300.0, nodes(1), [queue("a", 6), queue("b", 2)], [x, y, job])
    d = decide(schedule, snap)
    assert {r.job_id: (r.before, r.after) for r in d.resize} == {"x": (3, 1)} and not d.admit
    assert (
        d.waiting["b2"].code == "preempting"
    )  # the GPUs x gives back, once its driver has stopped the engines
    assert admitted(decide(schedule, after(snap, d, stopped=True))).keys() == {"b2"}
    # plan_shrink alone orders them so too: x's unwanted engines before y's lent ones
    pools = prepare(snap, Decision())
    p = pools["p"]
    plan = plan_shrink(p.cap, p.quota, job, p.running.values(), set(), {})
    assert plan is not None and [(b.id, elastic_gang(a).count) for b, a in plan] == [("x", 1)]  # type: ignore[union-attr]


def test_engines_given_back_then_taken_for_a_blocked_job_are_one_resize():
    # x holds 4 engines and asks for 3 (one goes back); a higher class job needs 3 GPUs of the full node: it
    # takes two more. One resize, 4 -> 1, with both reasons; the invariants hold (`decide` checks them).
    x = rl_job("x", "a", ["n0"] * 4, actor_on="n0", actor_gpus=4, min_count=1, base=2, wish=3, why=IDLE)
    hi = queued("hi", "a", 3, priority=10)
    d = decide(schedule, snapshot(300.0, nodes(1), [queue("a", 8)], [x, hi]))
    (r,) = d.resize
    assert (r.before, r.after) == (4, 1) and d.nominate == {"hi": ("n0",)} and not preempted(d)
    assert r.reason == f"the job asked for 1 fewer: {IDLE}; then hi needs GPUs its engines hold"


def test_a_wish_needs_an_elastic_gang():
    with pytest.raises(ValueError, match="wish"):
        Gang("rollout", 1, 2, wish=3)
    assert Gang("rollout", 1, 2, min_count=1, max_count=4, wish=9).wanted == 4  # within the range
    assert Gang("rollout", 1, 2, min_count=1, max_count=4, base_count=3).wanted == 3  # before any: base


def test_check_refuses_a_job_placed_where_engines_taken_back_may_still_run():
    # rl fills the node (trainer 2 + 6 engines); taking 4 engines back and placing a 4-GPU job there in the same
    # pass is refused, and so is placing it while the driver has not yet stopped them (`releasing`)
    rl = rl_job("rl", "a", ["n0"] * 6, min_count=2, base=6)
    hi = queued("hi", "a", 4, priority=10)
    there = Placement((Assignment("worker", 0, "n0", 4),))
    shrunk = resized(rl, "rollout", [0, 1])
    same_pass = Decision(resize=[as_resize(rl, shrunk, "test")], admit=[("hi", there)])
    assert check(snapshot(0.0, nodes(1), [queue("a", 8)], [rl, hi]), same_pass) == [
        "node n0 has 12 GPUs allocated of 8"
    ]
    stopping = dataclasses.replace(shrunk, releasing=(("n0", 4),))
    later = Decision(admit=[("hi", there)])
    assert check(snapshot(0.0, nodes(1), [queue("a", 8)], [stopping, hi]), later) == [
        "node n0 has 12 GPUs allocated of 8"
    ]
    assert check(snapshot(0.0, nodes(1), [queue("a", 8)], [shrunk, hi]), later) == []  # stopped: free
