"""How the API and the scheduling pass hand work to Celery: by task name and queue, ids only."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from celery import Celery

log = logging.getLogger(__name__)

SCHEDULER_QUEUE = "scheduler"

TASK_PASS = "relax.scheduling_pass"
TASK_LAUNCH = "relax.launch"
TASK_STOP = "relax.stop"
TASK_RECONCILE = "relax.reconcile_pool"
TASK_TICK = "relax.tick"


def pool_queue(pool: str) -> str:
    """Each pool's worker consumes its own queue, so launches reach a worker that can see its Ray."""
    return f"pool.{pool}"


class Dispatcher(Protocol):
    def request_pass(self) -> None: ...
    def launch(self, job_id: str, pool: str) -> None: ...
    def stop(self, job_id: str, pool: str) -> None: ...
    def reconcile(self, pool: str) -> None: ...


class CeleryDispatcher:
    def __init__(self, app: Celery) -> None:
        self.app = app

    def request_pass(self) -> None:
        self.app.send_task(TASK_PASS, queue=SCHEDULER_QUEUE)

    def launch(self, job_id: str, pool: str) -> None:
        self.app.send_task(TASK_LAUNCH, args=[job_id], queue=pool_queue(pool))

    def stop(self, job_id: str, pool: str) -> None:
        self.app.send_task(TASK_STOP, args=[job_id], queue=pool_queue(pool))

    def reconcile(self, pool: str) -> None:
        self.app.send_task(TASK_RECONCILE, args=[pool], queue=pool_queue(pool))


class CoalescingDispatcher:
    """A dispatcher whose `request_pass` returns at once: a thread of its own publishes the pass task, one for
    any number of requests made while it waits, at most one every `window` seconds (the API asks for a pass
    after every submission: at hundreds a second, a publish each would cost the request a round trip to the
    broker, and the worker as many passes). Every request is followed by a publish that starts after it, so
    the pass it asked for sees what the request committed. The rest goes through as it is."""

    def __init__(self, inner: Dispatcher, window: float = 0.2) -> None:
        self.inner = inner
        self.window = window
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pending = False
        self._thread: threading.Thread | None = None

    def request_pass(self) -> None:
        with self._lock:
            if self._pending:
                return  # the publish that is due has not started: it covers this request
            self._pending = True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._publisher, name="relax-pass-requests", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _publisher(self) -> None:
        last = float("-inf")
        while True:
            self._wake.wait()
            self._wake.clear()
            delay = last + self.window - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with self._lock:
                self._pending = False  # a request from now on gets a publish of its own
            last = time.monotonic()
            try:
                self.inner.request_pass()
            except Exception:  # the broker is away: the beat's next tick runs a pass anyway
                log.exception("could not request a scheduling pass")

    def launch(self, job_id: str, pool: str) -> None:
        self.inner.launch(job_id, pool)

    def stop(self, job_id: str, pool: str) -> None:
        self.inner.stop(job_id, pool)

    def reconcile(self, pool: str) -> None:
        self.inner.reconcile(pool)


class PassCoalescer:
    """Runs scheduling passes in one worker process: a pass asked for while one runs (or waits) is served by a
    single pass after it, and two passes start at least `min_interval` seconds apart, and further apart when
    passes are long: passes take at most `duty` of the time (the next starts no sooner than the last one's
    duration / `duty` after it started), so that a long backlog, which makes each pass longer while
    submissions keep asking for more, costs the scheduler a bounded share of a core instead of all of it.
    Each request is answered by a pass that starts after it (a pass sees what was committed before it
    started), so none is lost; the beat's periodic tick is the backstop if the process dies meanwhile."""

    def __init__(self, run: Callable[[], object], min_interval: float, duty: float = 1.0) -> None:
        if not 0 < duty <= 1:
            raise ValueError(f"duty must be in (0, 1], not {duty}")
        self._run = run
        self.min_interval = min_interval
        self.duty = duty
        self._lock = threading.Lock()
        self._busy = False  # a thread is running passes (or waiting to)
        self._again = False  # a request came after the current pass started
        self._last = float("-inf")
        self._took = 0.0  # how long the last pass ran

    def next_start(self) -> float:
        """The earliest `time.monotonic()` at which the next pass may start."""
        return self._last + max(self.min_interval, self._took / self.duty)

    def request(self) -> object | None:
        """Run a pass (the result of the last one this call ran), or None when the thread running passes
        takes this request over."""
        with self._lock:
            if self._busy:
                self._again = True
                return None
            self._busy = True
        try:
            while True:
                delay = self.next_start() - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                with self._lock:
                    self._again = False
                    self._last = time.monotonic()
                try:
                    result = self._run()
                finally:
                    self._took = time.monotonic() - self._last
                with self._lock:
                    if not self._again:
                        self._busy = False
                        return result
        except BaseException:
            with self._lock:
                self._busy = False
            raise
