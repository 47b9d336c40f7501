"""The reconcile table (scheduler/domain/reconcile.py), walked whole: every our-status × Ray-status × fact
combination ends in a defined move, each fact is asked for at most once (the run's end, which writes, once),
no move leaves the state machine's transitions (scheduler/domain/jobs.py), and the important rows say what the
reconciler has always done, in its words (tests and the chaos checks read the reasons)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest

from runtime.launcher import RayJobStatus
from scheduler.domain.jobs import ALLOWED_TRANSITIONS, ON_CLUSTER, FailureReason, JobStatus, can_transition
from scheduler.domain.reconcile import (
    UNKNOWN,
    Fact,
    Facts,
    Move,
    MoveKind,
    Need,
    Verdict,
    decide,
)

S, R = JobStatus, RayJobStatus
ADDRESS, SUB = "http://127.0.0.1:8265", "job_x-a1"
TAIL = ("Traceback (most recent call last):", "ZeroDivisionError: division by zero")
LOST = Verdict(True, "Ray job job_x-a1 ended FAILED: the driver was killed by SIGKILL (exit 137)")
SETUP = Verdict(False, "Ray job job_x-a1 could not start: runtime env failed", FailureReason.SETUP)
USER = Verdict(False, "Job entrypoint command failed with exit code 1", FailureReason.USER_CODE)

# Every value each fact can take when the caller gathers it.
ANSWERS: dict[Fact, list[dict[str, object]]] = {
    Fact.LATE: [{"late": True}, {"late": False}],
    Fact.DRIVER_STARTED: [{"driver_started": True}, {"driver_started": False}],
    Fact.RUN_END: [
        {"final_stored": final, "all_steps_done": done}
        for final, done in itertools.product([True, False], repeat=2)
    ],
    Fact.FINISHED_CLEANLY: [{"finished_cleanly": True}, {"finished_cleanly": False}],
    Fact.SILENCE: [{"silence": None}, {"silence": 75.4}],
    Fact.API_ANSWERS: [{"api_answers": True}, {"api_answers": False}],
    Fact.LOG_TAIL: [{"log_tail": ()}, {"log_tail": TAIL}],
    Fact.VERDICT: [{"verdict": v} for v in (LOST, SETUP, USER)],
}
_FIELDS = {fact: {k for answer in answers for k in answer} for fact, answers in ANSWERS.items()}
NO_ANSWER = "no answer"  # the pool's Ray did not answer
RAY_SIDES: list[RayJobStatus | str | None] = [NO_ANSWER, None, *RayJobStatus]


def initial(ours: JobStatus, ray: RayJobStatus | str | None, *, done: bool, grace_passed: bool) -> Facts:
    return Facts(
        ours=ours,
        ray=None if ray == NO_ANSWER else ray,  # type: ignore[arg-type]
        address=ADDRESS,
        sub_id=SUB,
        ray_error="Failed to connect to Ray" if ray == NO_ANSWER else None,
        ray_message="Job entrypoint command failed with exit code 1, last available logs:\n..."
        if ray
        else None,
        all_steps_done=done,
        preempt_grace_passed=grace_passed,
    )


def paths(facts: Facts, asked: tuple[Fact, ...] = ()) -> Iterator[tuple[Facts, tuple[Fact, ...], Move]]:
    """Every way through the table from `facts`: each Need branches over every answer to it."""
    step = decide(facts)
    if isinstance(step, Move):
        yield facts, asked, step
        return
    assert isinstance(step, Need), step
    assert step.fact not in asked, f"{step.fact} asked twice after {asked}"
    assert all(getattr(facts, name) is UNKNOWN for name in _FIELDS[step.fact] - {"all_steps_done"})
    for answer in ANSWERS[step.fact]:
        yield from paths(replace(facts, **answer), (*asked, step.fact))  # type: ignore[arg-type]


STARTS = [
    initial(ours, ray, done=done, grace_passed=grace)
    for ours, ray, done, grace in itertools.product(JobStatus, RAY_SIDES, [True, False], [True, False])
]
ALL = [(start, *end) for start in STARTS for end in paths(start)]
IDS = [
    f"{start.ours}-{start.ray or ('no answer' if start.ray_error else 'not known')}"
    f"-done{int(start.all_steps_done)}-grace{int(start.preempt_grace_passed)}-{'.'.join(asked) or 'none'}-{i}"
    for i, (start, _, asked, _) in enumerate(ALL)
]


def test_the_walk_covers_every_start() -> None:
    assert len(STARTS) == len(JobStatus) * len(RAY_SIDES) * 4
    assert {start for start, *_ in ALL} == set(STARTS)
    assert {move.kind for *_, move in ALL} == set(MoveKind)
    assert {fact for _, _, asked, _ in ALL for fact in asked} == set(Fact)


@pytest.mark.parametrize("start,end,asked,move", ALL, ids=IDS)
def test_every_move_is_one_the_state_machine_allows(
    start: Facts, end: Facts, asked: tuple, move: Move
) -> None:
    ours = start.ours
    if move.kind is MoveKind.MOVE:
        assert move.to is not None and can_transition(ours, move.to), (ours, move)
        assert move.reason
        assert (move.failure is not None) == (move.to == S.FAILED)
    elif move.kind is MoveKind.MARK_LOST:  # requeued, or FAILED `lost` past the restart limit
        assert ours in (S.STARTING, S.RUNNING)
        assert can_transition(ours, S.QUEUED) and can_transition(ours, S.FAILED)
        assert move.reason
    elif move.kind is MoveKind.AWAIT_FINAL_REPORT:  # FAILED `lost` past the grace
        assert can_transition(ours, S.FAILED)
    elif move.kind is MoveKind.RELAUNCH:
        assert ours == S.STARTING
    elif move.kind is MoveKind.STOP_RAY_JOB:  # only a Ray job that still runs is stopped
        assert start.ray in (R.PENDING, R.RUNNING)
    if move.stop_first:
        assert move.kind is MoveKind.MARK_LOST and start.ray in (R.PENDING, R.RUNNING)
    if move.kind is not MoveKind.NOTHING:
        assert ours in ON_CLUSTER
        assert ALLOWED_TRANSITIONS[ours]


@pytest.mark.parametrize("start,end,asked,move", ALL, ids=IDS)
def test_facts_are_asked_only_where_they_mean_something(
    start: Facts, end: Facts, asked: tuple, move: Move
) -> None:
    if start.ray_error is not None:  # no answer from Ray: the driver's reports and the API only
        assert set(asked) <= {Fact.SILENCE, Fact.API_ANSWERS}
    if start.ray is not None and start.ray.is_terminal():  # its end is collected before anything else
        assert (asked[:1] == (Fact.RUN_END,)) == (start.ours in ON_CLUSTER)
    if Fact.API_ANSWERS in asked:  # the API is asked only about a silent driver
        assert asked.index(Fact.SILENCE) < asked.index(Fact.API_ANSWERS) and end.silence is not None
    if Fact.LOG_TAIL in asked or Fact.VERDICT in asked:
        assert start.ray in (R.STOPPED, R.FAILED) and start.ours in (S.STARTING, S.RUNNING)
    if Fact.RUN_END in asked and start.ray is None:  # a driver that ran on a Ray that is gone
        assert start.ours == S.RUNNING or (end.late is True and end.driver_started is True)


def _end(start: Facts, **answers: object) -> Move:
    facts = start
    while isinstance(step := decide(facts), Need):
        facts = replace(facts, **{k: v for k, v in answers.items() if k in _FIELDS[step.fact]})  # type: ignore[arg-type]
        assert decide(facts) != step, f"no answer given for {step.fact}"
    return step


def _at(ours: JobStatus, ray: RayJobStatus | str | None, *, done: bool = False, grace: bool = False) -> Facts:
    return initial(ours, ray, done=done, grace_passed=grace)


def test_statuses_off_the_cluster_are_left_alone() -> None:
    for start in STARTS:
        if start.ours not in ON_CLUSTER:
            assert decide(start) == Move(MoveKind.NOTHING)


def test_a_silent_driver_on_an_unanswering_ray_is_lost_a_reporting_one_left_alone() -> None:
    move = _end(_at(S.RUNNING, NO_ANSWER), silence=75.4, api_answers=True)
    assert move == Move(
        MoveKind.MARK_LOST,
        reason=f"the pool's Ray at {ADDRESS} does not answer (Failed to connect to Ray), "
        "and the driver sent nothing for 75s",
    )
    assert _end(_at(S.RUNNING, NO_ANSWER), silence=None).kind is MoveKind.NOTHING
    assert _end(_at(S.STARTING, NO_ANSWER), silence=75.4, api_answers=False).kind is MoveKind.NOTHING
    assert decide(_at(S.PREEMPTING, NO_ANSWER)).kind is MoveKind.NOTHING  # type: ignore[union-attr]


def test_a_job_ray_does_not_know() -> None:
    gone = f"Ray job {SUB} is gone: the pool's Ray at {ADDRESS} does not know it (restarted?)"
    lost = Move(MoveKind.MARK_LOST, reason=gone)
    assert decide(_at(S.RUNNING, None)) == Need(Fact.RUN_END)  # no launch grace for a running driver
    assert _end(_at(S.RUNNING, None), final_stored=False, all_steps_done=False) == lost
    assert _end(_at(S.RUNNING, None), final_stored=True, all_steps_done=True, finished_cleanly=False) == lost
    finished = _end(_at(S.RUNNING, None), final_stored=True, all_steps_done=True, finished_cleanly=True)
    assert finished == Move(
        MoveKind.MOVE,
        S.SUCCEEDED,
        "the driver finished (exit 0, its final report stored); its Ray job is gone now",
    )
    assert _end(_at(S.STARTING, None), late=False).kind is MoveKind.NOTHING
    assert _end(_at(S.STARTING, None), late=True, driver_started=False).kind is MoveKind.RELAUNCH
    started = _end(_at(S.STARTING, None), late=True, driver_started=True, final_stored=False)
    assert started == lost
    assert _end(_at(S.CANCELLING, None), late=False).kind is MoveKind.NOTHING
    assert _end(_at(S.CANCELLING, None), late=True) == Move(
        MoveKind.MOVE, S.CANCELLED, "cancelled; the Ray job never started"
    )
    assert decide(_at(S.PREEMPTING, None)) == Move(
        MoveKind.MOVE, S.QUEUED, "preempted; its Ray job is gone, waiting to resume"
    )


def test_a_ray_job_that_still_runs() -> None:
    for ray in (R.PENDING, R.RUNNING):
        assert decide(_at(S.CANCELLING, ray)).kind is MoveKind.STOP_RAY_JOB  # type: ignore[union-attr]
        assert decide(_at(S.PREEMPTING, ray, grace=False)).kind is MoveKind.NOTHING  # type: ignore[union-attr]
        assert decide(_at(S.PREEMPTING, ray, grace=True)).kind is MoveKind.STOP_RAY_JOB  # type: ignore[union-attr]
        assert decide(_at(S.STARTING, ray)).kind is MoveKind.NOTHING  # type: ignore[union-attr]
    silent = _end(_at(S.RUNNING, R.RUNNING), silence=75.4, api_answers=True)
    assert silent == Move(
        MoveKind.MARK_LOST,
        reason=f"the driver sent nothing for 75s while Ray job {SUB} was RUNNING; stopped",
        stop_first=True,
    )
    assert _end(_at(S.RUNNING, R.RUNNING), silence=75.4, api_answers=False).kind is MoveKind.NOTHING


def test_a_ray_job_that_succeeded() -> None:
    assert decide(_at(S.RUNNING, R.SUCCEEDED)) == Need(Fact.RUN_END)  # its reports, before anything
    assert _end(_at(S.RUNNING, R.SUCCEEDED), final_stored=False, all_steps_done=True).kind is (
        MoveKind.AWAIT_FINAL_REPORT
    )
    assert _end(_at(S.RUNNING, R.SUCCEEDED), final_stored=True, all_steps_done=True) == Move(
        MoveKind.MOVE, S.SUCCEEDED, "the driver finished and its final report is stored"
    )
    checkpointed = _end(_at(S.PREEMPTING, R.SUCCEEDED), final_stored=False, all_steps_done=False)
    assert checkpointed == Move(
        MoveKind.MOVE, S.QUEUED, "preempted; the driver checkpointed and exited, waiting to resume"
    )
    # a preempted driver that had trained every step (the spool may say so only now) succeeds
    preempted_done = _end(_at(S.PREEMPTING, R.SUCCEEDED), final_stored=True, all_steps_done=True)
    assert preempted_done.to == S.SUCCEEDED
    assert _end(_at(S.CANCELLING, R.SUCCEEDED), final_stored=True, all_steps_done=True) == Move(
        MoveKind.MOVE, S.CANCELLED, "the driver finished"
    )


def test_a_ray_job_that_was_stopped_or_failed() -> None:
    ended = {"final_stored": False, "all_steps_done": False}
    assert _end(_at(S.CANCELLING, R.STOPPED), **ended).reason == "the Ray job was stopped"
    assert _end(_at(S.CANCELLING, R.FAILED), **ended).reason == "cancelled"
    for ray in (R.STOPPED, R.FAILED):
        assert _end(_at(S.PREEMPTING, ray), **ended) == Move(
            MoveKind.MOVE, S.QUEUED, "preempted; waiting to resume"
        )
    outside = Verdict(True, f"Ray job {SUB} ended STOPPED outside the platform")
    assert _end(_at(S.RUNNING, R.STOPPED), **ended, log_tail=TAIL, verdict=outside) == Move(
        MoveKind.MARK_LOST, reason=outside.why, log_tail=TAIL
    )
    assert _end(_at(S.RUNNING, R.FAILED), **ended, log_tail=TAIL, verdict=LOST) == Move(
        MoveKind.MARK_LOST, reason=LOST.why, log_tail=TAIL
    )
    failed = _end(_at(S.RUNNING, R.FAILED), **ended, log_tail=TAIL, verdict=USER)
    assert failed == Move(
        MoveKind.MOVE,
        S.FAILED,
        "Job entrypoint command failed with exit code 1: ZeroDivisionError: division by zero",
        failure=FailureReason.USER_CODE,
        log_tail=TAIL,
    )
    assert _end(_at(S.STARTING, R.FAILED), **ended, log_tail=(), verdict=SETUP).failure == FailureReason.SETUP
