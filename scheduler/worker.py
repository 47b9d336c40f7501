"""Entry of the Celery worker and beat: `celery -A scheduler.worker worker -Q scheduler,pool.local -B`."""

from __future__ import annotations

from scheduler.celery_app import make_celery
from scheduler.settings import get_settings

app = make_celery(get_settings())
