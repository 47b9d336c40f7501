"""Weight sync into engines the trainer's rank actors host (`EngineKind.IN_TRAINER`): each rank copies its
weights into its own engine in place (`runtime.roles.colocated.ColocatedActor.push_weights_in_place`, through
`in_place.InPlaceWeightSync`); nothing goes through the object store. Receivers that are actors of their
own (none in a colocated job today) still get the weights through the object store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from runtime.weight_sync.base import WEIGHT_SYNC_BACKENDS, WeightSync, WeightSyncBackend, push_split
from runtime.weight_sync.object_store import ObjectStoreWeightSync

if TYPE_CHECKING:
    import ray

    from runtime.roles.groups import TrainGroup
    from runtime.weight_sync.base import WeightReceiver


@WEIGHT_SYNC_BACKENDS.register(WeightSyncBackend.IN_PLACE)
class InTrainerWeightSync(WeightSync):
    """A receiver hosted in the trainer's ranks (`in_trainer`) is pushed in place; any other through
    Ray's object store."""

    def __init__(self) -> None:
        self.object_store = ObjectStoreWeightSync()

    def push(
        self, train: TrainGroup, receivers: Sequence[WeightReceiver], *, version: int, wait: bool = True
    ) -> list[ray.ObjectRef]:
        def direct(receiver: WeightReceiver) -> list[ray.ObjectRef] | None:
            if not getattr(receiver, "in_trainer", False):
                return None
            return receiver.async_push_in_place(train, version)  # type: ignore[attr-defined]

        refs = push_split(train, receivers, version, direct, self.object_store)
        if wait and refs:
            import ray

            ray.get(refs)
        return refs
