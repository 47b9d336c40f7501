"""Work deferred until the unit of work commits (enqueueing tasks that must see committed rows)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)
_KEY = "relax_after_commit"


def after_commit(session: Session, fn: Callable[[], None]) -> None:
    """Run `fn` once the session's transaction commits; drop it if the transaction rolls back.

    A Celery task enqueued before the commit may run before its job row is visible.
    """
    session.info.setdefault(_KEY, []).append(fn)


@sa.event.listens_for(Session, "after_commit")
def _run_after_commit(session: Session) -> None:
    callbacks = session.info.pop(_KEY, [])
    for fn in callbacks:
        try:
            fn()
        except Exception:  # the commit stands; the periodic beat retries what was missed
            log.exception("after-commit callback failed")


@sa.event.listens_for(Session, "after_rollback")
def _drop_after_rollback(session: Session) -> None:
    session.info.pop(_KEY, None)
