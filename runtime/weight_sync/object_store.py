"""Weight sync through Ray's object store: one copy of the state dict, read by every receiver."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from runtime.weight_sync.base import WEIGHT_SYNC_BACKENDS, WeightReceiver, WeightSync, WeightSyncBackend

if TYPE_CHECKING:
    import ray

    from runtime.roles.groups import TrainGroup


@WEIGHT_SYNC_BACKENDS.register(WeightSyncBackend.OBJECT_STORE)
class ObjectStoreWeightSync(WeightSync):
    """The trainer's `named_weights()` result stays in the object store (never passes through the driver);
    each receiver resolves the same reference. Right for CPU pools and small models; large models on GPUs
    want the NCCL backend."""

    def push(
        self, train: TrainGroup, receivers: Sequence[WeightReceiver], *, version: int, wait: bool = True
    ) -> list[ray.ObjectRef]:
        weights_ref = train.async_named_weights()
        refs = [ref for receiver in receivers for ref in receiver.async_load_weights(weights_ref, version)]
        if wait:
            import ray

            ray.get(refs)
        return refs
