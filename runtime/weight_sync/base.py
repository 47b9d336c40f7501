"""The `WeightSync` interface (trainer -> rollout engines and forward-only roles) and its backend registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from runtime.registry import Registry

if TYPE_CHECKING:  # ray only for annotations: the package imports without it (in_place.py needs none)
    import ray

    from runtime.roles.groups import TrainGroup


class WeightSyncBackend(StrEnum):
    OBJECT_STORE = "object_store"  # trainer puts its state dict in Ray's object store once; engines read it
    IN_PLACE = "in_place"  # engines hosted in the trainer's rank actors: copied in place, device to device
    # the trainer's rank 0 broadcasts to the engines over a process group of their own, in buckets (NCCL on
    # GPU, gloo on CPU: the same code); the name is the one Relax users know
    COLLECTIVE = "nccl"
    # later: "disk" (HF folder on shared storage)


class WeightReceiver(Protocol):
    """A group of actors that take new weights (rollout engines, the actor_fwd / reference roles)."""

    def async_load_weights(self, weights_ref: ray.ObjectRef, version: int) -> list[ray.ObjectRef]: ...


class WeightSync(ABC):
    """Moves the trainer's current weights into every receiver and stamps them with a version.

    The driver pushes after a training step (every `update-weights-interval` steps); samples record the
    version they were generated with. `wait=False` returns as soon as the transfer is queued (fully-async
    mode: an engine applies it after the generate calls already queued on it); `ray.get` the returned refs
    to wait.
    """

    @abstractmethod
    def push(
        self, train: TrainGroup, receivers: Sequence[WeightReceiver], *, version: int, wait: bool = True
    ) -> list[ray.ObjectRef]: ...


def push_split(
    train: TrainGroup,
    receivers: Sequence[WeightReceiver],
    version: int,
    direct: Callable[[WeightReceiver], list[ray.ObjectRef] | None],
    fallback: WeightSync,
) -> list[ray.ObjectRef]:
    """Start a push without waiting: each receiver `direct` takes (it answers the calls' refs, or None for a
    receiver it cannot reach its own way) gets it so, in order; the others then all through `fallback`."""
    refs: list[ray.ObjectRef] = []
    others = []
    for receiver in receivers:
        pushed = direct(receiver)
        if pushed is None:
            others.append(receiver)
        else:
            refs += pushed
    if others:
        refs += fallback.push(train, others, version=version, wait=False)
    return refs


WEIGHT_SYNC_BACKENDS: Registry[type[WeightSync]] = Registry("weight sync backend")
