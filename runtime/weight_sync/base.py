"""The `WeightSync` interface (trainer -> rollout engines) and its backend registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import StrEnum
from typing import TYPE_CHECKING

from runtime.registry import Registry

if TYPE_CHECKING:
    from runtime.roles.groups import RolloutGroup, TrainGroup


class WeightSyncBackend(StrEnum):
    OBJECT_STORE = "object_store"  # trainer puts its state dict in Ray's object store once; engines read it
    # later: "nccl" (broadcast from the trainer rank to engine ranks), "disk" (HF folder on shared storage)


class WeightSync(ABC):
    """Moves the trainer's current weights into every rollout engine and stamps them with a version.

    The driver calls `push` after a training step (every `update-weights-interval` steps); samples
    record the version they were generated with.
    """

    @abstractmethod
    def push(self, train: TrainGroup, rollout: RolloutGroup, *, version: int) -> None: ...


WEIGHT_SYNC_BACKENDS: Registry[type[WeightSync]] = Registry("weight sync backend")


def create_weight_sync(name: str) -> WeightSync:
    from runtime.weight_sync import object_store  # noqa: F401 - registers the built-in backend

    return WEIGHT_SYNC_BACKENDS.get(name)()
