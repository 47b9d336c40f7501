"""Weight sync from the trainer to the rollout engines, behind one interface with registered backends."""

from runtime.weight_sync import in_trainer, object_store  # noqa: F401 - register the built-in backends
from runtime.weight_sync.base import WEIGHT_SYNC_BACKENDS, WeightSync, WeightSyncBackend


def create_weight_sync(name: str) -> WeightSync:
    """The registered backend `name` (`--update-weight-backend`), made anew."""
    return WEIGHT_SYNC_BACKENDS.get(name)()


__all__ = ["WEIGHT_SYNC_BACKENDS", "WeightSync", "WeightSyncBackend", "create_weight_sync"]
