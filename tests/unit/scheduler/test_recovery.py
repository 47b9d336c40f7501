"""Why a driver's Ray job ended, as the reconciler judges it (scheduler/recovery.py): a driver killed by a
signal, or whose job supervisor or node died, or stopped outside the platform, is *lost* (the job is resumed
from its checkpoint); one that exited non-zero by itself failed (`user_code`, not retried), one that could not
start failed (`setup`). And the one-line reason of a failed driver never takes an exception line from outside
the driver's last traceback."""

from __future__ import annotations

import pytest

from runtime.launcher import RAY_FAILED, RAY_STOPPED, RayJobInfo
from scheduler.domain.jobs import FailureReason
from scheduler.domain.reconcile import failure_summary
from scheduler.recovery import judge_ended, killed_by, restart_limit

KILLED_MSG = (
    "Job entrypoint command failed with exit code 137, last available logs (truncated to 20,000 chars):\n..."
)


@pytest.mark.parametrize(
    "code,name", [(137, "SIGKILL"), (-9, "SIGKILL"), (143, "SIGTERM"), (-15, "SIGTERM"), (139, "SIGSEGV")]
)
def test_a_signal_death_is_named(code: int, name: str) -> None:
    assert killed_by(code) == name


@pytest.mark.parametrize("code", [None, 0, 1, 2, 127])
def test_an_ordinary_exit_is_no_signal(code: int | None) -> None:
    assert killed_by(code) is None


def test_a_killed_driver_is_lost_and_the_reason_says_so_without_its_log() -> None:
    v = judge_ended("job_x-a1", RayJobInfo(RAY_FAILED, KILLED_MSG, "JOB_ENTRYPOINT_COMMAND_ERROR", 137))
    assert v.lost and v.failure is None
    assert v.why == (
        "Ray job job_x-a1 ended FAILED: the driver was killed by SIGKILL "
        "(Job entrypoint command failed with exit code 137)"
    )


def test_a_dead_job_supervisor_or_node_is_a_lost_driver() -> None:
    msg = "Job supervisor actor died: The actor died unexpectedly before finishing this task"
    v = judge_ended("job_x-a1", RayJobInfo(RAY_FAILED, msg, "JOB_SUPERVISOR_ACTOR_DIED", None))
    assert v.lost and "Job supervisor actor died" in v.why


def test_a_ray_job_stopped_outside_the_platform_is_a_lost_driver() -> None:
    v = judge_ended("job_x-a1", RayJobInfo(RAY_STOPPED, "Job was intentionally stopped."))
    assert v.lost and v.why.startswith("Ray job job_x-a1 ended STOPPED outside the platform")


def test_a_driver_that_exited_non_zero_failed_by_itself() -> None:
    msg = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n..."
    v = judge_ended("job_x-a1", RayJobInfo(RAY_FAILED, msg, "JOB_ENTRYPOINT_COMMAND_ERROR", 1))
    assert not v.lost and v.failure == FailureReason.USER_CODE


def test_a_driver_that_could_not_start_is_a_setup_failure() -> None:
    v = judge_ended(
        "job_x-a1", RayJobInfo(RAY_FAILED, "runtime env failed", "RUNTIME_ENV_SETUP_FAILURE", None)
    )
    assert not v.lost and v.failure == FailureReason.SETUP


def test_the_restart_limit_is_the_jobs_own_only_with_fault_tolerance() -> None:
    assert restart_limit({}, 3) == 3
    assert restart_limit({"max_global_restart": 7}, 3) == 3  # Relax's health-check meaning: not ours
    assert restart_limit({"use_fault_tolerance": True, "max_global_restart": 7}, 3) == 7
    assert restart_limit({"use_fault_tolerance": True, "max_global_restart": 0}, 3) == 0


def test_an_exception_line_outside_the_last_traceback_is_not_the_cause() -> None:
    # An earlier, unrelated exception line (a warning's, another process's) and then a kill: not the cause.
    tail = [
        "AttributeError: 'NoneType' object has no attribute 'close'",
        "step 40/300",
        "step 41/300",
        "Killed",
    ]
    assert failure_summary(KILLED_MSG, tail) == "Job entrypoint command failed with exit code 137: Killed"


def test_the_drivers_own_last_word_is_the_cause() -> None:
    tail = [
        "2026-12-01 10:00:00 ERROR runtime.driver [job_x] driver failed: KeyError: 'lr'",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "KeyError: 'lr'",
        "AttributeError: 'NoneType' object has no attribute 'close'",  # interpreter shutdown noise after it
    ]
    msg = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n..."
    assert failure_summary(msg, tail) == "Job entrypoint command failed with exit code 1: KeyError: 'lr'"
