"""Quota: nominal GPUs, borrowing of idle quota, borrowing and lending limits."""

from __future__ import annotations

import pytest

from scheduler.policy import fifo_backfill, schedule
from scheduler.policy.quota import PoolQuota
from tests.unit.policy.snapshots import admitted, decide, nodes, queue, queued, running, snapshot


def test_within_nominal_is_always_admissible():
    quota = PoolQuota([queue("a", 8), queue("b", 8)], 16, {"b": 16})
    assert quota.admissible("a", 8)


def test_borrowing_takes_only_what_others_leave_idle():
    quota = PoolQuota([queue("a", 8), queue("b", 8)], 16, {"a": 8, "b": 4})
    assert quota.borrowing("a") == 0
    assert quota.admissible("a", 4)  # b's 4 idle GPUs
    assert not quota.admissible("a", 5)


def test_borrowing_limit_caps_a_queue_above_nominal():
    quota = PoolQuota([queue("a", 8, borrowing_limit=2), queue("b", 8)], 16)
    assert quota.admissible("a", 10)
    assert not quota.admissible("a", 11)
    assert quota.at_borrowing_limit("a", 11)


def test_lending_limit_keeps_part_of_idle_quota_for_its_owner():
    quota = PoolQuota([queue("a", 8), queue("b", 8, lending_limit=2)], 16)
    assert quota.admissible("a", 10)
    assert not quota.admissible("a", 11)


def test_gpus_no_queue_owns_can_be_borrowed():
    quota = PoolQuota([queue("a", 8)], 24)
    assert quota.admissible("a", 24)
    assert not quota.admissible("a", 25)


def test_share_is_usage_over_weighted_nominal():
    quota = PoolQuota([queue("a", 8, weight=2.0), queue("b", 8)], 16, {"a": 8, "b": 8})
    assert quota.share("a") == pytest.approx(0.5)
    assert quota.share("b") == pytest.approx(1.0)


@pytest.mark.parametrize("policy", [schedule, fifo_backfill])
def test_a_queue_at_its_borrowing_limit_waits_and_says_so(policy):
    snap = snapshot(
        0,
        nodes(2),
        [queue("math", 4, borrowing_limit=4), queue("code", 12)],
        [running("r1", "math", {"n0": 8}), queued("j1", "math", 1)],
    )
    decision = decide(policy, snap)
    assert admitted(decision) == {}
    info = decision.waiting["j1"]
    assert info.code == "quota"
    assert "queue math is at 8/4 of its quota in pool p" in info.reason
    assert "borrowing limit of 4 GPUs" in info.reason


def test_queues_report_usage_against_quota():
    snap = snapshot(
        0,
        nodes(2),
        [queue("math", 4), queue("code", 12)],
        [running("r1", "math", {"n0": 6}), queued("j1", "code", 8), queued("j2", "math", 4)],
    )
    decision = decide(schedule, snap)
    usage = decision.queues
    # Smaller first: math's 4-GPU job borrows code's idle quota; code's 8-GPU job, within its
    # quota, now waits for capacity (and may reclaim after its grace period).
    assert (usage["math"].used_gpus, usage["math"].nominal_gpus, usage["math"].borrowed_gpus) == (10, 4, 6)
    assert (usage["code"].used_gpus, usage["code"].queued_jobs, usage["code"].queued_gpus) == (0, 1, 8)
    # Pools report per-node allocation after the pass's admissions.
    assert decision.pools["p"] == {"n0": 6, "n1": 4}
