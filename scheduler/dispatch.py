"""How the API and the scheduling pass hand work to Celery: by task name and queue, ids only."""

from __future__ import annotations

import logging
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
