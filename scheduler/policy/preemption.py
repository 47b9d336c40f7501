"""Choosing preemption victims by least cost, node by node, so a blocked job's gangs fit whole."""

from __future__ import annotations

from collections.abc import Callable

from scheduler.policy.placement import PoolCapacity, place_demand
from scheduler.policy.quota import PoolQuota
from scheduler.policy.types import JobView

# Borrowing tiers of a victim, cheapest first.
FULLY_BORROWED = 0  # its queue stays at or above nominal without it
PARTLY_BORROWED = 1  # its queue borrows, but would drop below nominal without it
OWN_QUOTA = 2  # its queue is within nominal: only a higher priority in the same queue takes it


def lost_gpu_seconds(job: JobView, now: float, restart_cost_s: float) -> float:
    """What preempting a running job throws away: its work since its last checkpoint (all of this
    run when it has none since it started: the newest jobs lose least) plus the restart."""
    started = job.started_at if job.started_at is not None else now
    safe_point = started
    if job.last_checkpoint_at is not None and job.last_checkpoint_at > started:
        safe_point = job.last_checkpoint_at
    return job.total_gpus * (max(0.0, now - safe_point) + restart_cost_s)


def victim_cost(
    job: JobView, now: float, quota: PoolQuota, restart_cost_s: float, tier: int = 0, size_first: bool = False
) -> tuple:
    """Sort key of a victim, cheapest first: lowest priority; then (with `size_first`) the fewest
    GPUs; then the most attained service (highest service tier); then borrowed before owned; then
    least lost work (the newest and the freshly checkpointed jobs); then the newest; then by id."""
    borrowed = quota.borrowing(job.queue)
    owned = FULLY_BORROWED if borrowed >= job.total_gpus else PARTLY_BORROWED if borrowed > 0 else OWN_QUOTA
    started = job.started_at if job.started_at is not None else now
    size = job.total_gpus if size_first else 0
    return (job.priority, size, -tier, owned, lost_gpu_seconds(job, now, restart_cost_s), -started, job.id)


class _Plan:
    """Victims chosen so far, with their GPUs and quota handed back (undoable)."""

    def __init__(self, cap: PoolCapacity, quota: PoolQuota) -> None:
        self.cap = cap
        self.quota = quota
        self.chosen: list[JobView] = []
        self.ids: set[str] = set()

    def evict(self, v: JobView) -> None:
        self.chosen.append(v)
        self.ids.add(v.id)
        self._move(v, +1)

    def restore(self, v: JobView) -> None:
        self.chosen = [c for c in self.chosen if c.id != v.id]
        self.ids.discard(v.id)
        self._move(v, -1)

    def undo(self) -> None:
        for v in reversed(self.chosen):
            self._move(v, -1)
        self.chosen.clear()
        self.ids.clear()

    def _move(self, v: JobView, sign: int) -> None:
        assert v.placement is not None
        for node, gpus in v.placement.node_gpus:
            if node in self.cap.free:
                (self.cap.give if sign > 0 else self.cap.take)(node, gpus)
        self.quota.add(v.queue, -sign * v.total_gpus)


def plan_victims(
    cap: PoolCapacity,
    quota: PoolQuota,
    job: JobView,
    candidates: list[JobView],
    can_evict: Callable[[JobView], bool],
    now: float,
    restart_cost_s: float,
    tiers: dict[str, int] | None = None,
    size_first: bool = False,
) -> list[JobView] | None:
    """Cheapest set of `candidates` whose removal lets `job` in (quota and placement), or None.

    First, while the job's quota does not allow it, the cheapest victims that free quota go.
    Then replica by replica, biggest first: a replica goes where GPUs are free, else on the node
    that is cheapest to clear, each victim counted once even when it spans several nodes.
    Last, victims found unnecessary are spared. `can_evict` is asked again as victims are taken
    (a queue that stops borrowing stops being fair game). Capacity and quota are left as found.
    """
    evictable = {v.id: v for v in candidates if can_evict(v)}
    if not evictable or sum(v.total_gpus for v in evictable.values()) + cap.free_total() < job.total_gpus:
        return None
    tiers = tiers or {}
    costs = {
        v.id: victim_cost(v, now, quota, restart_cost_s, tiers.get(v.id, 0), size_first)
        for v in evictable.values()
    }
    plan = _Plan(cap, quota)

    def available(v: JobView) -> bool:
        return v.id in evictable and v.id not in plan.ids and can_evict(v)

    # 1. Quota.
    while not quota.admissible(job.queue, job.total_gpus):
        frees = [
            v
            for v in evictable.values()
            if available(v) and (v.queue == job.queue or quota.borrowing(v.queue) > 0)
        ]
        if not frees:
            plan.undo()
            return None
        plan.evict(min(frees, key=lambda v: costs[v.id]))

    # 2. Capacity, replica by replica, on the cheapest node to clear. Only nodes where some
    # candidate runs can be cleared; their candidates are tried cheapest first.
    on_node: dict[str, list[tuple]] = {}
    for v in evictable.values():
        assert v.placement is not None
        for n, _ in v.placement.node_gpus:
            on_node.setdefault(n, []).append(costs[v.id])
    for keys in on_node.values():
        keys.sort()
    taken: list[tuple[str, int]] = []
    ok = True
    selector = job.node_selector
    for gang in sorted((g for g in job.demand if g.colocate_with is None), key=lambda g: -g.gpus):
        for _ in range(gang.count):
            node = cap.best_fit(gang.gpus, selector)
            if node is None:
                best: tuple[tuple, str, list[JobView]] | None = None
                for n, keys in on_node.items():
                    if cap.size.get(n, 0) < gang.gpus or not cap.eligible(n, selector):
                        continue
                    free = cap.free[n]
                    picks: list[JobView] = []
                    for key in keys:
                        if free >= gang.gpus:
                            break
                        v = evictable[key[-1]]
                        if available(v):
                            picks.append(v)
                            free += _gpus_on(v, n)
                    if free < gang.gpus:
                        continue
                    # A node costs as much as its dearest victim's priority, then (with
                    # `size_first`) the GPUs its victims hold, then its dearest victim's service
                    # tier and quota standing, then the work all its victims lose.
                    node_cost = (
                        max((costs[v.id][0] for v in picks), default=-(2**62)),
                        sum(costs[v.id][1] for v in picks),
                        max((costs[v.id][2] for v in picks), default=-(2**62)),
                        max((costs[v.id][3] for v in picks), default=0),
                        sum(costs[v.id][4] for v in picks),
                        len(picks),
                    )
                    if best is None or node_cost < best[0]:
                        best = (node_cost, n, picks)
                if best is None:
                    ok = False
                    break
                for v in best[2]:
                    plan.evict(v)
                node = best[1]
            cap.take(node, gang.gpus)
            taken.append((node, gang.gpus))
        if not ok:
            break
    for node, gpus in taken:
        cap.give(node, gpus)
    if not ok or not take_room(cap, quota, job):
        plan.undo()
        return None

    # 3. Spare victims the job turns out not to need, dearest first.
    for v in sorted(plan.chosen, key=lambda v: costs[v.id], reverse=True):
        plan.restore(v)
        if not take_room(cap, quota, job):
            plan.evict(v)
    chosen = list(plan.chosen)
    plan.undo()
    return chosen or None


def take_room(cap: PoolCapacity, quota: PoolQuota, job: JobView) -> bool:
    """Whether `job` fits `cap` under `quota` now; when it does, its placement's GPUs are taken from `cap`."""
    if not quota.admissible(job.queue, job.total_gpus) or cap.free_total() < job.total_gpus:
        return False
    placement = place_demand(cap, job.demand, job.node_selector)
    if placement is None:
        return False
    for node, gpus in placement.node_gpus:
        cap.give(node, gpus)
    return True


def _gpus_on(job: JobView, node: str) -> int:
    assert job.placement is not None
    return sum(g for n, g in job.placement.node_gpus if n == node)
