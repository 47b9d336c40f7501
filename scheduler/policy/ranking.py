"""Effective rank of a job: its priority class, then its service tier (least attained service first),
lowered by waiting (aging). The policy orders the queue and picks preemption victims by it."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

from scheduler.policy.config import PolicyConfig
from scheduler.policy.types import QUEUED, JobView


def attained_gpu_s(job: JobView, now: float) -> float:
    """GPU-seconds the job has run: earlier runs plus the current one."""
    current = 0.0
    if job.state is not QUEUED and job.started_at is not None and now > job.started_at:
        current = job.total_gpus * (now - job.started_at)
    return job.service_gpu_s + current


def tier_function(config: PolicyConfig) -> Callable[[JobView, float], int]:
    """`tier(job, now)`: how many service thresholds the job has crossed (0: fresh).

    Service is GPU-hours run (or hours run, with `service_counts_gpus=False`). Built once per pass:
    the tier of every queued job is needed to order the queue.
    """
    thresholds = sorted(t * 3600.0 for t in config.service_tiers)
    per_gpu = not config.service_counts_gpus

    def tier(job: JobView, now: float) -> int:
        service = job.service_gpu_s
        started = job.started_at
        if started is not None and now > started and job.state is not QUEUED:
            service += job.total_gpus * (now - started)
        if not service:
            return 0
        if per_gpu:
            service /= job.total_gpus or 1
        return bisect_right(thresholds, service)

    return tier


def aging_boost(job: JobView, now: float, config: PolicyConfig) -> int:
    """Tiers a queued job has climbed by waiting: one per `aging_step_s`."""
    step = config.aging_step_s
    waited = now - job.waiting_since
    if step <= 0 or waited <= 0:
        return 0
    return min(int(waited // step), config.max_aging_boost)
