"""Weight sync from the trainer to the rollout engines, behind one interface with registered backends."""

from runtime.weight_sync.base import WEIGHT_SYNC_BACKENDS, WeightSync, WeightSyncBackend, create_weight_sync

__all__ = ["WEIGHT_SYNC_BACKENDS", "WeightSync", "WeightSyncBackend", "create_weight_sync"]
