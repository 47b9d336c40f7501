"""The reconcile table: what a pool's reconciler does with one on-cluster job, from our status, Ray's view of
the job's Ray job and a few facts. Pure: `decide` does no I/O. The caller (`scheduler.tasks.reconcile_pool`)
gathers a fact only when `decide` asks for it (a `Need`), in the order it asks, then performs the `Move`.

Facts known before deciding: our status; Ray's status of the job's Ray job (`None`: Ray does not know it, or
it has none yet), or Ray's error when the pool's Ray did not answer; whether the preemption grace has
passed; whether the job's progress counted every step. Facts asked for (I/O, each at most once):

| fact               | how the caller learns it                                                         |
|--------------------|----------------------------------------------------------------------------------|
| `LATE`             | launched over `launch_grace_seconds` ago, or before the pool's Ray head restarted |
| `DRIVER_STARTED`   | the attempt's bootstrap secret was exchanged (a relaunch would be refused)       |
| `RUN_END`          | the run's end collected: the driver's spool applied, checkpoints checked (writes) |
| `FINISHED_CLEANLY` | the attempt's final report said `exit 0: finished`                               |
| `SILENCE`          | seconds the driver was not heard of, past `driver_silence_seconds` (else none)   |
| `API_ANSWERS`      | the platform's `/healthz` answers (a driver is silent only if it could report)   |
| `LOG_TAIL`         | the last lines of the Ray job's log                                              |
| `VERDICT`          | `scheduler.recovery.judge_ended`: lost (resume it), or failed (setup, user code) |

The table (first matching row; "ask X" rows gather X, then go on down their block):

| ours                 | Ray                   | facts                                 | move                                      |
|----------------------|-----------------------|---------------------------------------|-------------------------------------------|
| STARTING, RUNNING    | no answer             | silent, and the API answers           | MARK_LOST "the pool's Ray at … does not answer (…), and the driver sent nothing for Ns" |
| STARTING, RUNNING    | no answer             | otherwise                             | NOTHING                                   |
| CANCELLING, PREEMPT. | no answer             |                                       | NOTHING                                   |
| CANCELLING           | not known             | late                                  | MOVE CANCELLED "cancelled; the Ray job never started" |
| CANCELLING           | not known             | not late                              | NOTHING                                   |
| RUNNING              | not known             | ask RUN_END; every step done, and finished cleanly | MOVE SUCCEEDED "the driver finished (exit 0, its final report stored); its Ray job is gone now" |
| RUNNING              | not known             | otherwise                             | MARK_LOST "Ray job … is gone: …"          |
| STARTING             | not known             | late, and the driver started          | as RUNNING, not known                     |
| STARTING             | not known             | late, the driver never started        | RELAUNCH                                  |
| STARTING             | not known             | not late                              | NOTHING                                   |
| PREEMPTING           | not known             |                                       | MOVE QUEUED "preempted; its Ray job is gone, waiting to resume" |
| CANCELLING           | PENDING, RUNNING      |                                       | STOP_RAY_JOB                              |
| PREEMPTING           | PENDING, RUNNING      | the preemption grace passed           | STOP_RAY_JOB                              |
| PREEMPTING           | PENDING, RUNNING      | within the grace                      | NOTHING                                   |
| RUNNING              | PENDING, RUNNING      | silent, and the API answers           | MARK_LOST (the Ray job stopped first) "the driver sent nothing for Ns while Ray job … was …; stopped" |
| RUNNING              | PENDING, RUNNING      | otherwise                             | NOTHING                                   |
| STARTING             | PENDING, RUNNING      |                                       | NOTHING (the driver's report moves it)    |
| any                  | SUCCEEDED, STOPPED, FAILED | ask RUN_END, then the rows below |                                           |
| PREEMPTING           | SUCCEEDED             | not every step done                   | MOVE QUEUED "preempted; the driver checkpointed and exited, waiting to resume" |
| CANCELLING           | SUCCEEDED             |                                       | MOVE CANCELLED "the driver finished"      |
| other                | SUCCEEDED             | the final report is not stored        | AWAIT_FINAL_REPORT                        |
| other                | SUCCEEDED             | the final report is stored            | MOVE SUCCEEDED "the driver finished and its final report is stored" |
| CANCELLING           | STOPPED               |                                       | MOVE CANCELLED "the Ray job was stopped"  |
| CANCELLING           | FAILED                |                                       | MOVE CANCELLED "cancelled"                |
| PREEMPTING           | STOPPED, FAILED       |                                       | MOVE QUEUED "preempted; waiting to resume" |
| STARTING, RUNNING    | STOPPED               | ask LOG_TAIL, VERDICT                 | MARK_LOST the verdict's why, with the log tail |
| STARTING, RUNNING    | FAILED                | ask LOG_TAIL, VERDICT; lost           | MARK_LOST the verdict's why, with the log tail |
| STARTING, RUNNING    | FAILED                | not lost                              | MOVE FAILED `failure_summary(Ray's message, tail)`, the verdict's failure (else user_code), with the log tail |

Moves: MOVE is `JobLifecycle.transition` (compare-and-set from ours); MARK_LOST is `scheduler.recovery.recover`
(requeued, or FAILED `lost` past the restart limit); AWAIT_FINAL_REPORT keeps the job until
`final_report_grace_seconds`, then FAILED `lost`; RELAUNCH sends the launch again (the same attempt);
STOP_RAY_JOB asks Ray to stop the job (the next pass sees it ended). Every move stays within
`domain/jobs.py::ALLOWED_TRANSITIONS` (tests/unit/scheduler/test_reconcile_table.py walks every combination).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, StrEnum

from runtime.launcher import RayJobStatus
from runtime.redaction import redact
from scheduler.domain.jobs import ON_CLUSTER, FailureReason, JobStatus


class Unknown(Enum):
    """A fact not gathered yet."""

    UNKNOWN = "unknown"


UNKNOWN = Unknown.UNKNOWN


class Fact(StrEnum):
    """What `decide` may ask the caller to find out (module docstring)."""

    LATE = "late"
    DRIVER_STARTED = "driver_started"
    RUN_END = "run_end"  # sets final_stored and all_steps_done; it writes (the spool, checkpoint records)
    FINISHED_CLEANLY = "finished_cleanly"
    SILENCE = "silence"
    API_ANSWERS = "api_answers"
    LOG_TAIL = "log_tail"
    VERDICT = "verdict"


@dataclass(frozen=True)
class Verdict:
    """Why a driver's Ray job ended: `lost` (resume it) or a failure of the job itself (`failure`)."""

    lost: bool
    why: str  # one line, the true reason
    failure: FailureReason | None = None


@dataclass(frozen=True)
class Facts:
    """One on-cluster job as the reconciler sees it. The fields after `preempt_grace_passed` are UNKNOWN until
    `decide` asks for them."""

    ours: JobStatus
    ray: RayJobStatus | None  # None: Ray does not know the job's Ray job (or it has none yet)
    address: str  # the pool's Ray, for the reasons
    sub_id: str | None  # the job's Ray submission id
    ray_error: str | None = None  # set: the pool's Ray did not answer (`ray` is then None)
    ray_message: str | None = None  # Ray's message about the job
    all_steps_done: bool = False  # progress counted every step (RUN_END may learn more)
    preempt_grace_passed: bool = False  # PREEMPTING longer than `preempt_grace_seconds`
    late: bool | Unknown = UNKNOWN
    driver_started: bool | Unknown = UNKNOWN
    final_stored: bool | Unknown = UNKNOWN  # learnt with RUN_END
    finished_cleanly: bool | Unknown = UNKNOWN
    silence: float | None | Unknown = UNKNOWN  # seconds silent past the limit; None: heard of within it
    api_answers: bool | Unknown = UNKNOWN
    log_tail: tuple[str, ...] | Unknown = UNKNOWN
    verdict: Verdict | Unknown = UNKNOWN


@dataclass(frozen=True)
class Need:
    """Gather this fact, then decide again."""

    fact: Fact


class MoveKind(StrEnum):
    NOTHING = "nothing"  # leave the job as it is
    STOP_RAY_JOB = "stop_ray_job"  # ask Ray to stop the job's Ray job
    MOVE = "move"  # transition to `to`, for `reason` (`failure`, `log_tail` stored with it)
    MARK_LOST = "mark_lost"  # the driver is lost (`reason`): requeue, or FAILED `lost` past the limit
    RELAUNCH = "relaunch"  # submit the attempt's Ray job again (its launch never reached Ray)
    AWAIT_FINAL_REPORT = "await_final_report"  # wait for the final report; FAILED `lost` past the grace


@dataclass(frozen=True)
class Move:
    kind: MoveKind
    to: JobStatus | None = None  # MOVE only
    reason: str = ""  # MOVE, MARK_LOST
    failure: FailureReason | None = None  # MOVE to FAILED
    log_tail: tuple[str, ...] = ()  # MOVE, MARK_LOST: Ray's log lines stored with the job
    stop_first: bool = False  # MARK_LOST: stop the Ray job first (Ray says it still runs)


NOTHING = Move(MoveKind.NOTHING)
STOP_RAY_JOB = Move(MoveKind.STOP_RAY_JOB)
RELAUNCH = Move(MoveKind.RELAUNCH)
AWAIT_FINAL_REPORT = Move(MoveKind.AWAIT_FINAL_REPORT)
_DRIVEN = (JobStatus.STARTING, JobStatus.RUNNING)  # a driver that may be lost


def move(
    to: JobStatus, reason: str, *, failure: FailureReason | None = None, log_tail: tuple[str, ...] = ()
) -> Move:
    return Move(MoveKind.MOVE, to, reason, failure=failure, log_tail=log_tail)


def mark_lost(why: str, *, log_tail: tuple[str, ...] = (), stop_first: bool = False) -> Move:
    return Move(MoveKind.MARK_LOST, reason=why, log_tail=log_tail, stop_first=stop_first)


def decide(f: Facts) -> Move | Need:
    """The next step for one on-cluster job: a move, or a fact to gather first (module docstring)."""
    if f.ours not in ON_CLUSTER:  # not the reconciler's (moved on meanwhile)
        return NOTHING
    if f.ray_error is not None:
        return _no_answer(f)
    if f.ray is None:
        return _not_known(f)
    if not f.ray.is_terminal():
        return _still_on_ray(f)
    return _ended(f)


def _lost_if_silent(f: Facts, lost: Callable[[float], Move]) -> Move | Need:
    """`lost(seconds)` when the driver is silent and the API answers; NOTHING when not; or a Need."""
    if f.silence is UNKNOWN:
        return Need(Fact.SILENCE)
    if f.silence is None:
        return NOTHING
    if f.api_answers is UNKNOWN:
        return Need(Fact.API_ANSWERS)
    return lost(f.silence) if f.api_answers else NOTHING


def _no_answer(f: Facts) -> Move | Need:
    """The pool's Ray does not answer: its drivers are judged by their reports."""
    if f.ours not in _DRIVEN:
        return NOTHING
    why = f"the pool's Ray at {f.address} does not answer ({(f.ray_error or '')[:200]})"
    return _lost_if_silent(
        f, lambda silence: mark_lost(f"{why}, and the driver sent nothing for {silence:.0f}s")
    )


def _not_known(f: Facts) -> Move | Need:
    """Ray does not know the job's Ray job: never submitted, or it ran on a Ray that is gone."""
    if f.ours == JobStatus.PREEMPTING:
        return move(JobStatus.QUEUED, "preempted; its Ray job is gone, waiting to resume")
    if f.ours == JobStatus.RUNNING:
        return _gone(f)
    # CANCELLING, STARTING: nothing before the launch grace (the launch may be on its way); `late` also
    # counts a launch before the pool's (embedded) Ray head was restarted, which cannot know the job
    if f.late is UNKNOWN:
        return Need(Fact.LATE)
    if not f.late:
        return NOTHING
    if f.ours == JobStatus.CANCELLING:
        return move(JobStatus.CANCELLED, "cancelled; the Ray job never started")
    if f.driver_started is UNKNOWN:
        return Need(Fact.DRIVER_STARTED)
    # a driver that started ran on a Ray that is gone; else the worker that launched it died before submitting
    return _gone(f) if f.driver_started else RELAUNCH


def _gone(f: Facts) -> Move | Need:
    """The driver ran on a Ray that is gone: what it left is collected, then it finished, or it is lost."""
    if f.final_stored is UNKNOWN:
        return Need(Fact.RUN_END)
    if f.all_steps_done:
        if f.finished_cleanly is UNKNOWN:
            return Need(Fact.FINISHED_CLEANLY)
        if f.finished_cleanly:
            why = "the driver finished (exit 0, its final report stored); its Ray job is gone now"
            return move(JobStatus.SUCCEEDED, why)
    return mark_lost(
        f"Ray job {f.sub_id} is gone: the pool's Ray at {f.address} does not know it (restarted?)"
    )


def _still_on_ray(f: Facts) -> Move | Need:
    """Ray says the job is PENDING or RUNNING."""
    if f.ours == JobStatus.CANCELLING:
        return STOP_RAY_JOB
    if f.ours == JobStatus.PREEMPTING:  # asked to checkpoint and exit; past the grace it is stopped
        return STOP_RAY_JOB if f.preempt_grace_passed else NOTHING
    if f.ours == JobStatus.RUNNING:  # Ray says it runs: does the driver still report?
        return _lost_if_silent(
            f,
            lambda silence: mark_lost(
                f"the driver sent nothing for {silence:.0f}s while Ray job {f.sub_id} was {f.ray}; stopped",
                stop_first=True,
            ),
        )
    return NOTHING  # STARTING: the driver's first report moves it to RUNNING


def _ended(f: Facts) -> Move | Need:
    """The Ray job ended: before the job moves on, what its driver could not deliver and its checkpoints."""
    if f.final_stored is UNKNOWN:
        return Need(Fact.RUN_END)
    if f.ray == RayJobStatus.SUCCEEDED:
        if f.ours == JobStatus.PREEMPTING and not f.all_steps_done:
            return move(JobStatus.QUEUED, "preempted; the driver checkpointed and exited, waiting to resume")
        if f.ours == JobStatus.CANCELLING:
            return move(JobStatus.CANCELLED, "the driver finished")
        if not f.final_stored:  # SUCCEEDED only once the driver's last report is stored
            return AWAIT_FINAL_REPORT
        return move(JobStatus.SUCCEEDED, "the driver finished and its final report is stored")
    if f.ours == JobStatus.CANCELLING:
        why = "the Ray job was stopped" if f.ray == RayJobStatus.STOPPED else "cancelled"
        return move(JobStatus.CANCELLED, why)
    if f.ours == JobStatus.PREEMPTING:  # stopped on request, or hard (or its node died) while preempted
        return move(JobStatus.QUEUED, "preempted; waiting to resume")
    if f.log_tail is UNKNOWN:
        return Need(Fact.LOG_TAIL)
    if f.verdict is UNKNOWN:
        return Need(Fact.VERDICT)
    if f.ray == RayJobStatus.STOPPED or f.verdict.lost:
        # stopped outside the platform, killed, or its node or job supervisor died: resumed from its checkpoint
        return mark_lost(f.verdict.why, log_tail=f.log_tail)
    return move(
        JobStatus.FAILED,
        failure_summary(f.ray_message, list(f.log_tail)),
        failure=f.verdict.failure or FailureReason.USER_CODE,
        log_tail=f.log_tail,
    )


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")
_DRIVER_FAILED = re.compile(r"\bdriver failed: (.+)$")  # runtime/driver.py's last word on an exception
_TRACEBACK = "Traceback (most recent call last):"


def failure_summary(ray_message: str | None, log_tail: list[str]) -> str:
    """One line saying why a driver failed: Ray's first line, and the exception the driver failed with (its
    `driver failed: ...` line, else the exception line of the log's last traceback), else the log's last line.
    An exception line outside the last traceback (a warning logged earlier, another process's noise) is never
    taken for the cause."""
    head = (ray_message or "the driver failed").strip().splitlines()[0]
    head = head.split(", last available logs")[0].rstrip(",.: ")
    cause = next((m.group(1).strip() for ln in reversed(log_tail) if (m := _DRIVER_FAILED.search(ln))), "")
    if not cause:
        starts = [i for i, ln in enumerate(log_tail) if ln.strip() == _TRACEBACK]
        after = log_tail[starts[-1] :] if starts else []
        cause = next((ln.strip() for ln in reversed(after) if _EXCEPTION_LINE.match(ln.strip())), "")
    if not cause:
        cause = next((ln.strip() for ln in reversed(log_tail) if ln.strip()), "")
    return redact(f"{head}: {cause[:500]}" if cause else head)
