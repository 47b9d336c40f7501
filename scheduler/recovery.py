"""Recovery of jobs whose driver is gone (docs/reliability.md).

A pool's reconciler (`scheduler.tasks.reconcile_pool`, every beat tick) asks Ray about every job on the
cluster. A STARTING or RUNNING job whose driver is *lost* — its Ray job unknown to the pool's Ray (Ray was
restarted), ended by a signal (SIGKILL, the OOM killer), its job supervisor or node gone, stopped outside
the platform, or silent past `driver_silence_seconds` — is requeued (-> QUEUED, slots freed) and its next
attempt resumes from its latest checkpoint (`JobReports.driver_spec` points `load` at its own `save`: the
preemption path), at most `restart_limit` times; then it is FAILED (`lost`) with the true reason. A driver
that failed by itself (it exited non-zero: the pipeline or a user hook raised) is not retried: FAILED as
`user_code` with the exception its log ends with.

Every change goes through `JobLifecycle.transition` (compare-and-set): a reconciler running twice moves a job
once.
"""

from __future__ import annotations

import logging
import re
import signal
import time
from typing import Any

import sqlalchemy as sa

from runtime.launcher import RayJobInfo, RayJobStatus
from runtime.redaction import redact
from scheduler.db.engine import Database
from scheduler.db.models import Checkpoint, Job, JobEvent
from scheduler.domain.jobs import FailureReason, JobStatus
from scheduler.domain.reconcile import Verdict
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.reports import JobReports

log = logging.getLogger(__name__)

LOST_EVENT = "driver_lost"  # one job event per lost driver: their number is the job's restart count

# Ray's error types of a FAILED job that mean the driver's process or node went away, not the job's code.
_LOST_ERROR_TYPES = frozenset({"JOB_SUPERVISOR_ACTOR_DIED", "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE"})
# ... and those that mean it could not start (the same setup would fail again).
_SETUP_ERROR_TYPES = frozenset(
    {
        "RUNTIME_ENV_SETUP_FAILURE",
        "JOB_SUPERVISOR_ACTOR_START_TIMEOUT",
        "JOB_SUPERVISOR_ACTOR_START_FAILURE",
        "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE",
        "JOB_ENTRYPOINT_COMMAND_START_ERROR",
    }
)

# Ray's errors of a driver whose actor went away with its process or node (a raylet SIGKILLed, a machine lost): not
# the job's code. Such a driver ends within a second or two, before Ray holds the node dead (its health checks:
# seconds) and the pool's node sync marks it down; its job is judged only `ACTOR_LOSS_SETTLE_SECONDS` after, so
# that a lost node is marked down first (its jobs are then preempted and placed on the nodes left, not requeued
# onto the dead node while the pool still counts it).
_ACTOR_LOSS = re.compile(
    r"\b(ActorDiedError|ActorUnavailableError|NodeDiedError|OwnerDiedError|ObjectLostError|RayActorError)\b"
)
ACTOR_LOSS_SETTLE_SECONDS = 20.0


def lost_an_actor(info: RayJobInfo) -> bool:
    """Whether the Ray job FAILED on a Ray error saying that one of its actors (or their node) went away."""
    return info.status == RayJobStatus.FAILED and bool(_ACTOR_LOSS.search(info.message or ""))


def settling(info: RayJobInfo, now: float | None = None) -> bool:
    """A driver that failed on a lost actor less than `ACTOR_LOSS_SETTLE_SECONDS` ago: not judged yet."""
    if not lost_an_actor(info) or info.ended_at is None:
        return False
    return (now if now is not None else time.time()) - info.ended_at < ACTOR_LOSS_SETTLE_SECONDS


def killed_by(exit_code: int | None) -> str | None:
    """The signal that ended the entrypoint, by name: a negative exit code (Ray ran the command directly) or
    128+N (the shell reported its child killed by signal N); None for an ordinary exit."""
    if exit_code is None or exit_code == 0:
        return None
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 128 + 65 else None
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def ray_head(message: str | None) -> str:
    """Ray's message, first line, without the log tail it appends."""
    head = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    return head.split(", last available logs")[0].split(". No logs available")[0].rstrip(",.: ")


def judge_ended(sub_id: str, info: RayJobInfo) -> Verdict:
    """A Ray job that ended FAILED, or STOPPED without the platform asking: was its driver lost?"""
    head = ray_head(info.message)
    if info.status == RayJobStatus.STOPPED:
        return Verdict(
            True, f"Ray job {sub_id} ended STOPPED outside the platform" + (f": {head}" if head else "")
        )
    sig = killed_by(info.exit_code)
    if sig is not None:
        return Verdict(
            True, f"Ray job {sub_id} ended FAILED: the driver was killed by {sig} ({head or 'no message'})"
        )
    if info.error_type in _LOST_ERROR_TYPES:
        return Verdict(True, f"Ray job {sub_id} ended FAILED: {head or info.error_type}")
    if lost_an_actor(info):
        return Verdict(
            True, f"Ray job {sub_id} ended FAILED: an actor of it was lost with its process or node ({head})"
        )
    if info.error_type in _SETUP_ERROR_TYPES:
        return Verdict(
            False, f"Ray job {sub_id} could not start: {head or info.error_type}", FailureReason.SETUP
        )
    return Verdict(False, head or "the driver failed", FailureReason.USER_CODE)


def finished_cleanly(db: Database, job_id: str) -> bool:
    """Whether the driver of the job's current attempt said, in its final report, that it finished every
    step and exited 0 (runtime/driver.py: `exit 0: finished`): a job whose Ray job is gone after that is done,
    not lost."""
    with db.session(read_only=True) as s:
        job = s.get(Job, job_id)
        if job is None:
            return False
        return bool(
            s.scalar(
                sa.select(sa.func.count())
                .select_from(JobEvent)
                .where(
                    JobEvent.job_id == job_id,
                    JobEvent.kind == "final_report",
                    JobEvent.reason.like(f"attempt {job.attempt}: exit 0: finished%"),
                )
            )
        )


def restart_limit(spec: dict[str, Any], default: int) -> int:
    """How many times a lost driver is resumed: the job's `--max-global-restart` when it set
    `--use-fault-tolerance` (what the flag means on this platform), else the platform's default."""
    if spec.get("use_fault_tolerance") and spec.get("max_global_restart") is not None:
        return max(0, int(spec["max_global_restart"]))
    return default


def recover(
    db: Database,
    job_id: str,
    src: JobStatus,
    why: str,
    *,
    default_limit: int,
    log_tail: list[str] | None = None,
) -> JobStatus | None:
    """The job's driver is lost (`why`): requeue it to resume from its latest checkpoint, or FAILED (`lost`)
    once it was resumed `restart_limit` times. Returns the new status (None: someone moved it first)."""
    why = redact(why)
    with db.session() as s:
        svc = JobLifecycle(s)
        job = s.get(Job, job_id)
        if job is None or job.status != src:
            return None
        restarts = s.scalar(
            sa.select(sa.func.count())
            .select_from(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.kind == LOST_EVENT)
        )
        limit = restart_limit(job.spec or {}, default_limit)
        step = s.scalar(
            sa.select(sa.func.max(Checkpoint.step)).where(
                Checkpoint.job_id == job_id, Checkpoint.format != "hf"
            )
        )
        if restarts < limit:
            where = (
                f"its latest checkpoint (step {step})"
                if step is not None and (job.spec or {}).get("save")
                else "the start (no checkpoint)"
            )
            target = JobStatus.QUEUED
            reason = (
                f"driver_lost: {why}; requeued to resume from {where} (restart {restarts + 1} of {limit})"
            )
            moved = svc.transition(job_id, target, expected_from=src, reason=reason)
        else:
            target = JobStatus.FAILED
            reason = (
                f"driver_lost: {why}; not resumed again: it was resumed {restarts} time(s), its limit "
                f"(--max-global-restart with --use-fault-tolerance, else RELAX_SCHEDULER_MAX_DRIVER_RESTARTS) is {limit}"
            )
            moved = svc.transition(
                job_id, target, expected_from=src, reason=reason, failure=FailureReason.LOST
            )
        if not moved:
            return None
        svc.record_event(job, LOST_EVENT, why)
        if log_tail:
            JobReports(s).add_ray_log_tail(job, log_tail)
    log.warning("job %s: %s", job_id, reason)
    return target
