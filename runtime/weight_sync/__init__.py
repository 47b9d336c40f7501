"""Weight sync from the trainer to the rollout engines, behind one interface with registered backends."""

from runtime.weight_sync import collective, in_trainer, object_store  # noqa: F401 - register the built-in backends
from runtime.weight_sync.base import WEIGHT_SYNC_BACKENDS, WeightSync, WeightSyncBackend
from runtime.weight_sync.select import WEIGHT_SYNC_ENV, weight_sync_for


def create_weight_sync(name: str) -> WeightSync:
    """The registered backend `name` (`--update-weight-backend`), made anew."""
    return WEIGHT_SYNC_BACKENDS.get(name)()


__all__ = [
    "WEIGHT_SYNC_BACKENDS",
    "WEIGHT_SYNC_ENV",
    "WeightSync",
    "WeightSyncBackend",
    "create_weight_sync",
    "weight_sync_for",
]
