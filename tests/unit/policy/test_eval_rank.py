"""A class that counts within its queue's quota only (`JobView.borrow_priority`; the eval class, docs/adr/0011):
before and over its own queue's jobs, and over others' borrowed jobs while it takes back its queue's lent quota;
where it would borrow, it ranks at its team's training class against other queues."""

from __future__ import annotations

from scheduler.policy import PolicyConfig, schedule
from tests.unit.policy.snapshots import admitted, decide, nodes, preempted, queue, queued, running, snapshot

EVAL, TRAINING = 50, 0
NO_PREEMPTION = PolicyConfig(preempt_to_reclaim=False, preempt_for_priority=False)


def _eval(job_id: str, q: str, gpus: int, *, submit: float, borrow: int | None = TRAINING):
    return queued(job_id, q, gpus, submit=submit, priority=EVAL, borrow_priority=borrow)


def test_an_eval_goes_before_its_teams_queued_training_jobs():
    snap = snapshot(
        100,
        nodes(1, 4),
        [queue("a", 4)],
        [
            running("ra", "a", {"n0": 3}),
            queued("train", "a", 1, submit=0, priority=TRAINING),
            _eval("ev", "a", 1, submit=90),
        ],
    )
    decision = decide(schedule, snap, config=NO_PREEMPTION)
    assert list(admitted(decision)) == ["ev"]
    assert decision.waiting["train"].position == 2


def test_an_eval_preempts_its_teams_training_job_at_once_when_it_holds_the_quota():
    # the team's training job holds its whole quota and the pool; it started a second ago and never
    # checkpointed (no service or reclaim victim), yet the eval takes it by class
    snap = snapshot(
        1_000,
        nodes(1, 4),
        [queue("a", 4)],
        [
            running("train", "a", {"n0": 4}, started_at=999, priority=TRAINING),
            _eval("ev", "a", 1, submit=999),
        ],
    )
    decision = decide(schedule, snap)
    assert preempted(decision) == ["train"]
    assert decision.waiting["ev"].code == "preempting"


def test_an_eval_that_would_borrow_takes_its_own_teams_job_not_another_teams_borrowed_one():
    # a uses its nominal 4; b borrows c's idle 2. The eval would borrow: it may take a's training job by class,
    # never b's (same training class as a's: a's class would not take it either)
    def snap(borrow: int | None):
        return snapshot(
            1_000,
            nodes(1, 8),
            [queue("a", 4), queue("b", 2), queue("c", 2)],
            [
                running("a1", "a", {"n0": 2}, started_at=999, priority=TRAINING),
                running("a2", "a", {"n0": 2}, started_at=999, priority=TRAINING),
                running("b1", "b", {"n0": 2}, started_at=999, priority=TRAINING),
                running("b2", "b", {"n0": 2}, started_at=999, priority=TRAINING),
                _eval("ev", "a", 1, submit=999, borrow=borrow),
            ],
        )

    victims = preempted(decide(schedule, snap(TRAINING)))
    assert len(victims) == 1 and victims[0] in {"a1", "a2"}
    # were the eval's class to count everywhere, it would take b's borrowed job (the cheapest victim) to borrow
    assert preempted(decide(schedule, snap(None))) in (["b1"], ["b2"])


def test_an_eval_within_its_quota_takes_back_lent_gpus_at_once():
    # b borrows 2 of a's nominal GPUs; a's eval fits a's nominal quota and takes them back by class at once,
    # where a training job of a waits `reclaim_after_s` (and for a settled victim)
    jobs = [
        running("a1", "a", {"n0": 2}, started_at=999, priority=TRAINING),
        running("b1", "b", {"n0": 4}, started_at=999, priority=TRAINING),
        running("b2", "b", {"n0": 2}, started_at=999, priority=TRAINING),
    ]
    snap = snapshot(
        1_000, nodes(1, 8), [queue("a", 4), queue("b", 4)], [*jobs, _eval("ev", "a", 2, submit=999)]
    )
    assert preempted(decide(schedule, snap)) == ["b2"]
    training = queued("t", "a", 2, submit=999, priority=TRAINING)
    decision = decide(
        schedule, snapshot(1_000, nodes(1, 8), [queue("a", 4), queue("b", 4)], [*jobs, training])
    )
    assert preempted(decision) == []


def test_an_eval_that_would_borrow_goes_after_another_teams_job_within_its_quota():
    # one free GPU, b's idle nominal one: b's job (within quota) gets it, not a's eval that would borrow it
    def snap(borrow: int | None):
        return snapshot(
            1_000,
            nodes(1, 4),
            [queue("a", 2), queue("b", 2)],
            [
                running("a1", "a", {"n0": 2}, started_at=999, priority=TRAINING),
                running("b1", "b", {"n0": 1}, started_at=999, priority=TRAINING),
                queued("b2", "b", 1, submit=999, priority=TRAINING),
                _eval("ev", "a", 1, submit=0, borrow=borrow),
            ],
        )

    decision = decide(schedule, snap(TRAINING), config=NO_PREEMPTION)
    assert list(admitted(decision)) == ["b2"]
    # with preemption, the eval then takes its own team's training job (never b's)
    decision = decide(schedule, snap(TRAINING))
    assert list(admitted(decision)) == ["b2"] and preempted(decision) == ["a1"]
    # were its class to count everywhere, it would take b's GPU first
    assert list(admitted(decide(schedule, snap(None), config=NO_PREEMPTION))) == ["ev"]
