"""Effective rank of a job: its priority class, then its service tier (least attained service first),
lowered by waiting (aging). The policy orders the queue and picks preemption victims by it."""

from __future__ import annotations

from scheduler.policy.config import PolicyConfig
from scheduler.policy.types import JobView

# A rank is (-priority, tier): smaller is better. Tuples compare the class first, so neither
# service nor waiting ever lifts a job over a higher priority class.
Rank = tuple[int, int]


def attained_gpu_s(job: JobView, now: float) -> float:
    """GPU-seconds the job has run: earlier runs plus the current one."""
    current = 0.0
    if job.state != "queued" and job.started_at is not None and now > job.started_at:
        current = job.total_gpus * (now - job.started_at)
    return job.service_gpu_s + current


def service_tier(gpu_s: float, tiers_gpu_h: tuple[float, ...]) -> int:
    """How many service thresholds the job has crossed (0: fresh)."""
    hours = gpu_s / 3600.0
    return sum(1 for t in tiers_gpu_h if hours >= t)


def aging_boost(job: JobView, now: float, config: PolicyConfig) -> int:
    """Tiers a queued job has climbed by waiting: one per `aging_step_s`."""
    step = config.aging_step_s
    waited = now - job.waiting_since
    if step <= 0 or waited <= 0:
        return 0
    return min(int(waited // step), config.max_aging_boost)


def queued_rank(job: JobView, now: float, config: PolicyConfig) -> Rank:
    """A queued job's rank: its service tier, lowered one step per `aging_step_s` waited (it may
    go below 0: an aged fresh job outranks fresh running jobs, so nothing starves)."""
    tier = service_tier(job.service_gpu_s, config.service_tiers_gpu_h)
    return (-job.priority, tier - aging_boost(job, now, config))


def running_rank(job: JobView, now: float, config: PolicyConfig) -> Rank:
    return (-job.priority, service_tier(attained_gpu_s(job, now), config.service_tiers_gpu_h))
