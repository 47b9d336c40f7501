"""Admission policies over a Snapshot: ours (`schedule`), and the `fifo` / `fifo_backfill` baselines."""

from __future__ import annotations

from collections.abc import Callable

from scheduler.policy.config import DEFAULT_CONFIG, PolicyConfig
from scheduler.policy.holds import can_be_overtaken, claim_incoming, hold_for_head, nodes_after
from scheduler.policy.pass_state import PoolPass, prepare, report
from scheduler.policy.preemption import plan_victims
from scheduler.policy.quota import PoolQuota
from scheduler.policy.ranking import Rank, aging_boost, attained_gpu_s, queued_rank, running_rank
from scheduler.policy.types import Decision, JobView, Placement, Snapshot

__all__ = [
    "DEFAULT_CONFIG",
    "POLICIES",
    "PolicyConfig",
    "admission_order",
    "fifo",
    "fifo_backfill",
    "schedule",
]


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

    Per pool, jobs go in `admission_order`. Each is placed best-fit if its quota allows. A job that
    does not fit may preempt jobs of lower rank (`_victims`), cheapest first; otherwise the first
    blocked jobs hold the nodes closest to fitting them, so that jobs backfilled after them never
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

    1. rank: priority class, then service tier lowered by aging (`ranking.queued_rank`): among
       equals, jobs that have had the least service go first;
    2. smaller jobs first (fewer GPUs): most jobs are small, a wait hurts a short job most, and a
       big job's GPUs would keep many small ones waiting (aging bounds what big jobs pay);
    3. jobs that stay within their queue's nominal quota before jobs that would borrow;
    4. the queue with the lowest dominant share (usage / (weight x nominal)) first;
    5. the longest waiting first.
    (`size_before_quota=False` swaps 2 and 3.)
    """
    quota = p.quota
    shares = {q: quota.share(q) for q in quota.queues}
    used = quota.used
    nominal = {name: q.nominal_gpus for name, q in quota.queues.items()}
    size_first = config.size_before_quota

    def key(job: JobView) -> tuple:
        q = job.queue
        borrows = used[q] + job.total_gpus > nominal[q]
        size = job.total_gpus
        return (
            queued_rank(job, now, config),
            size if size_first else borrows,
            borrows if size_first else size,
            shares[q],
            job.waiting_since,
            job.id,
        )

    return sorted(p.queued, key=key)


def _schedule_pool(p: PoolPass, now: float, config: PolicyConfig, decision: Decision) -> None:
    quota = p.quota
    cap = p.cap
    waiting = decision.waiting
    reservations_left = config.reservations
    plans_left = (
        config.max_preemption_plans if (config.preempt_to_reclaim or config.preempt_for_priority) else 0
    )
    headroom = int(config.small_job_headroom * cap.schedulable_gpus())
    whole_node = cap.largest_node()
    held_for: list[str] = []
    attempts = _Attempts(p)
    # Blocked jobs for which no victims could be found this pass, by what decides eligibility.
    plan_failed: set[tuple] = set()
    # An aged job stopped by its own queue's borrowing limit holds that queue's quota: later jobs
    # of the queue may not take it. Without this, a stream of small jobs keeps a big one's queue
    # just above the line forever.
    held_queues: dict[str, str] = {}
    for i, job in enumerate(admission_order(p, now, config), start=1):
        holder = held_queues.get(job.queue)
        if holder is not None:
            waiting[job.id] = p.wait(job, i, "quota", f"the queue's quota is held for {holder} ahead")
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
            if aging_boost(job, now, config) > 0 and quota.could_ever_admit(job.queue, job.total_gpus):
                held_queues[job.queue] = job.id
            waiting[job.id] = p.wait(job, i, "quota", _quota_note(quota, job))
            continue
        if headroom and job.total_gpus >= whole_node and cap.free_total() - job.total_gpus < headroom:
            # Not a placement failure: the pool's last GPUs are kept for small jobs.
            waiting[job.id] = p.wait(
                job, i, "capacity", f"the last {headroom} free GPUs are kept for small jobs"
            )
            continue
        # Past here the job is within its limits, or it would borrow and the pool is full: then
        # it is blocked by capacity like any other job (and may preempt or hold nodes).
        placement, code = attempts.place(job) if quota_ok else (None, "capacity")
        if placement is not None:
            p.admit(job, placement, decision)
            attempts.admitted()
            continue
        if code == "no_fit":
            waiting[job.id] = p.wait(job, i, "no_fit", "no node of the pool can host one of its groups")
            continue
        if p.incoming and claim_incoming(p, job):
            waiting[job.id] = p.wait(job, i, "preempting", "GPUs being freed by preemptions are held for it")
            continue
        if plans_left > 0:
            plans_left -= 1
            if _preempt_for(p, job, i, now, config, decision, plan_failed):
                continue
        note = f"GPUs held back for {', '.join(held_for)} ahead" if held_for else ""
        if reservations_left > 0 and can_be_overtaken(job):
            reservations_left -= 1
            held = hold_for_head(p, job)
            held_for.append(job.id)
            holding = f"holds {len(held)} node{'s' if len(held) != 1 else ''} while they drain"
            note = f"{holding}; {note}" if note else holding
        waiting[job.id] = p.wait(job, i, "capacity", note)


def _preempt_for(
    p: PoolPass,
    job: JobView,
    position: int,
    now: float,
    config: PolicyConfig,
    decision: Decision,
    failed: set[tuple],
) -> bool:
    """Preempt what the job needs, if it may; the nodes freed are held for it. True if it did."""
    rank = queued_rank(job, now, config)
    reclaim = _may_reclaim(p, job, now, config)
    key = (job.demand, job.node_selector, job.queue, rank, reclaim)
    if key in failed:
        return False
    victims = _victims(p, job, rank, reclaim, now, config)
    if not victims:
        failed.add(key)
        return False
    for node in nodes_after(p, job, [v for v, _ in victims]):
        p.cap.hide(node)
    for v, why in victims:
        decision.preempt.append((v.id, why))
        p.forget_running(v.id)
    n = len(victims)
    decision.waiting[job.id] = p.wait(
        job, position, "preempting", f"preempting {n} job{'s' if n > 1 else ''} for it"
    )
    return True


def _may_reclaim(p: PoolPass, job: JobView, now: float, config: PolicyConfig) -> bool:
    return (
        config.preempt_to_reclaim
        and p.quota.within_nominal(job.queue, job.total_gpus)
        and now - job.waiting_since >= config.reclaim_after_s
    )


def _victims(
    p: PoolPass, job: JobView, rank: Rank, reclaim: bool, now: float, config: PolicyConfig
) -> list[tuple[JobView, str]] | None:
    """Victims for a blocked job, each with the reason, or None.

    Only preemptible jobs of the job's own queue, or of queues running on borrowed quota, are
    ever taken (a queue within its nominal quota keeps its jobs). Among those, a job may take:
    - jobs of a lower priority class, at once;
    - jobs of its class with a worse rank (more attained service than its tier after aging);
    - to reclaim its queue's nominal quota (after `reclaim_after_s`), jobs of borrowing queues;
    the last two only from jobs that have run `min_runtime_s` in their current run.
    """
    quota = p.quota
    by_rank = config.preempt_for_priority
    ranks = p.running_ranks(lambda v: running_rank(v, now, config))
    settled_before = now - config.min_runtime_s

    def rule(v: JobView) -> str | None:
        if not v.preemptible:
            return None
        if v.queue != job.queue and quota.borrowing(v.queue) <= 0:
            return None
        if by_rank and v.priority < job.priority:
            return "class"
        if not _settled(v, settled_before):
            return None
        if by_rank and ranks[v.id] > rank:
            return "service"
        if reclaim and v.queue != job.queue:
            return "reclaim"
        return None

    candidates = [v for v in p.running.values() if rule(v) is not None]
    if not candidates:
        return None
    chosen = plan_victims(
        p.cap,
        quota,
        job,
        candidates,
        p.jobs_on(),
        lambda v: rule(v) is not None,
        now,
        config.restart_cost_s,
        {v.id: ranks[v.id][1] for v in candidates},
    )
    if not chosen:
        return None
    return [(v, _preempt_reason(rule(v) or "", job, v, now)) for v in chosen]


def _settled(v: JobView, settled_before: float) -> bool:
    """Has the running job saved progress in its current run (or run long enough without)?"""
    started = v.started_at
    if started is None:
        return True
    if v.last_checkpoint_at is not None and v.last_checkpoint_at >= started:
        return True
    return started <= settled_before


def _preempt_reason(rule: str, job: JobView, victim: JobView, now: float) -> str:
    if rule == "class":
        return f"{job.id} (priority {job.priority}) needs GPUs held at priority {victim.priority}"
    if rule == "reclaim":
        return f"queue {job.queue} reclaims GPUs lent to queue {victim.queue}, for {job.id}"
    return (
        f"{job.id} ({attained_gpu_s(job, now) / 3600:.1f} GPU-h run so far, waiting "
        f"{(now - job.waiting_since) / 3600:.1f} h) goes before it ({attained_gpu_s(victim, now) / 3600:.1f} GPU-h run)"
    )


def _quota_note(quota: PoolQuota, job: JobView) -> str:
    if quota.at_borrowing_limit(job.queue, job.total_gpus):
        return f"its borrowing limit of {quota.queues[job.queue].borrowing_limit} GPUs is reached"
    return "no idle quota is left to borrow in the pool"


Policy = Callable[..., Decision]

POLICIES: dict[str, Policy] = {"fifo": fifo, "fifo_backfill": fifo_backfill, "ours": schedule}
