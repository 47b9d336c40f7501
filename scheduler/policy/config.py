"""PolicyConfig: the knobs of the scheduling policy, with the reason for each default."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Knobs of `schedule`. The baselines take the argument for a common signature and ignore it.

    Defaults are the ones measured in docs/adr/0003-scheduling-policy.md.
    """

    # Attained-service thresholds between service tiers, in GPU-hours (hours if
    # `service_counts_gpus` is False). A job that has run less than the first is "fresh" (tier 0)
    # and goes before, and may preempt, jobs of its class that have run more: least attained
    # service first, as in Tiresias (NSDI'19). Durations are unknown, and a job that has already
    # run long is the likeliest to run long still. Geometric, sqrt(2) apart from 1 to 8,192 GPU-h:
    # fine tiers rank jobs by service at every scale (coarser ones measured worse).
    service_tiers: tuple[float, ...] = tuple(2.0 ** (i / 2) for i in range(27))
    # Count service in GPU-hours (a big job ages out of "fresh" sooner), or in hours.
    service_counts_gpus: bool = True
    # Waiting this long lowers a queued job's tier by one (below 0 too): an overtaken job rises
    # until nothing of its class can pass it, so it cannot starve. Aging never crosses classes.
    # 8 h per sqrt(2) tier: a stopped long job stays behind shorter work (faster measured worse).
    aging_step_s: float = 28800.0
    # Most tiers aging can take off.
    max_aging_boost: int = 1_000_000
    # A running job is not preempted for service tier, aging or reclaim before it has saved a
    # checkpoint in its current run, so that every run keeps some progress and preemptions cannot
    # livelock; a job that has not checkpointed becomes fair game after this long anyway.
    # (Preemption for a higher priority class does not wait.)
    min_runtime_s: float = 3600.0
    # ... and, once it has, only within this long after its latest checkpoint (None: any time),
    # so that a preemption for service tier or reclaim throws away little work beyond the restart.
    # The blocked job waits for a victim's next checkpoint instead. A job that never checkpoints is
    # still taken after `min_runtime_s`.
    max_victim_loss_s: float | None = 600.0
    # A blocked job that has waited this long (None: never) preempts for itself instead of only
    # waiting for nodes to drain: it may take service and reclaim victims whatever their loss
    # since their checkpoint (cheapest set first; still never an unsettled one), and ...
    starving_after_s: float | None = None
    # ... (if True) its preemption rights use its tier lowered by aging, as its queue order does.
    starving_uses_aging: bool = False
    # A blocked job holds nodes back (`reservations`) only once it has waited this long. Holding
    # nodes while they drain idles GPUs; most blocked gangs get in sooner by preemption or as jobs
    # end. 24 h keeps the reservation as the starvation backstop (0: at once, measured worse).
    reserve_after_s: float = 86400.0
    # Blocked jobs per pool, in admission order, that hold nodes back so that jobs backfilled
    # after them never take the GPUs they wait for.
    reservations: int = 1
    # Share of the pool's GPUs that jobs of a whole node or more leave free for small jobs.
    small_job_headroom: float = 0.0
    # A job within its queue's nominal quota may preempt jobs of queues that borrow ...
    preempt_to_reclaim: bool = True
    # ... once it has waited this long for GPUs to free up by themselves.
    reclaim_after_s: float = 1800.0
    # A reclaim takes only jobs that have run at least as much as it has (a service tier no lower than
    # its own): a reclaim never stops a fresh borrowed job for a long-running owned one, which the
    # fresh job would preempt right back.
    reclaim_respects_service: bool = True
    # A job may preempt jobs of lower rank: a lower priority class, or (same class) a higher
    # service tier than its own, of its own queue or of queues that borrow.
    preempt_for_priority: bool = True
    # For service, a victim must be at least this many tiers above the blocked job (2: twice the
    # service at sqrt(2) apart), so that jobs of nearly equal service do not take turns.
    preempt_tier_gap: int = 2
    # Blocked jobs per pool and pass that may plan preemptions (bounds a pass's cost).
    max_preemption_plans: int = 4
    # Among victims of one priority, take those holding the fewest GPUs first, before the highest
    # service tier: a big gang that is stopped waits long for whole nodes again, a small job
    # finds GPUs at once.
    victims_smallest_first: bool = True
    # Cost every victim pays on top of its lost work (restart, reload), to rank victims.
    restart_cost_s: float = 300.0
    # Order by size before quota standing (True), or serve jobs within nominal quota first.
    size_before_quota: bool = True
    # A blocked job takes engines back from elastic jobs (`--autoscaler-config`) before it preempts
    # anyone: no work is lost (scheduler/policy/elastic.py; bench.scheduler_sim --elastic measures it).
    elastic_shrink: bool = True
    # Elastic jobs grow into GPUs that no waiting job of the pool can use, up to their max engines (off:
    # only back to the engines their spec asks for, after a shrink).
    elastic_grow: bool = True


DEFAULT_CONFIG = PolicyConfig()
