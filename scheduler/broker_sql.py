"""The embedded broker's transport: kombu's SQL transport, polling fast while messages flow and slower while
its queues stay empty.

kombu's SQL transport has no way to wake a consumer: it polls every queue it consumes, one `SELECT … FOR
UPDATE` each, then sleeps `polling_interval`. At a fixed 50 ms (a hand-off never waits longer) an idle
embedded platform's worker spent ~6 CPU-seconds a minute (10% of a core; the worker's CPU over 60 s of an
idle platform: 6.06 s polling every 0.05 s, 1.89 s every 0.5 s, 2.81 s with this transport, the beat's
tick every 2 s included). Here the wait after an empty
poll grows with the time since the last message (a quarter of it) from `polling_interval` up to
`idle_polling_interval`: a burst of hand-offs (a submission, its pass, the launch) still goes at the fast
rate, and the first message after a quiet spell waits at most `idle_polling_interval`.

`scheduler.celery_app.make_celery` selects it for `sqla+…` broker URLs (Celery's `broker_transport`) and
sets both intervals from the settings (`RELAX_BROKER_POLL_SECONDS`, `RELAX_BROKER_IDLE_POLL_SECONDS`)."""

from __future__ import annotations

from queue import Empty
from time import monotonic, sleep
from typing import Any

from kombu.transport import sqlalchemy as kombu_sql

IDLE_FRACTION = 4  # wait a quarter of the time since the last message


class Transport(kombu_sql.Transport):
    polling_interval: float = 0.05  # the wait right after a message
    idle_polling_interval: float = 0.5  # the longest wait, once idle for IDLE_FRACTION times as long

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_message = monotonic()

    def wait_after_empty_poll(self, idle_s: float) -> float:
        return min(self.idle_polling_interval, max(self.polling_interval, idle_s / IDLE_FRACTION))

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        """As kombu's virtual transport's, with the wait between empty polls from `wait_after_empty_poll`."""
        started = monotonic()
        while True:
            try:
                self.cycle.get(self._deliver, timeout=timeout)
            except Empty:
                now = monotonic()
                if timeout is not None and now - started >= timeout:
                    raise TimeoutError() from None
                wait = self.wait_after_empty_poll(now - self._last_message)
                if timeout is not None:
                    wait = min(wait, timeout - (now - started))
                sleep(max(wait, 0.0))
            else:
                self._last_message = monotonic()
                return
