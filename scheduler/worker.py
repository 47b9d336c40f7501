"""Entry of the Celery worker and beat: `celery -A scheduler.worker worker -Q scheduler,pool.local -B`."""

from __future__ import annotations

import sys

from celery import signals

from runtime.redaction import install_log_redaction
from scheduler.celery_app import make_celery
from scheduler.logs import configure_logging
from scheduler.settings import get_settings
from scheduler.tasks import register_tasks

install_log_redaction()  # no key or token in the worker's logs (Ray's errors included)
_PART = "beat" if "beat" in sys.argv[1:] else "worker"  # `celery ... beat`; `worker --beat` is a worker
configure_logging(
    _PART
)  # now, so that what Celery says before its own logging setup (warnings) is a log line


@signals.setup_logging.connect
def _logging(loglevel: int | str | None = None, **_: object) -> None:
    """Celery's own logging setup is replaced by the platform's (scheduler/logs.py: JSON lines or text, one
    switch, RELAX_LOG_FORMAT); connecting here is what tells Celery not to configure logging itself."""
    configure_logging(_PART, level=loglevel or "INFO")


_settings = get_settings()
app = make_celery(_settings)
register_tasks(app, _settings)  # the worker's tasks (and the beat's schedule runs them)
