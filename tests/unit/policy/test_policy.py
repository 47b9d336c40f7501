"""Ours and the baselines: order, fair share, priority, aging, backfill, preemption, visibility."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.policy import Node, PolicyConfig, fifo, fifo_backfill, schedule
from tests.unit.policy.snapshots import (
    admitted,
    decide,
    nodes,
    preempted,
    queue,
    queued,
    running,
    snapshot,
)
from wire.jobs import JobStatus

NO_PREEMPTION = PolicyConfig(preempt_to_reclaim=False, preempt_for_priority=False)

# -- order --------------------------------------------------------------------------------------


def test_fair_share_serves_the_queue_using_least_of_its_quota():
    snap = snapshot(
        100,
        nodes(2),
        [queue("a", 8), queue("b", 8)],
        [
            running("ra", "a", {"n0": 6}),
            queued("a1", "a", 2, submit=1),
            queued("b1", "b", 2, submit=50),
        ],
    )
    decision = decide(schedule, snap, config=PolicyConfig(reservations=0))
    # Both fit, but "b" (0 of 8 used) comes before "a" (6 of 8) in the order.
    assert decision.admit[0][0] == "b1"


def test_within_nominal_goes_before_borrowing_among_jobs_of_a_size():
    jobs = [
        running("rb", "b", {"n0": 6}),
        queued("b1", "b", 2, submit=1),
        queued("a1", "a", 2, submit=50),
        queued("a-big", "a", 4, submit=0),
    ]
    snap = snapshot(100, nodes(1), [queue("a", 4), queue("b", 4)], jobs)
    # Size first: both 2-GPU jobs go before the 4-GPU one; of those, a1 stays within nominal.
    decision = decide(schedule, snap, config=NO_PREEMPTION)
    assert [job_id for job_id, _ in decision.admit] == ["a1"]
    assert decision.waiting["b1"].position == 2
    # Quota first: a-big (within nominal) goes before b1 (borrowing) whatever its size.
    decision = decide(schedule, snap, config=PolicyConfig(size_before_quota=False, reservations=0))
    assert decision.waiting["b1"].position == 3


def test_higher_priority_goes_first_within_a_queue():
    snap = snapshot(
        10,
        nodes(1),
        [queue("q", 8)],
        [queued("low", "q", 8, submit=0, priority=0), queued("high", "q", 8, submit=5, priority=10)],
    )
    decision = decide(schedule, snap, config=NO_PREEMPTION)
    assert list(admitted(decision)) == ["high"]
    assert decision.waiting["low"].position == 2


def test_smaller_jobs_go_first_at_equal_priority_and_share():
    snap = snapshot(
        10,
        nodes(1),
        [queue("q", 8)],
        [queued("big", "q", 8, submit=0), queued("small", "q", 1, submit=5)],
    )
    decision = decide(schedule, snap)
    assert list(admitted(decision)) == ["small"]


def test_aging_lifts_a_long_waiting_job_above_newer_ones():
    cfg = PolicyConfig(aging_step_s=600)
    jobs = [queued("big", "q", 8, submit=500), queued("small", "q", 1, submit=1000)]
    early = decide(schedule, snapshot(1000, nodes(1), [queue("q", 8)], jobs), config=cfg)
    late = decide(schedule, snapshot(1300, nodes(1), [queue("q", 8)], jobs), config=cfg)
    assert list(admitted(early)) == ["small"]
    assert list(admitted(late)) == ["big"]


@settings(max_examples=30, deadline=None)
@given(
    arrivals=st.lists(st.integers(min_value=0, max_value=3), min_size=40, max_size=40),
    runtimes=st.lists(st.integers(min_value=1, max_value=6), min_size=160, max_size=160),
    nominal=st.sampled_from([16, 64]),
)
def test_no_job_starves_under_a_stream_of_smaller_jobs(arrivals, runtimes, nominal):
    """A 16-GPU job competes with a stream of 1-GPU jobs that could keep both nodes busy (and,
    with a nominal quota of 16, its queue's quota) forever; aging plus the node or quota it then
    holds must get it admitted within a bounded time."""
    step_s = 600.0
    aging_steps, reserve_steps, longest = 3, 4, 6
    cfg = PolicyConfig(aging_step_s=aging_steps * step_s, reserve_after_s=reserve_steps * step_s)
    node_list = nodes(2)
    queues = [queue("q", nominal)]
    jobs = {"big": queued("big", "q", 8, 2, submit=0)}
    ends: dict[str, int] = {}
    durations = iter(runtimes)
    serial = 0
    for t, count in enumerate(arrivals):
        now = t * step_s
        for job_id in [j for j, end in ends.items() if end <= t]:
            del jobs[job_id], ends[job_id]
        for _ in range(count + 1):
            jobs[f"s{serial}"] = queued(f"s{serial}", "q", 1, submit=now)
            serial += 1
        decision = decide(schedule, snapshot(now, node_list, queues, jobs.values()), config=cfg)
        for job_id, placement in decision.admit:
            if job_id == "big":
                # Aging puts it ahead of every newer job; once it has waited `reserve_after_s` it
                # holds nodes, and what it waits for drains.
                assert t <= max(aging_steps, reserve_steps) + longest
                return
            jobs[job_id] = running(job_id, "q", dict(placement.node_gpus), started_at=now)
            ends[job_id] = t + next(durations, 3)
    raise AssertionError("the 16-GPU job was never admitted")


# -- backfill -----------------------------------------------------------------------------------


def test_backfill_never_uses_the_nodes_held_for_the_head_job():
    # n0 is empty, n1 and n2 run one job each; the 16-GPU head job holds n0 and the
    # emptier of the rest (n1), and the 4-GPU job may only backfill on n2.
    snap = snapshot(
        1000,
        nodes(3),
        [queue("q", 24)],
        [
            running("r1", "q", {"n1": 2}, started_at=0),
            running("r2", "q", {"n2": 3}, started_at=0),
            queued("head", "q", 8, 2, submit=0),
            queued("four", "q", 4, submit=10),
            queued("eight", "q", 8, submit=20),
        ],
    )
    cfg = PolicyConfig(
        aging_step_s=100, preempt_to_reclaim=False, preempt_for_priority=False, reserve_after_s=0
    )
    decision = decide(schedule, snap, config=cfg)
    placed = admitted(decision)
    assert placed["four"].nodes == ("n2",)
    assert "eight" not in placed  # n0 alone would fit it, but n0 is held for the head job
    head = decision.waiting["head"]
    assert head.position == 1 and "holds 2 nodes" in head.reason
    assert "held back for head" in decision.waiting["eight"].reason


def test_a_blocked_job_holds_nodes_only_after_waiting_reserve_after_s():
    def decision_at(now: float):
        snap = snapshot(
            now,
            nodes(2),
            [queue("q", 16)],
            [
                running("r1", "q", {"n1": 2}, started_at=0),
                queued("head", "q", 8, 2, submit=0),
                # Has run 100 GPU-h: behind the fresh head job in the order.
                queued("eight", "q", 8, submit=now - 1, service_gpu_s=100 * 3600),
            ],
        )
        cfg = PolicyConfig(
            reserve_after_s=3600, preempt_to_reclaim=False, preempt_for_priority=False, aging_step_s=1e9
        )
        return decide(schedule, snap, config=cfg)

    # Blocked for less than an hour: no hold, so the 8-GPU job backfills on the empty n0.
    early = decision_at(1800)
    assert admitted(early)["eight"].nodes == ("n0",)
    assert "holds" not in early.waiting["head"].reason
    # After an hour the head job holds both nodes while n1 drains; nothing backfills there.
    late = decision_at(7200)
    assert "eight" not in admitted(late)
    assert "holds 2 nodes" in late.waiting["head"].reason


def test_a_starving_job_takes_victims_past_the_loss_bound_but_never_unsettled_ones():
    # "long" (80 GPU-h, well above the fresh job's tier) checkpointed 30 min ago: past the 10-min
    # loss bound, so a fresh job waits for its next checkpoint, until it has waited
    # `starving_after_s`.
    def snap(now: float, checkpoint: float | None, started_at: float = 0):
        jobs = [
            running("long", "q", {"n0": 8}, started_at=started_at, last_checkpoint_at=checkpoint),
            queued("fresh", "q", 8, submit=35_000),
        ]
        return snapshot(now, nodes(1), [queue("q", 8)], jobs)

    cfg = PolicyConfig(max_victim_loss_s=600, starving_after_s=3600)
    assert preempted(decide(schedule, snap(36_000, 34_200), config=cfg)) == []  # waited 1,000 s
    assert preempted(decide(schedule, snap(38_700, 36_900), config=cfg)) == ["long"]  # 3,700 s
    off = dataclasses.replace(cfg, starving_after_s=None)
    assert preempted(decide(schedule, snap(38_700, 36_900), config=off)) == []
    # A victim that has neither checkpointed in its run nor run `min_runtime_s` is never taken.
    unsettled = snap(38_700, None, started_at=36_000)
    assert preempted(decide(schedule, unsettled, config=cfg)) == []


def test_a_starving_job_may_use_its_aged_tier_to_preempt():
    # Both have run 16 GPU-h (same tier): only the waiting job's aging can give it the tier gap.
    def decision(uses_aging: bool):
        jobs = [
            running("r", "q", {"n0": 8}, started_at=40_000, last_checkpoint_at=47_000, service_gpu_s=0),
            queued("w", "q", 8, submit=0, queued_at=0, service_gpu_s=16 * 3600),
        ]
        snap = snapshot(47_200, nodes(1), [queue("q", 8)], jobs)
        cfg = PolicyConfig(aging_step_s=3600, starving_after_s=3600, starving_uses_aging=uses_aging)
        return decide(schedule, snap, config=cfg)

    assert preempted(decision(False)) == []
    assert preempted(decision(True)) == ["r"]


def test_fifo_blocks_behind_its_head_and_backfill_does_not():
    jobs = [
        running("r", "q", {"n0": 4}),
        queued("head", "q", 8, submit=0),
        queued("small", "q", 2, submit=5),
    ]
    snap = snapshot(10, nodes(1), [queue("q", 8)], jobs)
    strict = decide(fifo, snap)
    greedy = decide(fifo_backfill, snap)
    assert admitted(strict) == {}
    assert strict.waiting["small"].code == "behind_head"
    assert list(admitted(greedy)) == ["small"]


# -- preemption ---------------------------------------------------------------------------------

# Victim-order tests take grace periods, the checkpoint rules and all but one service tier (32 GPU-h)
# out of the way.
EAGER = PolicyConfig(reclaim_after_s=0, min_runtime_s=0, max_victim_loss_s=None, service_tiers=(32.0,))


def test_a_queue_reclaims_lent_gpus_by_preempting_the_cheapest_borrower():
    snap = snapshot(
        10_000,
        nodes(2),
        [queue("owner", 8), queue("borrower", 8)],
        [
            running("b-own", "borrower", {"n0": 8}, started_at=0),
            # Both borrowed; the newest has the least work to lose.
            running("b-old", "borrower", {"n1": 4}, started_at=1_000),
            running("b-new", "borrower", {"n1": 4}, started_at=9_000),
            queued("o1", "owner", 2, submit=9_500),
        ],
    )
    decision = decide(schedule, snap, config=EAGER)
    assert preempted(decision) == ["b-new"]
    assert "queue owner reclaims GPUs lent to queue borrower" in decision.preempt[0][1]
    assert decision.waiting["o1"].code == "preempting"


def test_victims_are_chosen_by_least_work_since_checkpoint():
    snap = snapshot(
        10_000,
        nodes(2),
        [queue("owner", 8), queue("borrower", 8)],
        [
            running("b-own", "borrower", {"n0": 8}, started_at=0),
            running("fresh-ckpt", "borrower", {"n1": 4}, started_at=1_000, last_checkpoint_at=9_900),
            running("no-ckpt", "borrower", {"n1": 4}, started_at=8_000),
            queued("o1", "owner", 2, submit=9_500),
        ],
    )
    assert preempted(decide(schedule, snap, config=EAGER)) == ["fresh-ckpt"]


def test_a_reclaim_waits_for_its_grace_period_and_a_checkpoint():
    def snap(now: float, checkpoint: float | None):
        jobs = [
            running("b", "borrower", {"n0": 8}, started_at=0, last_checkpoint_at=checkpoint),
            queued("o1", "owner", 1, submit=1_000),
        ]
        return snapshot(now, nodes(1), [queue("owner", 4), queue("borrower", 4)], jobs)

    cfg = PolicyConfig(reclaim_after_s=600, max_victim_loss_s=None, service_tiers=(32.0,))
    assert preempted(decide(schedule, snap(1_300, 500), config=cfg)) == []  # o1 waited 300 s
    assert preempted(decide(schedule, snap(1_700, 500), config=cfg)) == ["b"]
    # Without a checkpoint in its current run, b keeps running until min_runtime_s has passed.
    assert preempted(decide(schedule, snap(1_700, None), config=cfg)) == []
    assert preempted(decide(schedule, snap(3_700, None), config=cfg)) == ["b"]


def test_least_attained_service_goes_first_and_may_preempt():
    # "long" has run 10 h on 8 GPUs (80 GPU-h: tier 7, past 64 GPU-h); "young" 13.3 GPU-h (tier 4).
    # A fresh job preempts the one with the most service, though "young" is newer.
    snap = snapshot(
        36_000,
        nodes(2),
        [queue("q", 16)],
        [
            running("long", "q", {"n0": 8}, started_at=0, last_checkpoint_at=35_800),
            running("young", "q", {"n1": 8}, started_at=30_000, last_checkpoint_at=35_900),
            queued("fresh", "q", 8, submit=35_990),
        ],
    )
    decision = decide(schedule, snap)
    assert preempted(decision) == ["long"]
    assert "fresh (0.0 GPU-h run so far" in decision.preempt[0][1]
    assert "goes before it (80.0 GPU-h run)" in decision.preempt[0][1]


def test_a_queue_within_its_quota_keeps_its_jobs_whatever_their_service():
    snap = snapshot(
        36_000,
        nodes(2),
        [queue("q", 8), queue("other", 8)],
        [
            running("long", "other", {"n0": 8}, started_at=0, last_checkpoint_at=35_000),
            running("mine", "q", {"n1": 8}, started_at=35_000),
            queued("fresh", "q", 8, submit=35_990),
        ],
    )
    decision = decide(schedule, snap)
    assert preempted(decision) == []
    assert decision.waiting["fresh"].code == "capacity"


def test_lowest_priority_is_preempted_first_and_at_once():
    snap = snapshot(
        10_000,
        nodes(1),
        [queue("q", 8)],
        [
            running("p5", "q", {"n0": 4}, started_at=9_000, priority=5),
            running("p1", "q", {"n0": 4}, started_at=9_990, priority=1),
            queued("urgent", "q", 4, submit=9_995, priority=10),
        ],
    )
    decision = decide(schedule, snap)
    assert preempted(decision) == ["p1"]
    assert "priority 10" in decision.preempt[0][1]


def test_only_queues_running_on_borrowed_quota_lose_jobs_to_a_reclaim():
    def snap(extra_preemptible: bool):
        return snapshot(
            10_000,
            nodes(2),
            [queue("owner", 8), queue("other", 8), queue("extra", 0)],
            [
                # "other" uses exactly its nominal 8: nothing of it is borrowed, however new.
                running("o-a", "other", {"n0": 4}, started_at=9_900),
                running("o-b", "other", {"n0": 4}, started_at=9_900),
                running("w", "owner", {"n1": 6}, started_at=0),
                # "extra" owns nothing: all it runs is borrowed.
                running("x", "extra", {"n1": 2}, started_at=1_000, preemptible=extra_preemptible),
                queued("o1", "owner", 2, submit=9_500),
            ],
        )

    decision = decide(schedule, snap(True), config=EAGER)
    assert preempted(decision) == ["x"]
    decision = decide(schedule, snap(False), config=EAGER)
    assert preempted(decision) == []
    assert decision.waiting["o1"].code == "capacity"


def test_non_preemptible_jobs_are_never_victims():
    snap = snapshot(
        10_000,
        nodes(1),
        [queue("q", 8)],
        [
            running("keep", "q", {"n0": 8}, started_at=0, priority=0, preemptible=False),
            queued("urgent", "q", 4, priority=10),
        ],
    )
    assert preempted(decide(schedule, snap)) == []


def test_gpus_being_freed_go_to_the_job_they_were_freed_for():
    # "victim" is already PREEMPTING: its 8 GPUs are promised to "o1"; no new victims are taken,
    # and a later job cannot grab them.
    snap = snapshot(
        10_000,
        nodes(2),
        [queue("owner", 8), queue("borrower", 8)],
        [
            running("victim", "borrower", {"n0": 8}, started_at=0, state=JobStatus.PREEMPTING),
            running("b2", "borrower", {"n1": 8}, started_at=5_000),
            queued("o1", "owner", 8, submit=9_500),
            queued("o2", "owner", 8, submit=9_600),
        ],
    )
    # (b2, at 11 GPU-h, is below the one service tier here: nothing may preempt it.)
    config = PolicyConfig(preempt_to_reclaim=False, service_tiers=(32.0,))
    decision = decide(schedule, snap, config=config)
    assert preempted(decision) == []
    assert decision.waiting["o1"].code == "preempting"
    assert decision.waiting["o2"].code == "capacity"


def test_nodes_freed_for_a_job_are_its_even_against_jobs_ahead_of_it():
    def snap(victim_state: JobStatus | None):
        jobs = [
            running("other", "q", {"n1": 8}, started_at=0),
            queued("small", "q", 1, submit=50),  # smaller: ahead of "big" in the order
            dataclasses.replace(queued("big", "q", 8, submit=10), nominated_nodes=frozenset({"n0"})),
        ]
        if victim_state:
            jobs.append(running("victim", "q", {"n0": 8}, started_at=0, state=victim_state))
        return snapshot(100, nodes(2), [queue("q", 16)], jobs)

    # The victim has stopped: "big" gets n0 although "small" comes first.
    decision = decide(schedule, snap(None))
    assert list(admitted(decision)) == ["big"]
    assert decision.waiting["small"].code == "capacity"
    assert decision.nominate == {}
    # The victim is still stopping: the nomination is kept (re-issued) and n0 stays held.
    decision = decide(schedule, snap(JobStatus.PREEMPTING))
    assert decision.nominate == {"big": ("n0",)}
    assert decision.waiting["big"].code == "preempting"
    # The victim never left: nothing is being freed there, so the nomination is dropped.
    decision = decide(schedule, snap(JobStatus.RUNNING), config=NO_PREEMPTION)
    assert decision.nominate == {}


def test_a_preemption_nominates_the_nodes_it_frees():
    snap = snapshot(
        36_000,
        nodes(1),
        [queue("q", 8)],
        [running("long", "q", {"n0": 8}, started_at=0, last_checkpoint_at=35_800), queued("fresh", "q", 8)],
    )
    decision = decide(schedule, snap)
    assert preempted(decision) == ["long"]
    assert decision.nominate == {"fresh": ("n0",)}


def test_a_dead_node_requeues_its_jobs_and_takes_no_new_ones():
    node_list = [Node("n0", "p", 8, alive=False, schedulable=False), Node("n1", "p", 8)]
    snap = snapshot(
        100,
        node_list,
        [queue("q", 16)],
        [running("lost", "q", {"n0": 4, "n1": 4}), queued("new", "q", 4)],
    )
    for policy in (schedule, fifo, fifo_backfill):
        decision = decide(policy, snap)
        assert decision.preempt == [("lost", "node n0 is down or left pool p")]
        assert admitted(decision)["new"].nodes == ("n1",)


# -- visibility ---------------------------------------------------------------------------------


def test_every_waiting_job_has_a_position_and_a_reason_with_numbers():
    snap = snapshot(
        100,
        nodes(2),
        [queue("math", 16), queue("code", 0)],
        [
            running("r", "math", {"n0": 8, "n1": 8}, started_at=0),
            queued("m1", "math", 8, 2, submit=1),
            queued("m2", "math", 1, submit=2),
            queued("m3", "math", 2, submit=3),
            queued("c1", "code", 4, submit=4),
        ],
    )
    decision = decide(schedule, snap)
    waiting = decision.waiting
    assert set(waiting) == {"m1", "m2", "m3", "c1"}
    assert sorted(w.position for w in waiting.values()) == [1, 2, 3, 4]
    assert waiting["m1"].reason == (
        "needs 2 groups of 8 GPUs; queue math is at 16/16 of its quota in pool p; 0 GPUs free for it; "
        f"holds 2 nodes while they drain; GPUs held back for m3 ahead; {waiting['m1'].position - 1} jobs ahead"
    ) or waiting["m1"].reason.startswith("needs 2 groups of 8 GPUs; queue math is at 16/16 of its quota")
    assert waiting["m2"].reason.startswith("needs 1 GPU; queue math is at 16/16 of its quota in pool p")
    # Borrowing in a full pool is waiting for capacity; the reason still shows the quota.
    assert waiting["c1"].code == "capacity"
    assert "queue code is at 0/0 of its quota in pool p; 0 GPUs free for it" in waiting["c1"].reason
    assert waiting["c1"].reason.endswith(f"{waiting['c1'].position - 1} jobs ahead")


def test_a_job_no_node_can_host_says_so():
    snap = snapshot(0, nodes(2), [queue("q", 16)], [queued("huge", "q", 16)])
    decision = decide(schedule, snap)
    assert decision.waiting["huge"].code == "no_fit"


def test_a_job_of_an_unknown_queue_is_reported_not_dropped():
    snap = snapshot(0, nodes(1), [queue("q", 8)], [queued("lost", "nope", 1)])
    info = decide(schedule, snap).waiting["lost"]
    assert info.code == "unknown_queue" and "queue nope does not exist" in info.reason


def test_a_reclaim_never_takes_a_job_that_has_run_less_than_the_reclaiming_one():
    # "o1" was preempted after 40 GPU-h (tier 1); the borrower's job has run 4 GPU-h (tier 0).
    def snap(service_gpu_s: float):
        jobs = [
            running("b", "borrower", {"n0": 8}, started_at=8_200, last_checkpoint_at=9_900),
            queued("o1", "owner", 8, submit=0, queued_at=1_000, service_gpu_s=service_gpu_s),
        ]
        return snapshot(10_000, nodes(1), [queue("owner", 8), queue("borrower", 0)], jobs)

    cfg = dataclasses.replace(EAGER, service_tiers=(32.0,), service_counts_gpus=True)
    assert preempted(decide(schedule, snap(40 * 3600), config=cfg)) == []
    # A fresh owner job reclaims, and so does any job once the rule is off.
    assert preempted(decide(schedule, snap(0), config=cfg)) == ["b"]
    off = dataclasses.replace(cfg, reclaim_respects_service=False)
    assert preempted(decide(schedule, snap(40 * 3600), config=off)) == ["b"]


def test_victims_are_taken_only_soon_after_a_checkpoint():
    def snap(checkpoint: float | None):
        jobs = [
            running("b", "borrower", {"n0": 8}, started_at=0, last_checkpoint_at=checkpoint),
            queued("o1", "owner", 8, submit=1_000),
        ]
        return snapshot(10_000, nodes(1), [queue("owner", 8), queue("borrower", 0)], jobs)

    cfg = dataclasses.replace(EAGER, max_victim_loss_s=600, min_runtime_s=3600)
    assert preempted(decide(schedule, snap(9_500), config=cfg)) == ["b"]  # loses 500 s
    assert preempted(decide(schedule, snap(8_200), config=cfg)) == []  # would lose 1,800 s
    # A job that never checkpoints is still taken once it has run min_runtime_s.
    assert preempted(decide(schedule, snap(None), config=cfg)) == ["b"]
    assert preempted(
        decide(schedule, snap(8_200), config=dataclasses.replace(cfg, max_victim_loss_s=None))
    ) == ["b"]


def test_service_tiers_are_geometric_and_only_a_whole_tier_apart_preempts():
    # Tiers a factor sqrt(2) apart: 10 and 11 GPU-h share a tier, 15 GPU-h is one tier above and
    # 40 GPU-h four.
    def snap(victim_gpu_h: float):
        jobs = [
            running("v", "q", {"n0": 8}, started_at=9_000, last_checkpoint_at=9_900, service_gpu_s=0),
            queued("j", "q", 8, submit=0, queued_at=9_500, service_gpu_s=10 * 3600),
        ]
        jobs[0] = dataclasses.replace(jobs[0], service_gpu_s=victim_gpu_h * 3600 - 8 * 1_000)
        return snapshot(10_000, nodes(1), [queue("q", 8)], jobs)

    cfg = PolicyConfig(service_tiers=tuple(2.0 ** (i / 2) for i in range(27)), preempt_tier_gap=1)
    assert preempted(decide(schedule, snap(11), config=cfg)) == []
    assert preempted(decide(schedule, snap(40), config=cfg)) == ["v"]
    # 15 GPU-h is one tier above 10: enough with a gap of 1, not with the default gap of 2.
    assert preempted(decide(schedule, snap(15), config=cfg)) == ["v"]
    assert preempted(decide(schedule, snap(15), config=dataclasses.replace(cfg, preempt_tier_gap=2))) == []
    assert preempted(decide(schedule, snap(40), config=dataclasses.replace(cfg, preempt_tier_gap=2))) == ["v"]
    # With a single tier at 64 GPU-h, 10 and 40 GPU-h are both in tier 0: no preemption.
    assert preempted(decide(schedule, snap(40), config=dataclasses.replace(cfg, service_tiers=(64.0,)))) == []


def test_a_victim_holding_fewer_gpus_goes_before_a_gang_with_more_service():
    snap = snapshot(
        40_000,
        nodes(1),
        [queue("q", 8)],
        [
            running("gang", "q", {"n0": 4}, started_at=4_000, last_checkpoint_at=39_900),  # 40 GPU-h
            running("one", "q", {"n0": 1}, started_at=4_000, last_checkpoint_at=39_900),  # 10 GPU-h
            queued("fresh", "q", 4, submit=39_990),
        ],
    )
    assert preempted(decide(schedule, snap)) == ["one"]
    assert preempted(decide(schedule, snap, config=PolicyConfig(victims_smallest_first=False))) == ["gang"]
