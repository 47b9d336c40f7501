"""Admission policies over a Snapshot: ours (`schedule`), and the `fifo` / `fifo_backfill` baselines."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.policy.pass_state import PoolPass, prepare, report
from scheduler.policy.preemption import plan_victims
from scheduler.policy.quota import PoolQuota
from scheduler.policy.types import Decision, JobView, Placement, Snapshot


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Knobs of `schedule` (the baselines take the argument for a common signature and ignore it)."""

    # Waiting this long is worth one priority point: an overtaken job rises until nothing of its
    # class can pass it, so it cannot starve.
    aging_step_s: float = 3600.0
    # Most points aging can add (a low-priority class never climbs above a real high class).
    max_aging_boost: int = 1_000_000
    # Blocked jobs per pool, in admission order, that hold nodes back so that jobs backfilled
    # after them never take the GPUs they wait for.
    reservations: int = 1
    # Share of the pool's GPUs that jobs of a whole node or more leave free, so that small jobs
    # (most jobs, and the ones a wait hurts most) start at once.
    small_job_headroom: float = 0.0
    # A job within its queue's nominal quota may preempt jobs of queues that borrow ...
    preempt_to_reclaim: bool = True
    # ... once it has waited this long for GPUs to free up by themselves.
    reclaim_after_s: float = 0.0
    # A job may preempt lower-priority jobs (of its own queue, or of queues that borrow).
    preempt_for_priority: bool = True
    # Blocked jobs per pool and pass that may plan preemptions (bounds a pass's cost).
    max_preemption_plans: int = 8
    # Cost every victim pays on top of its lost work (restart, reload), to rank victims.
    restart_cost_s: float = 300.0
    # Order by size before quota standing (True), or serve jobs within nominal quota first.
    size_before_quota: bool = True
    # A job aged past jobs that started after it began to wait (they overtook it) may preempt
    # them, instead of waiting for its held nodes to drain.
    evict_overtakers: bool = True


DEFAULT_CONFIG = PolicyConfig()


# --------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------


def fifo(snapshot: Snapshot, *, config: PolicyConfig = DEFAULT_CONFIG) -> Decision:
    """First come, first served: the first job that does not fit blocks every job behind it."""
    return _run_in_submit_order(snapshot, backfill=False)


def fifo_backfill(snapshot: Snapshot, *, config: PolicyConfig = DEFAULT_CONFIG) -> Decision:
    """Submit order, but any later job that fits starts at once (greedy: no reservation)."""
    return _run_in_submit_order(snapshot, backfill=True)


def _run_in_submit_order(snapshot: Snapshot, backfill: bool) -> Decision:
    decision = Decision()
    pools = prepare(snapshot, decision)
    waiting = decision.waiting
    for p in pools.values():
        head: JobView | None = None
        attempts = _Attempts(p)
        for i, job in enumerate(sorted(p.queued, key=_submit_order), start=1):
            if head is not None and not backfill:
                waiting[job.id] = p.wait(job, i, "behind_head", f"{head.id} is first in line")
                continue
            if not attempts.quota_ok(job):
                waiting[job.id] = p.wait(job, i, "quota", _quota_note(p.quota, job))
                head = head or job
                continue
            placement, code = attempts.place(job)
            if placement is None:
                waiting[job.id] = p.wait(job, i, code)
                if head is None and code == "capacity":
                    head = job
                continue
            p.admit(job, placement, decision)
            attempts.admitted()
    report(snapshot, pools, decision)
    return decision


def _submit_order(job: JobView) -> tuple:
    return (job.submit_time, job.id)


class _Attempts:
    """Per-pass memo of answers that only change when something is admitted.

    A long queue holds few distinct demands: once a demand has failed to fit, every identical
    one behind it fails too until GPUs are taken or freed, so each is answered in O(1).
    """

    __slots__ = ("p", "_quota", "_failed")

    def __init__(self, p: PoolPass) -> None:
        self.p = p
        self._quota: dict[tuple[str, int], bool] = {}
        self._failed: dict[tuple, str] = {}

    def quota_ok(self, job: JobView) -> bool:
        key = (job.queue, job.total_gpus)
        ok = self._quota.get(key)
        if ok is None:
            ok = self._quota[key] = self.p.quota.admissible(job.queue, job.total_gpus)
        return ok

    def place(self, job: JobView) -> tuple[Placement | None, str]:
        """A placement, or None and why: "capacity" (not now) or "no_fit" (never in this pool)."""
        shape = (job.demand, job.node_selector)
        code = self._failed.get(shape)
        if code is not None:
            return None, code
        cap = self.p.cap
        placement = cap.place(job) if cap.free_total() >= job.total_gpus else None
        if placement is None:
            self._failed[shape] = code = "no_fit" if self.p.never_fits(job) else "capacity"
            return None, code
        return placement, ""

    def admitted(self) -> None:
        # Quotas moved; GPUs were only taken, so what failed still fails.
        self._quota.clear()

    def freed(self) -> None:
        self._quota.clear()
        self._failed.clear()


# --------------------------------------------------------------------------------------------
# Ours
# --------------------------------------------------------------------------------------------


def schedule(snapshot: Snapshot, *, config: PolicyConfig = DEFAULT_CONFIG) -> Decision:
    """One scheduling pass: admissions with placements, preemptions, and why every other job waits.

    Per pool, jobs go in `admission_order`. Each is placed best-fit if its quota allows; a job
    that does not fit may preempt (to reclaim lent quota, or for priority); otherwise the first
    blocked jobs hold the nodes closest to fitting them, so the jobs backfilled after them never
    delay them.
    """
    decision = Decision()
    pools = prepare(snapshot, decision)
    for p in pools.values():
        _schedule_pool(p, snapshot.now, config, decision)
    report(snapshot, pools, decision)
    return decision


def admission_order(p: PoolPass, now: float, config: PolicyConfig) -> list[JobView]:
    """Queued jobs of a pool, first to be served first.

    1. effective priority: the priority class value plus one point per `aging_step_s` waited;
    2. jobs that stay within their queue's nominal quota before jobs that would borrow;
    3. smaller jobs first (fewer GPUs): most jobs are small, a wait hurts a short job most, and
       a big job's GPUs would keep many small ones waiting; aging bounds what this costs big jobs;
    4. the queue with the lowest dominant share (usage / (weight x nominal)) first;
    5. the longest waiting first.
    """
    quota = p.quota
    step = config.aging_step_s
    boost_cap = config.max_aging_boost
    shares = {q: quota.share(q) for q in quota.queues}
    used = quota.used
    nominal = {name: q.nominal_gpus for name, q in quota.queues.items()}
    size_first = config.size_before_quota

    def key(job: JobView) -> tuple:
        since = job.waiting_since
        boost = min(int((now - since) // step), boost_cap) if step > 0 and now > since else 0
        q = job.queue
        borrows = used[q] + job.total_gpus > nominal[q]
        if size_first:
            return (-(job.priority + boost), job.total_gpus, borrows, shares[q], since, job.id)
        return (-(job.priority + boost), borrows, job.total_gpus, shares[q], since, job.id)

    return sorted(p.queued, key=key)


def _schedule_pool(p: PoolPass, now: float, config: PolicyConfig, decision: Decision) -> None:
    quota = p.quota
    cap = p.cap
    reservations_left = config.reservations
    plans_left = (
        config.max_preemption_plans if (config.preempt_to_reclaim or config.preempt_for_priority) else 0
    )
    headroom = int(config.small_job_headroom * cap.schedulable_gpus())
    whole_node = cap.largest_node()
    held_for: list[str] = []
    attempts = _Attempts(p)
    # Blocked demands for which no victims could be found this pass (per queue and priority).
    plan_failed: set[tuple] = set()
    # An aged job stopped by its own queue's borrowing limit holds that queue's quota: later jobs
    # of the queue may not take it. Without this, a stream of small jobs keeps a big one's queue
    # just above the line forever.
    held_queues: dict[str, str] = {}
    for i, job in enumerate(admission_order(p, now, config), start=1):
        holder = held_queues.get(job.queue)
        if holder is not None:
            decision.waiting[job.id] = p.wait(
                job, i, "quota", f"the queue's quota is held for {holder} ahead"
            )
            continue
        quota_ok = attempts.quota_ok(job)
        if not quota_ok and (
            quota.at_borrowing_limit(job.queue, job.total_gpus) or cap.free_total() >= job.total_gpus
        ):
            # Its queue's limits stop it, or lending limits keep the free GPUs for their owners.
            if plans_left > 0 and config.preempt_for_priority:
                plans_left -= 1
                if _preempt_for(p, job, i, now, config, decision, plan_failed):
                    continue
            if _aged(job, now, config) and quota.could_ever_admit(job.queue, job.total_gpus):
                held_queues[job.queue] = job.id
            decision.waiting[job.id] = p.wait(job, i, "quota", _quota_note(quota, job))
            continue
        if headroom and job.total_gpus >= whole_node and cap.free_total() - job.total_gpus < headroom:
            # Not a placement failure: the pool's last GPUs are kept for small jobs.
            decision.waiting[job.id] = p.wait(
                job, i, "capacity", f"the last {headroom} free GPUs are kept for small jobs"
            )
            continue
        # Past here the job is within its limits, or it would borrow and the pool is full: then
        # it is blocked by capacity like any other job (and may reclaim, preempt or hold nodes).
        placement, code = attempts.place(job) if quota_ok else (None, "capacity")
        if placement is not None:
            p.admit(job, placement, decision)
            attempts.admitted()
            continue
        if code == "no_fit":
            decision.waiting[job.id] = p.wait(
                job, i, "no_fit", "no node of the pool can host one of its groups"
            )
            continue
        if p.incoming and _claim_incoming(p, job):
            decision.waiting[job.id] = p.wait(
                job, i, "preempting", "GPUs being freed by preemptions are held for it"
            )
            continue
        if plans_left > 0:
            plans_left -= 1
            if _preempt_for(p, job, i, now, config, decision, plan_failed):
                continue
        note = f"GPUs held back for {', '.join(held_for)} ahead" if held_for else ""
        if reservations_left > 0 and _can_be_overtaken(job):
            reservations_left -= 1
            held = _reserve(p, job)
            held_for.append(job.id)
            note = "; ".join(
                filter(
                    None, [f"holds {len(held)} node{'s' if len(held) != 1 else ''} while they drain", note]
                )
            )
        decision.waiting[job.id] = p.wait(job, i, "capacity", note)


def _preempt_for(
    p: PoolPass,
    job: JobView,
    position: int,
    now: float,
    config: PolicyConfig,
    decision: Decision,
    failed: set[tuple],
) -> bool:
    """Preempt what the job needs, if it may; the GPUs freed are held for it. True if it did."""
    key = (job.demand, job.node_selector, job.queue, job.priority)
    if key in failed:
        return False
    victims = _plan(p, job, now, config)
    if not victims:
        failed.add(key)
        return False
    for node in _nodes_after(p, job, victims):
        p.cap.hide(node)
    for v in victims:
        decision.preempt.append((v.id, _preempt_reason(p, v, job)))
        p.forget_running(v.id)
    n = len(victims)
    decision.waiting[job.id] = p.wait(
        job, position, "preempting", f"preempting {n} job{'s' if n > 1 else ''} for it"
    )
    return True


def _quota_note(quota: PoolQuota, job: JobView) -> str:
    if quota.at_borrowing_limit(job.queue, job.total_gpus):
        return f"its borrowing limit of {quota.queues[job.queue].borrowing_limit} GPUs is reached"
    return "no idle quota is left to borrow in the pool"


def _aged(job: JobView, now: float, config: PolicyConfig) -> bool:
    return config.aging_step_s > 0 and now - job.waiting_since >= config.aging_step_s


def _can_be_overtaken(job: JobView) -> bool:
    """A lone 1-GPU job fits wherever a later job fits: holding nodes for it only wastes them."""
    return job.total_gpus > 1


def _reserve(p: PoolPass, job: JobView) -> list[str]:
    """Hold back, per replica, the node closest to hosting it: most free GPUs, then fewest jobs.

    Holding is recomputed every pass from the snapshot alone; since nothing new lands on held
    nodes, they only drain, and the same nodes keep being the closest ones: the choice is stable.
    """
    cap = p.cap
    jobs_on = p.jobs_on()
    held: list[str] = []
    selector = job.node_selector
    for gang in sorted((g for g in job.demand if g.colocate_with is None), key=lambda g: -g.gpus):
        for _ in range(gang.count):
            best = None
            for n, size in cap.size.items():
                if (gang.one_node and size < gang.gpus) or not cap.eligible(n, selector):
                    continue
                rank = (-cap.free[n], len(jobs_on[n]), n)
                if best is None or rank < best:
                    best = rank
            if best is None:
                return held
            cap.hide(best[2])
            held.append(best[2])
    return held


def _claim_incoming(p: PoolPass, job: JobView) -> bool:
    """Does the job fit once the jobs already preempting have stopped? Then those GPUs are its."""
    cap = p.cap
    incoming = {n: g for n, g in p.incoming.items() if g > 0 and n not in cap.hidden}
    if not incoming:
        return False
    for node, gpus in incoming.items():
        cap.give(node, gpus)
    placement = cap.place(job)
    if placement is not None:
        for node, gpus in placement.node_gpus:
            cap.give(node, gpus)
    for node, gpus in incoming.items():
        cap.take(node, gpus)
    if placement is None:
        return False
    for node, gpus in placement.node_gpus:
        if node in p.incoming:
            p.incoming[node] = max(0, p.incoming[node] - gpus)
        cap.hide(node)
    return True


def _plan(p: PoolPass, job: JobView, now: float, config: PolicyConfig) -> list[JobView] | None:
    """Victims for a blocked job, or None when it may not preempt or nothing would let it in.

    A job may preempt, among jobs of its own queue or of queues running on borrowed quota:
    - any of them to reclaim its queue's nominal quota (after `reclaim_after_s`);
    - those of lower priority;
    - once aged past them (`evict_overtakers`), those that started after it began to wait:
      they overtook it as backfill, and backfill must not delay the job it passed.
    Jobs of other queues that run within their own nominal quota are never taken.
    """
    quota = p.quota
    age = now - job.waiting_since
    reclaim = (
        config.preempt_to_reclaim
        and quota.within_nominal(job.queue, job.total_gpus)
        and age >= config.reclaim_after_s
    )
    by_priority = config.preempt_for_priority
    boost = _boost(job, now, config)
    overtaken = config.evict_overtakers and boost > 0

    def can_evict(v: JobView) -> bool:
        if not v.preemptible:
            return False
        if v.queue != job.queue and quota.borrowing(v.queue) <= 0:
            return False
        if by_priority and v.priority < job.priority:
            return True
        if overtaken and v.priority < job.priority + boost and (v.started_at or 0.0) >= job.waiting_since:
            return True
        return reclaim and v.queue != job.queue

    candidates: list[JobView] = []
    for q in quota.queues:
        if q == job.queue or quota.borrowing(q) > 0:
            candidates.extend(v for v in p.running_in(q) if can_evict(v))
    if not candidates:
        return None
    return plan_victims(p.cap, quota, job, candidates, p.jobs_on(), can_evict, now, config.restart_cost_s)


def _boost(job: JobView, now: float, config: PolicyConfig) -> int:
    """Priority points a job has earned by waiting."""
    if config.aging_step_s <= 0 or now <= job.waiting_since:
        return 0
    return min(int((now - job.waiting_since) // config.aging_step_s), config.max_aging_boost)


def _nodes_after(p: PoolPass, job: JobView, victims: list[JobView]) -> list[str]:
    """Nodes the job would take once the victims are gone (held back for the rest of the pass)."""
    cap = p.cap
    for v in victims:
        assert v.placement is not None
        for node, gpus in v.placement.node_gpus:
            if node in cap.free:
                cap.give(node, gpus)
    placement = cap.place(job)
    nodes: list[str] = []
    if placement is not None:
        for node, gpus in placement.node_gpus:
            cap.give(node, gpus)
            nodes.append(node)
    for v in victims:
        assert v.placement is not None
        for node, gpus in v.placement.node_gpus:
            if node in cap.free:
                cap.take(node, gpus)
    return nodes


def _preempt_reason(p: PoolPass, victim: JobView, beneficiary: JobView) -> str:
    if victim.queue != beneficiary.queue and victim.priority >= beneficiary.priority:
        return f"queue {beneficiary.queue} reclaims GPUs lent to queue {victim.queue}, for {beneficiary.id}"
    return f"{beneficiary.id} (priority {beneficiary.priority}) needs GPUs held at priority {victim.priority}"


Policy = Callable[..., Decision]

POLICIES: dict[str, Policy] = {"fifo": fifo, "fifo_backfill": fifo_backfill, "ours": schedule}
