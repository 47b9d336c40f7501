"""Python's cyclic garbage collector in the platform's long-running processes (API workers, Celery workers)."""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Move every object alive after start-up (modules, the job spec's ~1,000 fields, SQLAlchemy's and
    pydantic's machinery: ~150,000 objects) out of the collector's sight, once per process. A full collection
    walks all of them: ~100 ms of a CPU, during which an API worker answers nothing and a scheduling pass
    stands still (bench/api_load.py). Garbage made later is collected as before."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()
