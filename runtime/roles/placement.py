"""Turns `resource` / `colocate` into Ray placement: one placement group per role, or one shared group
for colocated roles, and what each role's actors ask for.

The colocated group is laid out as the job spec's demand reads `resource` (`jobspec.demand.role_layout`,
the reading the scheduler places): one bundle per GPU of the host role (the actor's, or in colocated PPO
the rollout engines', which span the actor's GPUs and then the critic's), each role on its range of them.

`resource` reads as in Relax: `{"role": [replicas, gpus]}` where `gpus` is the role's total device count
(one device = a GPU, or one CPU on CPU pools). The torch backend trains on one device, so `actor` is one
device; a multi-rank backend (megatron) runs one trainer actor per rank over the actor's devices
(`train_world_size`: one rank per GPU; on CPU at least the model-parallel size, several ranks sharing a
slot); `rollout` starts one engine per device. `reference` and `actor_fwd`, when listed and not
colocated, are forward-only actors of their own (one device each); colocated, those models live in the
trainer's process, sharing its device, as Relax swaps them into the actor's GPUs. PPO's `critic` trains
on devices of its own, colocated or not: one (the torch backend; a megatron critic entry of one device), or,
under a multi-rank backend, one rank per device of its entry, laid out as the trainer's ranks
(`critic_world_size`); `advantages` (Relax: `[1, 0]`, a CPU-only role) runs in the driver and takes no slot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from runtime.devices import Device, DeviceKind

if TYPE_CHECKING:
    from jobspec.demand import ResourceDemand

log = logging.getLogger(__name__)


class Role(StrEnum):
    ACTOR = "actor"  # the trainer (policy, optimizer; reference model when colocated)
    ROLLOUT = "rollout"  # generation engines
    REFERENCE = "reference"  # forward-only reference model for KL terms
    ACTOR_FWD = "actor_fwd"  # forward-only copy of the policy computing old log-probs
    CRITIC = "critic"  # PPO's value model and its optimizer
    ADVANTAGES = "advantages"  # PPO's advantage computation: in the driver here, no slot


SUPPORTED_ROLES = frozenset(Role)
DEFAULT_RESOURCE = {"actor": [1, 1], "rollout": [1, 1]}
# In a colocated slot the roles split the slot; they take turns on it (offload/onload), so the split only
# tells Ray that both fit. On CPU a slot is one CPU.
COLOCATED_SHARE = 0.5
COLOCATED_GROUP = "colocated"  # the placement group colocated roles share
NODE_ID_LABEL = "ray.io/node-id"  # the label every Ray node carries with its own id (Ray >= 2.49)


def engine_group(index: int) -> str:
    """The placement group of elastic rollout engine `index` (`plan_topology(elastic_engines=True)`): one engine's
    device, reserved and released with the engine (`runtime.roles.elastic`)."""
    return f"{Role.ROLLOUT}-engine-{index}"


def device_bundle(device: Device) -> dict[str, float]:
    """One device's bundle: a GPU with a CPU for its process, or a CPU slot on CPU pools."""
    return {"GPU": 1.0, "CPU": 1.0} if device.kind is DeviceKind.CUDA else {"CPU": 1.0}


def engine_placement_group(device: Device, node: str | None) -> PlacementGroup:
    """A placement group of one device for an elastic engine added between steps, on Ray node `node` (the one
    the scheduling pass granted; None: wherever Ray has room, a standalone run). Not waited for: the engine's
    actor starts once Ray has reserved it (`runtime.roles.elastic` bounds that by `--scale-out-timeout`)."""
    return placement_group(
        [device_bundle(device)],
        strategy="PACK",
        name="",
        bundle_label_selector=[{NODE_ID_LABEL: node}] if node else None,
    )


class UnsupportedTopology(ValueError):
    """The spec asks for a layout this backend cannot run (the message names the parameter)."""


@dataclass(frozen=True)
class Slot:
    """Where one actor goes (a bundle of a named placement group) and what it asks Ray for."""

    group: str
    bundle_index: int
    share: float  # fraction of the bundle's device (1.0 = the whole slot)

    def ray_options(self, pgs: dict[str, PlacementGroup], device: Device) -> dict[str, Any]:
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=pgs[self.group], placement_group_bundle_index=self.bundle_index
        )
        if device.kind is DeviceKind.CUDA:
            return {"num_gpus": self.share, "num_cpus": 0.5 * self.share, "scheduling_strategy": strategy}
        return {"num_cpus": self.share, "scheduling_strategy": strategy}


@dataclass(frozen=True)
class Topology:
    device: Device
    colocate: bool
    groups: dict[str, int]  # placement group name -> number of bundles (one device each)
    slots: dict[Role, tuple[Slot, ...]] = field(default_factory=dict)
    # placement group name -> the demand's role whose GPUs its bundles are (the colocated group's host, an
    # elastic engine's role); a group not named here is its own role's
    hosts: dict[str, str] = field(default_factory=dict)
    # placement group name -> the index among its host's GPUs of its first bundle (an elastic engine's group:
    # the engine's index); a group not named here starts at the host's first GPU
    offsets: dict[str, int] = field(default_factory=dict)

    @property
    def num_bundles(self) -> int:
        return sum(self.groups.values())

    def bundles(self, group: str) -> list[dict[str, float]]:
        return [device_bundle(self.device) for _ in range(self.groups[group])]

    def bundle_selectors(self, group: str, nodes: dict[str, list[str | None]]) -> list[dict[str, str]] | None:
        """Ray's per-bundle label selectors pinning each bundle of `group` to the Ray node the scheduling pass
        allocated its GPU on (`nodes`: `jobspec.demand.gpu_nodes` of the job's allocations); None when the
        pass named no Ray node for any of them (a standalone run, nodes known by hostname only)."""
        ids = nodes.get(self.hosts.get(group, group)) or []
        first = self.offsets.get(group, 0)
        selectors = [
            {NODE_ID_LABEL: ids[first + i]} if first + i < len(ids) and ids[first + i] else {}
            for i in range(self.groups[group])
        ]
        return selectors if any(selectors) else None

    def role_slots(self, role: Role) -> tuple[Slot, ...]:
        return self.slots.get(role, ())

    @property
    def train_slots(self) -> tuple[Slot, ...]:
        return self.role_slots(Role.ACTOR)

    @property
    def rollout_slots(self) -> tuple[Slot, ...]:
        return self.role_slots(Role.ROLLOUT)


def spec_engines(resource: dict[str, Any] | None) -> int:
    """The rollout engines `resource` asks for: one per device of its rollout entry (an elastic job's count before
    the scheduling pass resizes it, `runtime.roles.elastic`)."""
    return _pair(resource or DEFAULT_RESOURCE, Role.ROLLOUT)[1]


def _pair(resource: dict[str, Any], role: str) -> tuple[int, int]:
    value = resource.get(role, DEFAULT_RESOURCE.get(role))
    if not (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and v >= 0 for v in value)
        and value[0] > 0
    ):
        raise UnsupportedTopology(
            f"resource.{role} must be [replicas, devices] with a positive replica count, got {value!r}"
        )
    return int(value[0]), int(value[1])


def plan_topology(
    resource: dict[str, Any] | None,
    *,
    colocate: bool,
    with_rollout: bool,
    device: Device,
    with_train: bool = True,
    separate_roles: tuple[Role, ...] = (),
    with_critic: bool = False,
    train_world: int | None = None,
    critic_world: int | None = None,
    demand: ResourceDemand | None = None,
    elastic_engines: bool = False,
    rollout_engines: int | None = None,
) -> Topology:
    """Slots for the trainer, the engines, the forward-only roles named in `separate_roles` (those the
    job needs and `resource` lists) and PPO's critic.

    `train_world`: None for the torch backend (one trainer on one device); for a multi-rank backend the
    number of trainer ranks (`train_world_size`), laid out contiguously over the actor's devices, each
    device holding `train_world / devices` ranks.

    `critic_world`: None for a one-process critic (the torch backend, or one megatron-core rank), which
    trains on one device; for a multi-rank critic its number of ranks (`critic_world_size`), laid out over
    the critic's devices as the trainer's ranks are over the actor's.

    Colocated (`colocate` without hybrid): the roles share one placement group laid out as `demand` (the job
    spec's, `jobspec.demand.compute_demand`; computed from `resource` here when not given) reads it: one
    bundle per GPU of the host, the trainer's ranks over the actor's range, the critic's over its own (in
    colocated PPO, after the actor's), one engine per GPU of the rollout's range; roles sharing a bundle
    take half of it each (they take turns). Otherwise each role has a placement group of its own, the
    critic too (it trains while the policy trains).

    `elastic_engines` (`--autoscaler-config`, engines of their own): each rollout engine has a placement group
    of one device (`engine_group(i)`), so that an engine scaled in gives its device back to Ray, and engine i's
    is pinned where the pass allocated the rollout's GPU i. `rollout_engines`: how many engines start (an
    elastic job's allocation may hold more or fewer than `resource` asks); None: `resource`'s count.
    """
    resource = resource or DEFAULT_RESOURCE
    unknown = sorted(set(resource) - SUPPORTED_ROLES)
    if unknown:
        raise UnsupportedTopology(
            f"resource roles {unknown} are not implemented by the torch backend "
            f"(it runs {sorted(SUPPORTED_ROLES)})"
        )
    actor_devices = 1
    if with_train:
        replicas, actor_devices = _pair(resource, Role.ACTOR)
        if train_world is None and actor_devices != 1:
            raise UnsupportedTopology(
                f"resource.actor={[replicas, actor_devices]}: the torch train backend trains on one device; "
                "use [1, 1]"
            )
        if train_world is not None and actor_devices < 1:
            raise UnsupportedTopology(
                f"resource.actor={[replicas, actor_devices]}: the trainer needs a device"
            )
    if colocate and with_train and with_rollout:
        if demand is None:
            demand = resource_demand(resource, colocate=True, with_critic=with_critic)
        return _colocated(demand, device, train_world, critic_world, with_critic)
    groups: dict[str, int] = {}
    slots: dict[Role, tuple[Slot, ...]] = {}
    if with_critic:
        replicas, devices = _pair(resource, Role.CRITIC) if Role.CRITIC in resource else (1, 1)
        if replicas != 1 or (critic_world is None and devices > 1):
            raise UnsupportedTopology(
                f"resource.critic={[replicas, devices]}: the torch backend's critic trains on one device; "
                "use [1, 1] (a multi-rank backend runs one critic rank per device)"
            )
        bundles = max(devices, 1) if critic_world is not None else 1
        groups[str(Role.CRITIC)] = bundles
        slots[Role.CRITIC] = _rank_slots(str(Role.CRITIC), bundles, critic_world or 1, 1.0)
    if with_train:
        bundles = actor_devices if train_world is not None else 1
        groups[str(Role.ACTOR)] = bundles
        slots[Role.ACTOR] = _rank_slots(str(Role.ACTOR), bundles, train_world or 1, 1.0)
    hosts: dict[str, str] = {}
    offsets: dict[str, int] = {}
    if with_rollout:
        engines = _pair(resource, Role.ROLLOUT)[1] if rollout_engines is None else rollout_engines
        if engines < 1:
            raise UnsupportedTopology("resource.rollout needs at least one device for the rollout engines")
        if elastic_engines:
            names = [engine_group(i) for i in range(engines)]
            for i, name in enumerate(names):
                groups[name], hosts[name], offsets[name] = 1, str(Role.ROLLOUT), i
            slots[Role.ROLLOUT] = tuple(Slot(name, 0, 1.0) for name in names)
        else:
            groups[str(Role.ROLLOUT)] = engines
            slots[Role.ROLLOUT] = tuple(Slot(str(Role.ROLLOUT), i, 1.0) for i in range(engines))
    for role in separate_roles:
        replicas, devices = _pair(resource, role)
        if devices > 1 or replicas != 1:
            raise UnsupportedTopology(
                f"resource.{role}={[replicas, devices]}: the torch backend runs it on one device; use [1, 1]"
            )
        groups[str(role)] = 1
        slots[role] = (Slot(str(role), 0, 1.0),)
    return Topology(device, False, groups, slots, hosts=hosts, offsets=offsets)


def _colocated(
    demand: ResourceDemand,
    device: Device,
    train_world: int | None,
    critic_world: int | None,
    with_critic: bool,
) -> Topology:
    """The colocated placement group as the demand lays it out (`jobspec.demand.role_layout`)."""
    from jobspec.demand import role_layout

    layout = role_layout(demand)
    actor = layout.get(str(Role.ACTOR))
    rollout = layout.get(str(Role.ROLLOUT))
    if actor is None or rollout is None or rollout.host != actor.host:
        raise UnsupportedTopology(
            f"colocate: the demand shares no GPUs between actor and rollout ({demand.summary})"
        )
    host = next(g for g in demand.groups if g.role == actor.host)
    bundles = host.gpus
    placed = {str(Role.ACTOR): actor, str(Role.ROLLOUT): rollout}
    critic = layout.get(str(Role.CRITIC)) if with_critic else None
    if critic is not None and critic.shared:
        placed[str(Role.CRITIC)] = critic
    for role, where in placed.items():
        if where.first + where.gpus > bundles:
            raise UnsupportedTopology(
                f"resource.{role}: {where.gpus} device(s) from device {where.first} do not fit in the "
                f"{bundles} device(s) of {host.role}, which it shares"
            )
    if train_world is None and actor.gpus != 1:
        raise UnsupportedTopology(
            f"resource.actor={[1, actor.gpus]}: the torch train backend trains on one device; use [1, 1]"
        )
    slots: dict[Role, tuple[Slot, ...]] = {
        Role.ACTOR: _rank_slots(COLOCATED_GROUP, actor.gpus, train_world or 1, COLOCATED_SHARE, actor.first),
        Role.ROLLOUT: tuple(Slot(COLOCATED_GROUP, i, COLOCATED_SHARE) for i in rollout.bundles),
    }
    groups = {COLOCATED_GROUP: bundles}
    if str(Role.CRITIC) in placed:
        assert critic is not None
        if critic_world is None and critic.gpus != 1:
            raise UnsupportedTopology(
                f"resource.critic={[1, critic.gpus]}: the torch backend's critic trains on one device; use [1, 1]"
            )
        slots[Role.CRITIC] = _rank_slots(
            COLOCATED_GROUP, critic.gpus, critic_world or 1, COLOCATED_SHARE, critic.first
        )
    elif with_critic:  # a critic of its own (the demand gives it GPUs the rollout does not span)
        devices = critic.gpus if critic is not None else 1
        bundles_c = max(devices, 1) if critic_world is not None else 1
        groups[str(Role.CRITIC)] = bundles_c
        slots[Role.CRITIC] = _rank_slots(str(Role.CRITIC), bundles_c, critic_world or 1, 1.0)
    return Topology(device, True, groups, slots, hosts={COLOCATED_GROUP: host.role})


def resource_demand(resource: dict[str, Any] | None, *, colocate: bool, with_critic: bool) -> ResourceDemand:
    """The job spec's demand of `resource` (`jobspec.demand.compute_demand`, every other parameter at its
    default): for a caller that has only the `resource` mapping, not the job's whole spec."""
    from jobspec.demand import compute_demand
    from jobspec.spec import FIELDS

    values = {name: getattr(f, "default", None) for name, f in FIELDS.items()}
    values.update(resource=resource or DEFAULT_RESOURCE, colocate=colocate)
    if with_critic:
        values["advantage_estimator"] = "ppo"
    return compute_demand(values)


def spec_demand(values: dict[str, Any]) -> ResourceDemand:
    """The job's demand, as the platform computed it at submission (`jobspec.demand.compute_demand` over the
    normalized spec's values; a parameter the mapping lacks at its default)."""
    from jobspec.demand import compute_demand
    from jobspec.spec import FIELDS

    defaults = {name: getattr(f, "default", None) for name, f in FIELDS.items()}
    return compute_demand({**defaults, **{k: v for k, v in values.items() if k in defaults}})


def _rank_slots(group: str, bundles: int, ranks: int, share: float, first: int = 0) -> tuple[Slot, ...]:
    """Ranks 0..ranks-1 over `bundles` bundles from bundle `first` on, contiguously (ranks of one bundle are
    neighbours, as tensor-parallel peers should be), each taking an equal part of its bundle's `share`."""
    per_bundle = ranks // bundles
    return tuple(Slot(group, first + rank // per_bundle, share / per_bundle) for rank in range(ranks))


def train_world_size(resource: dict[str, Any] | None, model_parallel: int, device: Device) -> int:
    """How many trainer ranks a multi-rank backend runs: one per actor device; on CPU, where a rank is a
    process and not a device, at least `model_parallel` (tensor x pipeline x context parallel sizes), so
    a `tensor-model-parallel-size 2` job runs on one CPU slot as two processes. The world must be a
    multiple of `model_parallel` (the rest is data parallel) and of the device count (ranks share
    devices evenly)."""
    return _world_size(Role.ACTOR, _pair(resource or DEFAULT_RESOURCE, Role.ACTOR)[1], model_parallel, device)


def critic_world_size(resource: dict[str, Any] | None, model_parallel: int, device: Device) -> int:
    """How many ranks a multi-rank backend's critic runs: 1 when its `resource` entry has one device (or
    none: one rank, with the model-parallel sizes set to 1, so a one-device critic keeps working whatever
    the policy's layout), else as the trainer's ranks (`train_world_size`) over the critic's devices, in the
    job's own parallel layout, as Relax runs its critic."""
    pair = _pair(resource, Role.CRITIC) if resource and Role.CRITIC in resource else (1, 1)
    if pair[1] <= 1:
        return 1
    return _world_size(Role.CRITIC, pair[1], model_parallel, device)


def _world_size(role: Role, devices: int, model_parallel: int, device: Device) -> int:
    world = devices
    if device.kind is DeviceKind.CPU and world < model_parallel:
        world = model_parallel
    if world % model_parallel:
        raise UnsupportedTopology(
            f"resource.{role} has {devices} device(s): a multiple of the model-parallel size {model_parallel} "
            "(tensor x pipeline x context parallel) is needed"
        )
    if devices < 1 or world % devices:
        raise UnsupportedTopology(f"resource.{role}={devices} device(s) cannot hold {world} ranks evenly")
    return world


def reserve(
    topology: Topology, *, nodes: dict[str, list[str | None]] | None = None, timeout_s: float = 120.0
) -> dict[str, PlacementGroup]:
    """Create one placement group per group of the topology and wait until Ray has reserved them all
    (fails clearly instead of hanging). `nodes` (`jobspec.demand.gpu_nodes` of the job's allocations): each
    bundle on the Ray node the scheduling pass chose for its GPU."""
    pgs: dict[str, PlacementGroup] = {}
    try:
        for name in topology.groups:
            selectors = topology.bundle_selectors(name, nodes or {})
            pgs[name] = placement_group(
                topology.bundles(name), strategy="PACK", name="", bundle_label_selector=selectors
            )
        ray.get([pg.ready() for pg in pgs.values()], timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        release(pgs)
        available = ray.available_resources()
        where = f" on the nodes the scheduler chose ({nodes})" if nodes else ""
        raise RuntimeError(
            f"could not reserve {dict(topology.groups)}{where} within {timeout_s:.0f}s; cluster has {available}"
        ) from None
    except BaseException:
        release(pgs)
        raise
    log.info("reserved placement group(s) %s", {name: topology.groups[name] for name in pgs})
    return pgs


def release(pgs: dict[str, PlacementGroup]) -> None:
    for pg in pgs.values():
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            log.debug("placement group already gone", exc_info=True)
