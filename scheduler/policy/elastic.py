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
allows it: back to its `base_count` after a shrink, and (`PolicyConfig.elastic_grow`) on to what its driver
asks for (`Gang.wanted`: the autoscaler YAML's thresholds decide it, `runtime.rollout.elastic.Autoscaler.ask`;
no further than `base_count` before the driver has asked). `give_back` runs first: a job holding more
replicas than its driver asks for gives the surplus back, whether anyone waits or not, so idle engines
return to the pool.

All return `Resize` records; the caller applies them before the admissions (the running job's demand
and placement change; its driver scales its engines out or in, `runtime.roles.elastic`). GPUs taken back are
not free in the pass that takes them: they stay held (`JobView.releasing`) until the driver reports it has
stopped those engines, as a preempted job's are until it has stopped, and the job they were taken for waits
for them on its nominated nodes, so that it is never placed where an engine still runs.
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
    [(job before, job after)], or None (then capacity and quota are left as found). Replicas above what a
    candidate's driver asks for (`Gang.wanted`) are taken first, then those above its `base_count` (idle
    GPUs lent out: anyone's to take back), then, from the jobs in `may_take_base`, those down to
    `min_count`, cheapest job first (`cost`); within that, the replica on the node with the most GPUs free
    already, so that freed GPUs gather on few nodes. Replicas found unnecessary afterwards are given back.
    On success the chosen replicas' GPUs stay freed in `cap` and `quota`, for the caller to place the job."""
    removable: list[_Replica] = []
    for v in candidates:
        gang = elastic_gang(v)
        if gang is None or gang.count <= gang.floor or v.placement is None:
            continue
        replicas = sorted(_replicas(v, gang.role).items(), reverse=True)  # the newest engines first
        unwanted = max(0, gang.count - gang.wanted)
        lent = max(unwanted, gang.count - gang.base)
        takeable = gang.count - gang.floor if v.id in may_take_base else lent
        for n, (index, parts) in enumerate(replicas[:takeable]):
            tier = 0 if n < unwanted else 1 if n < lent else 2
            removable.append(((tier, *cost.get(v.id, ())), v, gang, index, parts))
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


def give_back(
    quota: PoolQuota, running: Iterable[JobView], incoming: dict[str, int]
) -> list[tuple[JobView, JobView]]:
    """Elastic jobs holding more replicas than their driver asks for (`Gang.wish`, never below `min_count`) give
    the surplus back, the newest replicas first (as a standalone run scales in): their GPUs leave `quota` and are
    `incoming` (held until the driver has stopped those engines, `JobView.releasing`; a blocked job may claim
    them). A job whose driver has not asked keeps what it holds (replicas above its `base_count` are then the
    first a blocked job takes, `plan_shrink`). [(job before, job after)]."""
    out = []
    for v in running:
        gang = elastic_gang(v)
        if gang is None or v.placement is None or gang.wish is None or gang.count <= gang.wanted:
            continue
        replicas = _replicas(v, gang.role)
        order = sorted(replicas)
        for index in order[gang.wanted :]:
            for node, gpus in replicas[index]:
                incoming[node] = incoming.get(node, 0) + gpus
                quota.add(v.queue, -gpus)
        out.append((v, resized(v, gang.role, order[: gang.wanted])))
    return out


def released(before: JobView, after: JobView) -> list[tuple[str, int]]:
    """GPUs per node a resize takes back from the job (held until its driver has stopped those engines)."""
    assert before.placement is not None and after.placement is not None
    new = dict(after.placement.node_gpus)
    return [
        (node, gpus - new.get(node, 0))
        for node, gpus in before.placement.node_gpus
        if gpus > new.get(node, 0)
    ]


def grow(
    cap: PoolCapacity, quota: PoolQuota, running: Iterable[JobView], *, beyond_base: bool = True
) -> list[tuple[JobView, JobView]]:
    """Idle GPUs to elastic jobs below what their driver asks for (`Gang.wanted`: `base_count` before it has asked;
    `beyond_base=False`: never above `base_count`), one replica at a time round the jobs (highest priority,
    then the longest running, first) while a node has room and the job's queue may take more
    (`quota.admissible`: within its borrowing limit and what others lend). [(job before, job after)]."""

    def top(g: Gang) -> int:
        return g.wanted if beyond_base else min(g.wanted, g.base)

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


def asked_fewer(gang: Gang, after: int) -> str:
    """Why `give_back` took engines back: 'the job asked for 1 fewer: rollout 0.12 of the step < scale_in 0.2'."""
    why = f": {gang.wish_reason}" if gang.wish_reason else ""
    return f"the job asked for {gang.count - after} fewer{why}"


def grown_because(gang: Gang, after: int) -> str:
    """Why `grow` granted engines: idle GPUs, and beyond the spec's count the driver's wish for them."""
    if after <= gang.base or gang.wish is None:
        return "idle GPUs in the pool"
    why = f": {gang.wish_reason}" if gang.wish_reason else ""
    return f"idle GPUs in the pool; the job asked for {after - gang.count} more{why}"


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
