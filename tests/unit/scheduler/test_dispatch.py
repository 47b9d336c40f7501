"""Pass requests coalesced: the API's publisher (CoalescingDispatcher) and a worker's passes (PassCoalescer).
The property both keep: every request is followed by a publish (a pass) that starts after it."""

from __future__ import annotations

import threading
import time

import pytest

from scheduler.dispatch import CoalescingDispatcher, PassCoalescer


class Recorder:
    def __init__(self, delay: float = 0.0) -> None:
        self.times: list[float] = []
        self.delay = delay
        self.lock = threading.Lock()

    def request_pass(self) -> None:
        with self.lock:
            self.times.append(time.monotonic())
        time.sleep(self.delay)

    def launch(self, job_id: str, pool: str) -> None:
        self.times.append(-1.0)

    stop = launch

    def reconcile(self, pool: str) -> None:
        self.times.append(-2.0)


def _wait_for(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_burst_of_requests_is_one_publish_or_two_and_the_last_follows_the_last_request() -> None:
    inner = Recorder()
    d = CoalescingDispatcher(inner, window=0.2)
    d.request_pass()  # the first goes out at once
    _wait_for(lambda: len(inner.times) == 1)
    last = 0.0
    for _ in range(200):  # within the window: one more publish, after the window
        d.request_pass()
        last = time.monotonic()
    _wait_for(lambda: len(inner.times) == 2)
    time.sleep(0.3)
    assert len(inner.times) == 2
    assert inner.times[1] >= last  # the publish came after every request it covers
    assert inner.times[1] - inner.times[0] >= 0.19  # at most one publish a window


def test_a_request_during_a_publish_gets_a_publish_of_its_own() -> None:
    inner = Recorder(delay=0.2)  # a slow broker
    d = CoalescingDispatcher(inner, window=0.0)
    d.request_pass()
    _wait_for(lambda: len(inner.times) == 1)
    asked = time.monotonic()  # the first publish is under way
    d.request_pass()
    _wait_for(lambda: len(inner.times) == 2)
    assert inner.times[1] >= asked


def test_the_other_calls_pass_through() -> None:
    inner = Recorder()
    d = CoalescingDispatcher(inner)
    d.launch("j", "p")
    d.stop("j", "p")
    d.reconcile("p")
    assert inner.times == [-1.0, -1.0, -2.0]


def test_a_failing_publish_is_logged_and_the_next_request_publishes_again() -> None:
    calls: list[int] = []

    class Broken(Recorder):
        def request_pass(self) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise ConnectionError("broker away")

    d = CoalescingDispatcher(Broken(), window=0.0)
    d.request_pass()
    _wait_for(lambda: len(calls) == 1)
    time.sleep(0.05)
    d.request_pass()
    _wait_for(lambda: len(calls) == 2)


def test_passes_asked_for_while_one_runs_are_served_by_one_pass_after_it() -> None:
    starts: list[float] = []
    release = threading.Event()

    def run() -> str:
        starts.append(time.monotonic())
        if len(starts) == 1:
            release.wait(5)
        return f"pass {len(starts)}"

    c = PassCoalescer(run, min_interval=0.0)
    first = threading.Thread(target=c.request)
    first.start()
    _wait_for(lambda: len(starts) == 1)
    asked = time.monotonic()
    assert [c.request() for _ in range(5)] == [None] * 5  # taken over by the running thread
    release.set()
    first.join(5)
    assert len(starts) == 2 and starts[1] >= asked  # one more pass, started after the requests
    assert c.request() == "pass 3"  # idle again: a request runs its own pass


def test_two_passes_start_at_least_the_interval_apart() -> None:
    starts: list[float] = []
    c = PassCoalescer(lambda: starts.append(time.monotonic()), min_interval=0.2)
    c.request()
    c.request()
    assert len(starts) == 2 and starts[1] - starts[0] >= 0.19


def test_a_failing_pass_leaves_the_coalescer_usable() -> None:
    calls: list[int] = []

    def run() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("database away")

    c = PassCoalescer(run, min_interval=0.0)
    try:
        c.request()
    except RuntimeError:
        pass
    c.request()
    assert len(calls) == 2


def test_long_passes_take_at_most_their_duty_of_the_time() -> None:
    """A pass of 0.15 s with duty 0.25: the next starts 0.6 s after it started (not 0.05 s after the interval);
    a short pass afterwards brings the interval back."""
    starts: list[float] = []
    lengths = iter([0.15, 0.0, 0.0])

    def run() -> None:
        starts.append(time.monotonic())
        time.sleep(next(lengths))

    c = PassCoalescer(run, min_interval=0.05, duty=0.25)
    for _ in range(3):
        c.request()
    assert starts[1] - starts[0] >= 0.59
    assert starts[2] - starts[1] < 0.3  # 0.05 s interval after a pass of ~0 s (slack for a busy machine)
    with pytest.raises(ValueError, match="duty"):
        PassCoalescer(run, min_interval=0.0, duty=0.0)
