"""The Celery application: broker, queues and beat; the tasks themselves are in scheduler.tasks."""

from __future__ import annotations

from celery import Celery

from scheduler.dispatch import SCHEDULER_QUEUE, TASK_TICK
from scheduler.settings import Settings


def make_celery(settings: Settings, *, with_tasks: bool = True) -> Celery:
    broker = settings.broker_url
    if broker.startswith("sqla+"):
        # The SQL transport polls; its default 1 s makes every hand-off a second late. It takes the
        # interval only as a class attribute (as a transport option it reaches create_engine and fails).
        from kombu.transport import sqlalchemy as kombu_sql

        kombu_sql.Transport.polling_interval = settings.celery.broker_poll_seconds
        settings.home.mkdir(parents=True, exist_ok=True)
    app = Celery("relax", broker=broker, set_as_current=False)
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
    )
    if broker.startswith("redis"):
        # Redis re-delivers an unacknowledged task after this long; longer than any task runs.
        # (The SQL transport hands its transport options to create_engine, so not there.)
        app.conf.broker_transport_options = {"visibility_timeout": 3600}
    if with_tasks:
        from scheduler.tasks import register_tasks

        register_tasks(app, settings)
    return app
