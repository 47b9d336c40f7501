"""The beat does not pile up ticks for a worker that is gone (scheduler/celery_app.py::TickScheduler): with
messages already waiting in the scheduler queue, no tick is sent; once the queue is taken, ticks go out
again. On each broker: the embedded SQL transport and Redis."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from scheduler.celery_app import TickScheduler, make_celery
from scheduler.dispatch import SCHEDULER_QUEUE, TASK_PASS, TASK_TICK, CeleryDispatcher
from scheduler.settings import CelerySettings, Settings
from tests.conftest import REDIS_URL
from tests.factories import drain_queue


@pytest.fixture(params=["embedded", "redis"])
def broker_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "embedded":
        return f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    redis.Redis.from_url(REDIS_URL).flushdb()
    return REDIS_URL


def test_no_tick_is_sent_while_the_scheduler_queue_is_not_taken(broker_url: str, tmp_path: Path) -> None:
    app = make_celery(Settings(home=tmp_path, celery=CelerySettings(broker_url=broker_url)))
    assert app.conf.beat_scheduler == "scheduler.celery_app:TickScheduler"
    beat = TickScheduler(app=app, schedule_filename=str(tmp_path / "schedule"), lazy=True)
    beat.setup_schedule()
    tick = beat.schedule["tick"]
    drain_queue(app, SCHEDULER_QUEUE, wait=0.2)  # whatever an earlier test left there

    beat.apply_entry(tick)  # an empty queue: the tick goes out
    assert [name for name, _ in drain_queue(app, SCHEDULER_QUEUE, wait=0.2)] == [TASK_TICK]

    for _ in range(TickScheduler.max_waiting):  # nobody takes the queue
        CeleryDispatcher(app).request_pass()
    for _ in range(5):
        beat.apply_entry(tick)
    assert [name for name, _ in drain_queue(app, SCHEDULER_QUEUE, wait=0.2)] == [
        TASK_PASS
    ] * TickScheduler.max_waiting

    beat.apply_entry(tick)  # taken again
    assert [name for name, _ in drain_queue(app, SCHEDULER_QUEUE, wait=0.2)] == [TASK_TICK]
