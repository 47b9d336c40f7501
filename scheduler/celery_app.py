"""The Celery application: broker, queues and beat; the tasks themselves are in scheduler.tasks."""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery import Celery
from celery.beat import PersistentScheduler

from scheduler.dispatch import SCHEDULER_QUEUE, TASK_TICK
from scheduler.settings import Settings

log = logging.getLogger(__name__)

# Worker command-line switches every worker of the platform runs with: Celery's worker-to-worker chatter (gossip,
# mingle, event heartbeats) serves nothing here (workers coordinate through the database; readiness reads each
# worker's heartbeat row), and gossip restarting after a lost Redis connection can kill the worker inside kombu
# ("'NoneType' object has no attribute 'hostname'", celery/kombu#582; seen once in a fresh-clone run of
# tests/integration/test_outages.py). docker/entrypoint.sh passes the same switches.
WORKER_FLAGS = ("--without-gossip", "--without-mingle", "--without-heartbeat")


def worker_argv(queues: str, *, name: str, threads: int) -> list[str]:
    """The command that starts a Celery worker of the platform on `queues` (comma-separated), `threads` threads,
    node name `name`: the embedded platform's and the tests' (docker/entrypoint.sh spells the same in shell).
    --quiet: no start-up banner on stdout, so that the worker's log holds only its log lines."""
    argv = [sys.executable, "-m", "celery", "-A", "scheduler.worker", "--quiet", "worker", "-Q", queues]
    return [*argv, "-P", "threads", "-c", str(threads), "-n", name, "--loglevel", "INFO", *WORKER_FLAGS]


class TickScheduler(PersistentScheduler):
    """Celery's beat scheduler, except that no tick is sent while `max_waiting` messages already wait in the
    scheduler queue: no worker takes them (it is down), and ticks piled up for it serve nothing (the issue
    saw 123). Each tick also expires after two periods, so a worker that comes back drops stale ones at
    once (docs/reliability.md)."""

    max_waiting = 3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._holding = False

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        if entry.task == TASK_TICK:
            waiting = self.waiting()
            if waiting is not None and waiting >= self.max_waiting:
                if not self._holding:
                    log.warning(
                        "%d messages wait in queue %s (no worker takes them): ticks held back",
                        waiting,
                        SCHEDULER_QUEUE,
                    )
                self._holding = True
                return
            if self._holding:
                log.warning("queue %s is taken again: ticks resume", SCHEDULER_QUEUE)
            self._holding = False
        super().apply_entry(entry, producer=producer)

    def waiting(self) -> int | None:
        """Messages waiting in the scheduler queue; None when the broker does not say (then ticks go out)."""
        try:
            with self.app.connection_for_read() as conn:
                ok = conn.default_channel.queue_declare(queue=SCHEDULER_QUEUE, passive=True)
                return int(ok.message_count)
        except Exception as err:  # noqa: BLE001 - a queue not declared yet holds nothing; else unknown
            return 0 if "NOT_FOUND" in str(err) or "no queue" in str(err) else None


def make_celery(settings: Settings) -> Celery:
    broker = settings.broker_url
    transport = None
    if broker.startswith("sqla+"):
        # kombu's SQL transport polls; its default 1 s makes every hand-off a second late, and a fixed short
        # interval keeps an idle platform busy: `scheduler.broker_sql` polls fast after a message and slower
        # as the queues stay empty. It takes the intervals only as class attributes (as transport options
        # they reach create_engine and fail); Celery names the class as `broker_transport`, with the URL
        # without kombu's `sqla+` prefix (a prefix would choose kombu's own class).
        from scheduler import broker_sql

        broker_sql.Transport.polling_interval = settings.celery.broker_poll_seconds
        broker_sql.Transport.idle_polling_interval = max(
            settings.celery.broker_idle_poll_seconds, settings.celery.broker_poll_seconds
        )
        broker, transport = broker.removeprefix("sqla+"), "scheduler.broker_sql:Transport"
        settings.home.mkdir(parents=True, exist_ok=True)
    app = Celery("relax", broker=broker, set_as_current=False)
    if transport is not None:
        app.conf.broker_transport = transport
    tick = settings.scheduler.tick_seconds
    app.conf.update(
        task_default_queue=SCHEDULER_QUEUE,
        task_ignore_result=True,
        # A task is acknowledged after it ran, so a worker that dies mid-task hands it to another;
        # every task is idempotent (it re-reads the job and compare-and-sets its status).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        beat_schedule={
            "tick": {
                "task": TASK_TICK,
                "schedule": tick,
                "options": {"queue": SCHEDULER_QUEUE, "expires": tick * 2},
            }
        },
        beat_schedule_filename=str(settings.home / "celerybeat-schedule"),
        beat_scheduler="scheduler.celery_app:TickScheduler",
    )
    if broker.startswith("redis"):
        # Redis re-delivers an unacknowledged task after this long; longer than any task runs.
        # (The SQL transport hands its transport options to create_engine, so not there.)
        app.conf.broker_transport_options = {"visibility_timeout": 3600}
    return app
