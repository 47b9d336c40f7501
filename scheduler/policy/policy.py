"""Admission policies over a Snapshot: ours (`schedule`), and the `fifo` / `fifo_backfill` baselines."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

from scheduler.policy.config import DEFAULT_CONFIG, PolicyConfig
from scheduler.policy.elastic import (
    as_resize,
    asked_fewer,
    elastic_gang,
    give_back,
    grow,
    grown_because,
    plan_shrink,
    released,
    shrinkable_gpus,
)
from scheduler.policy.holds import can_be_overtaken, claim_incoming, hold_for_head, nodes_after
from scheduler.policy.pass_state import PoolPass, prepare, report
from scheduler.policy.preemption import plan_victims
from scheduler.policy.quota import PoolQuota
from scheduler.policy.ranking import aging_boost, attained_gpu_s, tier_function
from scheduler.policy.types import Decision, JobView, Placement, Resize, Snapshot

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
    does not fit may preempt jobs of lower rank (`_eligible`, `_victims`), cheapest first; otherwise the first
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

    1. rank: priority class (`borrow_priority` instead for a job that has one and would borrow), then
       service tier (`ranking.tier_function`) lowered by aging: among equals, jobs that have had the least
       service go first;
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
    tier_of = tier_function(config)
    step = config.aging_step_s
    boost_cap = config.max_aging_boost

    def key(job: JobView) -> tuple:
        q = job.queue
        since = job.submit_time if job.queued_at is None else job.queued_at
        tier = tier_of(job, now)
        if step > 0 and now > since:
            tier -= min(int((now - since) // step), boost_cap)
        size = job.total_gpus
        borrows = used[q] + size > nominal[q]
        prio = job.priority
        if borrows and job.borrow_priority is not None:
            prio = job.borrow_priority  # a class that counts within the queue's quota only
        return (
            -prio,
            tier,
            size if size_first else borrows,
            borrows if size_first else size,
            shares[q],
            since,
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
    tier_of = tier_function(config)
    # Blocked jobs for which no victims could be found this pass, by what decides eligibility.
    plan_failed: set[tuple] = set()
    # An aged job stopped by its own queue's borrowing limit holds that queue's quota: later jobs
    # of the queue may not take it. Without this, a stream of small jobs keeps a big one's queue
    # just above the line forever.
    held_queues: dict[str, str] = {}
    tail_note: str | None = None
    if config.elastic_shrink or config.elastic_grow:
        # Engines above what their job's driver asks for go back to the pool first, whoever waits.
        returned = give_back(quota, p.running.values(), p.incoming)
        for before, after in returned:
            gang = elastic_gang(before)
            assert gang is not None
            _resize(p, decision, before, after, asked_fewer(gang, elastic_gang(after).count))  # type: ignore[union-attr]
        if returned:
            p.reset_running_views()
    shrink = _Shrink(p, now, config, decision, tier_of)
    for i, job in enumerate(admission_order(p, now, config), start=1):
        holder = held_queues.get(job.queue)
        if holder is not None:
            waiting[job.id] = p.wait(job, i, "quota", f"the queue's quota is held for {holder} ahead")
            continue
        nominated = p.nominated.get(job.id)
        if nominated is not None:
            # Nodes preemptions freed (or are freeing) for it: its alone, whatever came first.
            outcome = _use_nomination(p, job, nominated, attempts, decision)
            if outcome == "admitted":
                continue
            if outcome == "waiting":
                waiting[job.id] = p.wait(
                    job, i, "preempting", "GPUs being freed by preemptions are held for it"
                )
                continue
        if plans_left == 0 and reservations_left == 0 and cap.free_total() == 0 and not p.incoming:
            # Nothing is left to place, preempt or hold: the rest of a long queue only learns
            # why it waits (its own borrowing limit, or capacity).
            if quota.at_borrowing_limit(job.queue, job.total_gpus):
                if aging_boost(job, now, config) > 0 and quota.could_ever_admit(job.queue, job.total_gpus):
                    held_queues[job.queue] = job.id
                waiting[job.id] = p.wait(job, i, "quota", _quota_note(quota, job))
            else:
                if tail_note is None:
                    tail_note = f"GPUs held back for {', '.join(held_for)} ahead" if held_for else ""
                waiting[job.id] = p.wait(job, i, "capacity", tail_note)
            continue
        quota_ok = attempts.quota_ok(job)
        if not quota_ok and (
            quota.at_borrowing_limit(job.queue, job.total_gpus) or cap.free_total() >= job.total_gpus
        ):
            # Its queue's limits stop it, or lending limits keep the free GPUs for their owners.
            if shrink.attempt(job, i, attempts):
                continue
            if plans_left > 0 and config.preempt_for_priority:
                outcome = _preempt_for(p, job, i, now, config, decision, plan_failed, tier_of)
                if outcome is not None:
                    plans_left -= 1
                if outcome:
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
        if shrink.attempt(job, i, attempts):
            continue
        if plans_left > 0:
            outcome = _preempt_for(p, job, i, now, config, decision, plan_failed, tier_of)
            if outcome is not None:
                plans_left -= 1
            if outcome:
                continue
        note = f"GPUs held back for {', '.join(held_for)} ahead" if held_for else ""
        if (
            reservations_left > 0
            and can_be_overtaken(job)
            and now - job.waiting_since >= config.reserve_after_s
        ):
            reservations_left -= 1
            held = hold_for_head(p, job)
            held_for.append(job.id)
            holding = f"holds {len(held)} node{'s' if len(held) != 1 else ''} while they drain"
            note = f"{holding}; {note}" if note else holding
        waiting[job.id] = p.wait(job, i, "capacity", note)
    if (config.elastic_grow or config.elastic_shrink) and not any(
        w.code in ("capacity", "preempting", "behind_head") for j in p.queued if (w := waiting.get(j.id))
    ):
        # Nobody waiting can use the free GPUs: shrunk elastic jobs get their engines back, and grow on
        # into them with `elastic_grow` (lent engines are the first taken back).
        for before, after in grow(p.cap, quota, p.running.values(), beyond_base=config.elastic_grow):
            gang = elastic_gang(before)
            assert gang is not None
            _resize(p, decision, before, after, grown_because(gang, elastic_gang(after).count))  # type: ignore[union-attr]


def _resize(p: PoolPass, decision: Decision, before: JobView, after: JobView, reason: str) -> None:
    """Record one resize of a running elastic job; a job resized earlier in the pass (engines given back, then
    taken for a blocked job; taken, then granted elsewhere) keeps one `Resize` from its view at the pass's
    start to its last, with both reasons."""
    p.running[after.id] = after
    resize = as_resize(before, after, reason)
    for i, earlier in enumerate(decision.resize):
        if earlier.job_id != after.id:
            continue
        resize = Resize(
            after.id,
            earlier.role,
            earlier.before,
            resize.after,
            resize.demand,
            resize.placement,
            f"{earlier.reason}; then {reason}",
        )
        decision.resize[i] = resize
        return
    decision.resize.append(resize)


class _Shrink:
    """Engines taken back from elastic jobs for a blocked job, before any preemption (`elastic.plan_shrink`).
    Their GPUs stay held until the drivers have stopped those engines: the job waits for them on the nodes
    nominated for it (as for GPUs preemptions free), and is admitted there by a later pass.
    A demand that could not be made room for is not tried again this pass, and at most
    `max_preemption_plans` blocked jobs plan a shrink per pass (each plan visits every shrinkable engine)."""

    def __init__(self, p: PoolPass, now: float, config: PolicyConfig, decision: Decision, tier_of) -> None:
        self.p, self.now, self.config, self.decision, self.tier_of = p, now, config, decision, tier_of
        self.on: bool | None = None if config.elastic_shrink else False  # None: not looked yet
        self.failed: set[tuple] = set()
        self.plans_left = config.max_preemption_plans

    def attempt(self, job: JobView, position: int, attempts: _Attempts) -> bool:
        if self.on is None:  # one look per pass, and only in a pass where some job is blocked
            self.on = any(shrinkable_gpus(v) for v in self.p.running.values())
        if not self.on or self.plans_left <= 0:
            return False
        p, config = self.p, self.config
        key = (job.queue, job.priority, job.demand, job.node_selector)
        if key in self.failed:
            return False
        candidates = [v for v in p.running.values() if shrinkable_gpus(v)]
        if not candidates:
            self.on = False
            return False
        tier = self.tier_of(job, self.now)
        # Taking engines loses no work: no settling, no reclaim grace, only the rights to the job.
        reclaim = config.preempt_to_reclaim and p.quota.within_nominal(job.queue, job.total_gpus)
        rules, tiers = _eligible(p, job, tier, reclaim, self.now, config, any_loss=True)
        cost = {v.id: (v.priority, -tiers.get(v.id, 0), v.id) for v in candidates}
        self.plans_left -= 1
        cap = p.cap
        # GPUs already being freed (engines given back, jobs stopping) count towards the room made
        incoming = {n: g for n, g in p.incoming.items() if g > 0 and n not in cap.hidden}
        for node, gpus in incoming.items():
            cap.give(node, gpus)
        plan = plan_shrink(cap, p.quota, job, candidates, set(rules), cost)
        placement = cap.place(job) if plan is not None else None
        if placement is not None:
            for node, gpus in placement.node_gpus:
                cap.give(node, gpus)
        for node, gpus in incoming.items():
            cap.take(node, gpus)
        if plan is None or placement is None:
            assert plan is None, "plan_shrink made room"
            self.failed.add(key)
            return False
        engines = 0
        for before, after in plan:
            _resize(p, self.decision, before, after, f"{job.id} needs GPUs its engines hold")
            engines += elastic_gang(before).count - elastic_gang(after).count  # type: ignore[union-attr]
            for node, gpus in released(before, after):  # not free until the driver has stopped those engines
                cap.take(node, gpus)
        p.reset_running_views()
        nodes = [node for node, _ in placement.node_gpus]
        for node, gpus in placement.node_gpus:
            if node in p.incoming:
                p.incoming[node] = max(0, p.incoming[node] - gpus)
        for node in nodes:  # its own once they are free, as nodes preemptions free are (`_use_nomination`)
            cap.hide(node)
        self.decision.nominate[job.id] = tuple(nodes)
        self.decision.waiting[job.id] = p.wait(
            job,
            position,
            "preempting",
            f"{engines} rollout engine{'s' if engines != 1 else ''} taken back for it, held until stopped",
        )
        attempts.freed()
        return True


def _preempt_for(
    p: PoolPass,
    job: JobView,
    position: int,
    now: float,
    config: PolicyConfig,
    decision: Decision,
    failed: set[tuple],
    tier_of,
) -> bool | None:
    """Preempt what the job needs, if it may; the nodes freed are held for it.

    True if it did, False if it tried and could not, None if there was nothing to try (no
    candidates for a job with its rights): only real attempts count against the pass's budget.
    """
    tier = tier_of(job, now)
    reclaim = _may_reclaim(p, job, now, config)
    starving = config.starving_after_s is not None and now - job.waiting_since >= config.starving_after_s
    if starving and config.starving_uses_aging:
        tier -= aging_boost(job, now, config)
    # Who may be taken depends on these alone; whether they suffice also on the demand.
    rights = (job.queue, job.priority, _rank_beyond_queue(p, job), tier, reclaim, starving)
    key = (rights, job.demand, job.node_selector)
    if rights in failed or key in failed:
        return None
    rules, tiers = _eligible(p, job, tier, reclaim, now, config, starving)
    if not rules:
        failed.add(rights)  # nobody it may take: the same for every job with its rights
        return None
    victims = _victims(p, job, rules, tiers, now, config)
    if not victims:
        failed.add(key)
        return False
    nodes = nodes_after(p, job, [v for v, _ in victims])
    for node in nodes:
        p.cap.hide(node)
    decision.nominate[job.id] = tuple(nodes)
    for v, why in victims:
        decision.preempt.append((v.id, why))
        p.forget_running(v.id)
    n = len(victims)
    decision.waiting[job.id] = p.wait(
        job, position, "preempting", f"preempting {n} job{'s' if n > 1 else ''} for it"
    )
    return True


def _use_nomination(
    p: PoolPass, job: JobView, nodes: list[str], attempts: _Attempts, decision: Decision
) -> str:
    """Place the job on what is free (its nominated nodes included), or keep them for it while
    preempted jobs there are still stopping ("waiting"); else give them up ("dropped")."""
    cap = p.cap
    for n in nodes:
        cap.unhide(n)
    if attempts.quota_ok(job):
        placement = cap.place(job)
        if placement is not None:
            p.admit(job, placement, decision)
            attempts.admitted()
            return "admitted"
    if any(p.incoming.get(n, 0) > 0 for n in nodes):
        for n in nodes:
            cap.hide(n)
        decision.nominate[job.id] = tuple(nodes)
        return "waiting"
    attempts.freed()  # the nodes are everyone's again: what failed to fit may fit now
    return "dropped"


def _rank_beyond_queue(p: PoolPass, job: JobView) -> int:
    """The job's priority against other queues' jobs: its class's, unless the class counts only within its
    queue's quota (`borrow_priority`) and the job would borrow."""
    bp = job.borrow_priority
    if bp is None or p.quota.within_nominal(job.queue, job.total_gpus):
        return job.priority
    return bp


def _may_reclaim(p: PoolPass, job: JobView, now: float, config: PolicyConfig) -> bool:
    return (
        config.preempt_to_reclaim
        and p.quota.within_nominal(job.queue, job.total_gpus)
        and now - job.waiting_since >= config.reclaim_after_s
    )


# The loss of a victim that has no checkpoint in its current run but has run `min_runtime_s`:
# taken whatever `max_victim_loss_s` says.
_ANY = 0.0
# Not settled: no checkpoint in its current run and not yet run `min_runtime_s`.
_NEVER = float("inf")


def _victims(
    p: PoolPass,
    job: JobView,
    rules: dict[str, str],
    tiers: dict[str, int],
    now: float,
    config: PolicyConfig,
) -> list[tuple[JobView, str]]:
    """Victims for a blocked job among those it may take (`_eligible`: `rules`, `tiers`), each with the
    reason; none if taking them all would not make room."""
    running = p.running
    candidates = [running[i] for i in rules]
    quota = p.quota
    own = job.queue

    def still_eligible(v: JobView) -> bool:
        # A queue that stops borrowing as victims are taken stops being fair game.
        return v.queue == own or quota.borrowing(v.queue) > 0

    chosen = plan_victims(
        p.cap,
        quota,
        job,
        candidates,
        still_eligible,
        now,
        config.restart_cost_s,
        tiers,
        config.victims_smallest_first,
    )
    if not chosen:
        return []
    return [(v, _preempt_reason(rules[v.id], job, v, now)) for v in chosen]


def _eligible(
    p: PoolPass,
    job: JobView,
    tier: int,
    reclaim: bool,
    now: float,
    config: PolicyConfig,
    starving: bool = False,
    any_loss: bool = False,
) -> tuple[dict[str, str], dict[str, int]]:
    """The running jobs `job` may take, each with its rule and service tier.

    Only preemptible jobs of the job's own queue, or of queues running on borrowed quota, are
    ever taken (a queue within its nominal quota keeps its jobs). Against other queues' jobs a job
    with a `borrow_priority` that would borrow ranks at it, not at its class (`_rank_beyond_queue`: an
    eval preempts its team's jobs by class, and takes back its queue's lent quota by class, but never
    preempts another team's job by class to borrow). Among those, a job may take:
    - jobs of a lower priority class, at once;
    - jobs of its class at least `preempt_tier_gap` service tiers above its own (they have run
      more);
    - to reclaim its queue's nominal quota (after `reclaim_after_s`), jobs of borrowing queues
      (with `reclaim_respects_service`, only those in a service tier no lower than its own);
    the last two only from "settled" jobs: they have checkpointed in their current run, at most
    `max_victim_loss_s` ago (or run `min_runtime_s` without checkpointing), so a run always keeps
    some progress and a preemption throws little away. A `starving` job (waited
    `starving_after_s`) takes settled victims whatever their loss.
    Aging orders the queue but never makes a job a victim: waiting jobs of one tier must not take
    turns preempting each other.
    `any_loss`: whatever they would lose (taking engines back from an elastic job loses nothing).
    """
    quota = p.quota
    by_rank = config.preempt_for_priority
    facts = p.victim_facts(lambda running: _victim_facts(running, now, config))
    own_prio = job.priority
    other_prio = _rank_beyond_queue(p, job)
    own = job.queue
    borrowing = {q for q in quota.queues if q != own and quota.borrowing(q) > 0}
    respect_service = config.reclaim_respects_service
    service_victim_tier = tier + config.preempt_tier_gap
    loss_bound = _NEVER if config.max_victim_loss_s is None or starving else config.max_victim_loss_s
    if any_loss:
        loss_bound = _NEVER
    rules: dict[str, str] = {}
    tiers: dict[str, int] = {}
    for v, v_tier, loss in facts:
        q = v.queue
        if q != own and q not in borrowing:
            continue
        v_prio = v.priority
        prio = own_prio if q == own else other_prio
        if by_rank and v_prio < prio:
            rules[v.id] = "class"
        elif loss > loss_bound or (loss == _NEVER and not any_loss):
            continue
        elif by_rank and v_prio == prio and v_tier >= service_victim_tier:
            rules[v.id] = "service"
        elif reclaim and q != own and (not respect_service or v_tier >= tier):
            rules[v.id] = "reclaim"
        else:
            continue
        tiers[v.id] = v_tier
    return rules, tiers


def _victim_facts(running, now: float, config: PolicyConfig) -> list[tuple[JobView, int, float]]:
    """(job, service tier, loss) for every preemptible running job: loss is its work since its
    checkpoint in the current run, `_ANY` if it has none but has run `min_runtime_s` (or is not
    started), `_NEVER` if neither. One loop with `ranking.tier_function` inlined: it visits every
    running job of the pass."""
    thresholds = sorted(t * 3600.0 for t in config.service_tiers)
    per_gpu = not config.service_counts_gpus
    settled_before = now - config.min_runtime_s
    out = []
    for v in running:
        if not v.preemptible:
            continue
        started = v.started_at
        service = v.service_gpu_s
        if started is not None and now > started:
            service += v.total_gpus * (now - started)
        if per_gpu:
            service /= v.total_gpus or 1
        tier = bisect_right(thresholds, service)
        ckpt = v.last_checkpoint_at
        if started is None:
            loss = _ANY
        elif ckpt is not None and ckpt >= started:
            loss = now - ckpt
        else:
            loss = _ANY if started <= settled_before else _NEVER
        out.append((v, tier, loss))
    return out


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
