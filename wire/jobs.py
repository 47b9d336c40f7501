"""A job's status and why it failed: what the API returns, the database stores, the scheduler moves and the
CLI waits on, declared once (docs/adr/0012). The transitions between statuses are the scheduler's
(`scheduler/domain/jobs.py::ALLOWED_TRANSITIONS`)."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "QUEUED"  # stored and waiting for a scheduling pass to admit it
    ADMITTED = "ADMITTED"  # slots reserved on a pool; the launch task is on its way to the pool's worker
    STARTING = "STARTING"  # the Ray job was submitted; the driver has not reported yet
    RUNNING = "RUNNING"  # the driver reported that its roles are up
    CANCELLING = "CANCELLING"  # cancel requested; waiting for the Ray job to stop
    PREEMPTING = "PREEMPTING"  # the scheduler reclaims the slots; the driver checkpoints and exits
    SUCCEEDED = "SUCCEEDED"  # the driver exited 0 (terminal)
    FAILED = "FAILED"  # the job or the platform failed; see failure_reason (terminal)
    CANCELLED = "CANCELLED"  # stopped on request (terminal)

    def is_terminal(self) -> bool:
        return self in TERMINAL

    def holds_slots(self) -> bool:
        """Whether a job in this status owns an allocation on a pool."""
        return self in HOLDING_SLOTS


#: The statuses a job ends in: no transition leaves them.
TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
HOLDING_SLOTS = frozenset(
    {JobStatus.ADMITTED, JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELLING, JobStatus.PREEMPTING}
)
#: Statuses of a job being stopped (a cancel or a preemption under way): it holds its slots until its process has
#: stopped, and the scheduler asks nothing more of it (no preemption, no resize).
STOPPING = frozenset({JobStatus.CANCELLING, JobStatus.PREEMPTING})
#: Jobs a pool's reconciler watches on Ray.
ON_CLUSTER = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELLING, JobStatus.PREEMPTING})


class FailureReason(StrEnum):
    SETUP = "setup"  # the launch could not submit the Ray job (cluster unreachable, bad entrypoint)
    USER_CODE = "user_code"  # the driver exited non-zero: the pipeline or a user hook raised
    NO_RESOURCE = "no_resource"  # the demand can never fit the pool it was sent to
    CONTROLLER = "controller"  # the Ray job vanished or was stopped outside the platform
    LOST = "lost"  # the driver was lost (killed, its node or Ray gone, silent; beyond its restart limit)
