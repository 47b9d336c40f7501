"""Elastic rollout in the scheduling pass: shrink elastic jobs before preempting whole ones, and grow them
into idle GPUs.

A job with `--autoscaler-config` has an elastic gang (its rollout engines, `Gang.min_count` ..
`Gang.max_count`, `count` held now, `base_count` asked by its spec). Taking an engine back costs the job
no lost work and no restart (the engine drains its requests and stops, `--scale-in-*`; the job goes on
with fewer engines), where a preemption throws away the work since the victim's checkpoint and a
restart. So a blocked job first tries `plan_shrink`: replicas above a job's `base_count` (grown into
idle GPUs) are anyone's to take back; replicas between `min_count` and `base_count` only a job that
could preempt that job takes. Only when shrinking cannot make room does the pass preempt.

`grow` runs last in a pool's pass, only when no job of the pool is left waiting for capacity: each
elastic job gets one more replica at a time, in rank order, where a node has room and its queue's quota
allows it: back to its `base_count` after a shrink, and (`PolicyConfig.elastic_grow`) on to `max_count`.

Both return `Resize` records; the caller applies them before the admissions (the running job's demand
and placement change; its driver scales its engines out or in, `runtime.roles.elastic`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from scheduler.policy.placement import PoolCapacity
from scheduler.policy.preemption import take_room
from scheduler.policy.quota import PoolQuota
from scheduler.policy.types import Assignment, Gang, JobView, Placement, Resize

# One removable replica: (cost key, job, its elastic gang, replica index, [(node, gpus)])
_Replica = tuple[tuple, JobView, Gang, int, list[tuple[str, int]]]


def elastic_gang(job: JobView) -> Gang | None:
    """The job's elastic gang (at most one: its rollout engines), or None."""
    return next((g for g in job.demand if g.elastic and g.colocate_with is None), None)


def shrinkable_gpus(job: JobView) -> int:
    gang = elastic_gang(job)
    return 0 if gang is None else (gang.count - gang.floor) * gang.gpus


def resized(job: JobView, role: str, keep: Iterable[int], added: Iterable[Assignment] = ()) -> JobView:
    """The job with only replicas `keep` of `role` (plus `added` assignments of new replicas): its demand's
    count and its placement follow."""
    keep = set(keep)
    assert job.placement is not None
    assignments = [a for a in job.placement.assignments if a.role != role or a.replica in keep]
    assignments.extend(added)
    # the role's replicas numbered 0.. again, in their old order (the driver's engines are a list too)
    number = {r: i for i, r in enumerate(sorted({a.replica for a in assignments if a.role == role}))}
    assignments = [
        dataclasses.replace(a, replica=number[a.replica]) if a.role == role else a for a in assignments
    ]
    count = len(number)
    demand = tuple(dataclasses.replace(g, count=count) if g.role == role else g for g in job.demand)
    return dataclasses.replace(job, demand=demand, placement=Placement(tuple(assignments)))


def _replicas(job: JobView, role: str) -> dict[int, list[tuple[str, int]]]:
    assert job.placement is not None
    out: dict[int, list[tuple[str, int]]] = {}
    for a in job.placement.assignments:
        if a.role == role and not a.shared:
            out.setdefault(a.replica, []).append((a.node, a.gpus))
    return out


def plan_shrink(
    cap: PoolCapacity,
    quota: PoolQuota,
    job: JobView,
    candidates: Iterable[JobView],
    may_take_base: set[str],
    cost: dict[str, tuple],
) -> list[tuple[JobView, JobView]] | None:
    """The fewest engines to take back from `candidates` so that `job` fits (quota and placement), as
    [(job before, job after)], or None (then capacity and quota are left as found). Replicas above a
    candidate's `base_count` are taken first (they were idle GPUs lent out), then, from the jobs in
    `may_take_base`, those down to `min_count`, cheapest job first (`cost`); within that, the replica on
    the node with the most GPUs free already, so that freed GPUs gather on few nodes. Replicas found
    unnecessary afterwards are given back. On success the chosen replicas' GPUs stay freed in `cap` and
    `quota`, for the caller to place the job."""
    removable: list[_Replica] = []
    for v in candidates:
        gang = elastic_gang(v)
        if gang is None or gang.count <= gang.floor or v.placement is None:
            continue
        replicas = sorted(_replicas(v, gang.role).items(), reverse=True)  # the newest engines first
        lent = max(0, gang.count - gang.base)
        takeable = gang.count - gang.floor if v.id in may_take_base else lent
        for n, (index, parts) in enumerate(replicas[:takeable]):
            removable.append(((0 if n < lent else 1, *cost.get(v.id, ())), v, gang, index, parts))
    if sum(sum(g for _, g in r[4]) for r in removable) + cap.free_total() < job.total_gpus:
        return None
    taken: list[_Replica] = []
    left = list(removable)
    while not take_room(cap, quota, job):
        if not left:
            _give_back(cap, quota, taken)
            return None
        best = min(left, key=lambda r: (r[0], -max(cap.free[n] for n, _ in r[4])))
        left.remove(best)
        _take(cap, quota, best, +1)
        taken.append(best)
    for r in sorted(taken, key=lambda r: r[0], reverse=True):  # spare the dearest first
        _take(cap, quota, r, -1)
        if take_room(cap, quota, job):
            taken.remove(r)
        else:
            _take(cap, quota, r, +1)
    out: dict[str, tuple[JobView, set[int]]] = {}
    for _, v, _gang, index, _parts in taken:
        out.setdefault(v.id, (v, set()))[1].add(index)
    result = []
    for v, gone in out.values():
        gang = elastic_gang(v)
        assert gang is not None
        keep = set(_replicas(v, gang.role)) - gone
        result.append((v, resized(v, gang.role, keep)))
    return result


def _take(cap: PoolCapacity, quota: PoolQuota, r: _Replica, sign: int) -> None:
    """Free (+1) or re-take (-1) one replica's GPUs."""
    _, v, _, _, parts = r
    for node, gpus in parts:
        if node in cap.free:
            (cap.give if sign > 0 else cap.take)(node, gpus)
        quota.add(v.queue, -sign * gpus)


def _give_back(cap: PoolCapacity, quota: PoolQuota, taken: list[_Replica]) -> None:
    for r in reversed(taken):
        _take(cap, quota, r, -1)


def grow(
    cap: PoolCapacity, quota: PoolQuota, running: Iterable[JobView], *, beyond_base: bool = True
) -> list[tuple[JobView, JobView]]:
    """Idle GPUs to elastic jobs below their `max_count` (`beyond_base=False`: only back up to their
    `base_count`), one replica at a time round the jobs (highest priority, then the longest running,
    first) while a node has room and the job's queue may take more (`quota.admissible`: within its
    borrowing limit and what others lend). [(job before, job after)]."""

    def top(g: Gang) -> int:
        return g.ceiling if beyond_base else max(g.count, g.base)

    jobs = sorted(
        (v for v in running if (g := elastic_gang(v)) is not None and g.count < top(g)),
        key=lambda v: (-v.priority, v.started_at if v.started_at is not None else 0.0, v.id),
    )
    before = {v.id: v for v in jobs}
    current = dict(before)
    open_ = list(jobs)
    while open_ and cap.free_total() > 0:
        still = []
        for v in open_:
            v = current[v.id]
            gang = elastic_gang(v)
            assert gang is not None and v.placement is not None
            node = cap.best_fit(gang.gpus, v.node_selector)  # a new replica goes on one node
            if node is None or not quota.admissible(v.queue, gang.gpus):
                continue
            cap.take(node, gang.gpus)
            quota.add(v.queue, gang.gpus)
            index = max(_replicas(v, gang.role), default=-1) + 1
            new = resized(
                v, gang.role, _replicas(v, gang.role), [Assignment(gang.role, index, node, gang.gpus)]
            )
            current[v.id] = new
            if elastic_gang(new).count < top(gang):  # type: ignore[union-attr]
                still.append(new)
        open_ = still
    return [(before[i], current[i]) for i in before if current[i] is not before[i]]


def as_resize(before: JobView, after: JobView, reason: str) -> Resize:
    gang_before, gang_after = elastic_gang(before), elastic_gang(after)
    assert gang_before is not None and gang_after is not None and after.placement is not None
    return Resize(
        before.id,
        gang_before.role,
        gang_before.count,
        gang_after.count,
        after.demand,
        after.placement,
        reason,
    )
