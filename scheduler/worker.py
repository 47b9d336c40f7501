"""Entry of the Celery worker and beat: `celery -A scheduler.worker worker -Q scheduler,pool.local -B`."""

from __future__ import annotations

from runtime.redaction import install_log_redaction
from scheduler.celery_app import make_celery
from scheduler.settings import get_settings

install_log_redaction()  # no key or token in the worker's logs (Ray's errors included)
app = make_celery(get_settings())
