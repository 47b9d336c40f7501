"""Turns `resource` / `colocate` into Ray placement: bundles, and what each role's actors ask for."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from runtime.devices import Device, DeviceKind

log = logging.getLogger(__name__)

DEFAULT_RESOURCE = {"actor": [1, 1], "rollout": [1, 1]}
# In a colocated slot the roles split the slot; they take turns on it (offload/onload), so the split only
# tells Ray that both fit. On CPU a slot is one CPU.
COLOCATED_SHARE = 0.5


class UnsupportedTopology(ValueError):
    """The spec asks for a layout this backend cannot run (the message names the parameter)."""


@dataclass(frozen=True)
class Slot:
    """Where one actor goes and what it asks Ray for."""

    bundle_index: int
    share: float  # fraction of the bundle's device (1.0 = the whole slot)

    def ray_options(self, pg: PlacementGroup, device: Device) -> dict[str, Any]:
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=self.bundle_index
        )
        if device.kind is DeviceKind.CUDA:
            return {"num_gpus": self.share, "num_cpus": 0.5 * self.share, "scheduling_strategy": strategy}
        return {"num_cpus": self.share, "scheduling_strategy": strategy}


@dataclass(frozen=True)
class Topology:
    device: Device
    colocate: bool
    num_bundles: int
    train_slots: tuple[Slot, ...]
    rollout_slots: tuple[Slot, ...]

    def bundles(self) -> list[dict[str, float]]:
        unit = {"GPU": 1.0, "CPU": 1.0} if self.device.kind is DeviceKind.CUDA else {"CPU": 1.0}
        return [dict(unit) for _ in range(self.num_bundles)]


def _pair(resource: dict[str, Any], role: str) -> tuple[int, int]:
    value = resource.get(role, DEFAULT_RESOURCE[role])
    if not (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and v > 0 for v in value)
    ):
        raise UnsupportedTopology(
            f"resource.{role} must be [replicas, gpus] with positive integers, got {value!r}"
        )
    return int(value[0]), int(value[1])


def plan_topology(
    resource: dict[str, Any] | None, *, colocate: bool, with_rollout: bool, device: Device
) -> Topology:
    """One device (a GPU, or one CPU on CPU pools) per unit of `resource`.

    The torch backend trains in one process on one device, so `resource.actor` must amount to one unit;
    each rollout unit is one torch engine. Colocated, the engines share the slots and the trainer shares
    slot 0; otherwise trainer and engines get slots of their own.
    """
    resource = resource or DEFAULT_RESOURCE
    actor_replicas, actor_units = _pair(resource, "actor")
    if actor_replicas * actor_units != 1:
        raise UnsupportedTopology(
            f"resource.actor={[actor_replicas, actor_units]}: the torch train backend trains on one device; use [1, 1]"
        )
    engines = 0
    if with_rollout:
        rollout_replicas, rollout_units = _pair(resource, "rollout")
        engines = rollout_replicas * rollout_units
    if colocate and with_rollout:
        train = (Slot(0, COLOCATED_SHARE),)
        rollout = tuple(Slot(i, COLOCATED_SHARE) for i in range(engines))
        return Topology(device, True, max(engines, 1), train, rollout)
    train = (Slot(0, 1.0),)
    rollout = tuple(Slot(1 + i, 1.0) for i in range(engines))
    return Topology(device, False, 1 + engines, train, rollout)


def reserve(topology: Topology, *, timeout_s: float = 120.0) -> PlacementGroup:
    """Create the placement group and wait until Ray has reserved it (fails clearly instead of hanging)."""
    pg = placement_group(topology.bundles(), strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        available = ray.available_resources()
        raise RuntimeError(
            f"could not reserve {topology.bundles()} within {timeout_s:.0f}s; cluster has {available}"
        ) from None
    log.info("reserved placement group of %d bundle(s) %s", topology.num_bundles, topology.bundles()[0])
    return pg


def release(pg: PlacementGroup) -> None:
    try:
        remove_placement_group(pg)
    except Exception:  # noqa: BLE001 - best effort at shutdown
        log.debug("placement group already gone", exc_info=True)
