"""The job lifecycle: the allowed transitions between a job's statuses. The statuses, their sets and the
failure reasons are declared in `wire.jobs` (shared with the API's clients, docs/adr/0012) and named here too."""

from __future__ import annotations

from wire.jobs import HOLDING_SLOTS, ON_CLUSTER, STOPPING, TERMINAL, FailureReason, JobStatus

__all__ = [
    "ALLOWED_TRANSITIONS",
    "HOLDING_SLOTS",
    "ON_CLUSTER",
    "STOPPING",
    "TERMINAL",
    "FailureReason",
    "JobStatus",
    "can_transition",
]

_S = JobStatus
ALLOWED_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    _S.QUEUED: frozenset({_S.ADMITTED, _S.CANCELLED, _S.FAILED}),
    _S.ADMITTED: frozenset({_S.STARTING, _S.CANCELLED, _S.FAILED, _S.QUEUED}),
    # -> QUEUED from STARTING/RUNNING: the driver was lost (killed, its Ray gone) and the job is requeued to
    # resume from its latest checkpoint (scheduler/recovery.py)
    _S.STARTING: frozenset({_S.RUNNING, _S.SUCCEEDED, _S.FAILED, _S.CANCELLING, _S.PREEMPTING, _S.QUEUED}),
    _S.RUNNING: frozenset({_S.SUCCEEDED, _S.FAILED, _S.CANCELLING, _S.PREEMPTING, _S.QUEUED}),
    _S.CANCELLING: frozenset({_S.CANCELLED, _S.FAILED}),
    _S.PREEMPTING: frozenset({_S.QUEUED, _S.CANCELLING, _S.FAILED, _S.SUCCEEDED}),
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
}


def can_transition(src: JobStatus, dst: JobStatus) -> bool:
    return dst in ALLOWED_TRANSITIONS[src]
