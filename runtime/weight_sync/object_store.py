"""Weight sync through Ray's object store: one copy of the state dict, read by every engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.weight_sync.base import WEIGHT_SYNC_BACKENDS, WeightSync, WeightSyncBackend

if TYPE_CHECKING:
    from runtime.roles.groups import RolloutGroup, TrainGroup


@WEIGHT_SYNC_BACKENDS.register(WeightSyncBackend.OBJECT_STORE)
class ObjectStoreWeightSync(WeightSync):
    """The trainer's `named_weights()` result stays in the object store (never passes through the driver);
    each engine resolves the same reference. Right for CPU pools and small models; large models on GPUs
    want the NCCL backend."""

    def push(self, train: TrainGroup, rollout: RolloutGroup, *, version: int) -> None:
        weights_ref = train.async_named_weights()
        rollout.load_weights(weights_ref, version)
