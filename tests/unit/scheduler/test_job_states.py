"""The job state machine: every (from, to) pair is either allowed or refused, as the table says."""

from __future__ import annotations

import itertools

import pytest

from scheduler.domain.jobs import ALLOWED_TRANSITIONS, HOLDING_SLOTS, TERMINAL, JobStatus, can_transition

EXPECTED_ALLOWED = {
    ("QUEUED", "ADMITTED"),
    ("QUEUED", "CANCELLED"),
    ("QUEUED", "FAILED"),
    ("ADMITTED", "STARTING"),
    ("ADMITTED", "CANCELLED"),
    ("ADMITTED", "FAILED"),
    ("ADMITTED", "QUEUED"),
    ("STARTING", "RUNNING"),
    ("STARTING", "SUCCEEDED"),
    ("STARTING", "FAILED"),
    ("STARTING", "CANCELLING"),
    ("STARTING", "PREEMPTING"),
    ("STARTING", "QUEUED"),  # its driver was lost: requeued to resume from its checkpoint
    ("RUNNING", "SUCCEEDED"),
    ("RUNNING", "FAILED"),
    ("RUNNING", "CANCELLING"),
    ("RUNNING", "PREEMPTING"),
    ("RUNNING", "QUEUED"),  # its driver was lost: requeued to resume from its checkpoint
    ("CANCELLING", "CANCELLED"),
    ("CANCELLING", "FAILED"),
    ("PREEMPTING", "QUEUED"),
    ("PREEMPTING", "CANCELLING"),
    ("PREEMPTING", "FAILED"),
    ("PREEMPTING", "SUCCEEDED"),
}


@pytest.mark.parametrize("src,dst", list(itertools.product(JobStatus, JobStatus)))
def test_transition_table(src: JobStatus, dst: JobStatus) -> None:
    assert can_transition(src, dst) == ((src.value, dst.value) in EXPECTED_ALLOWED)


def test_terminal_states_are_final() -> None:
    for s in TERMINAL:
        assert s.is_terminal()
        assert ALLOWED_TRANSITIONS[s] == frozenset()


def test_every_path_from_queued_can_end() -> None:
    # From every status some chain of transitions reaches a terminal status.
    for start in JobStatus:
        seen, frontier = {start}, [start]
        while frontier:
            nxt = [d for s in frontier for d in ALLOWED_TRANSITIONS[s] if d not in seen]
            seen.update(nxt)
            frontier = nxt
        assert seen & TERMINAL, start


def test_slot_holders_are_exactly_the_admitted_to_preempting_statuses() -> None:
    assert HOLDING_SLOTS == {
        JobStatus.ADMITTED,
        JobStatus.STARTING,
        JobStatus.RUNNING,
        JobStatus.CANCELLING,
        JobStatus.PREEMPTING,
    }
