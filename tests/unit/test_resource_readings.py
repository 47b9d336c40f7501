"""One reading of `resource`: the job spec's demand (jobspec.demand), the scheduler's placement
(scheduler.policy.placement) and the driver's placement groups (runtime.roles.placement) lay a job's roles
on the same devices. Colocated PPO is the case they used to read three ways: Relax's rollout engines span
the actor's and the critic's GPUs, the actor and the critic train on GPUs of their own."""

from __future__ import annotations

from typing import Any

import pytest

from jobspec import normalize
from runtime.devices import Device, DeviceKind
from runtime.roles.placement import Role, plan_topology
from scheduler.policy import Node
from scheduler.policy.placement import PoolCapacity, gangs_of, place_demand

BASE: dict[str, Any] = {
    "hf_checkpoint": "/m",
    "ref_load": "/r",
    "prompt_data": "/d.jsonl",
    "rollout_batch_size": 8,
    "num_rollout": 3,
    "advantage_estimator": "ppo",
    "colocate": True,
}

# (spec, the trainer's ranks and the critic's for a multi-rank backend, or None for the torch backend)
CASES = {
    # examples/ppo-arith.yaml: the torch backend, one device each for the actor and the critic
    "torch": ({"train_backend": "torch", "resource": {"actor": [1, 1], "critic": [1, 1], "rollout": [1, 2],
                                                      "advantages": [1, 0]}}, None),
    # Relax's PPO scripts: megatron, actor and critic on 4 GPUs each (TP=2 x DP=2), engines over all 8
    "megatron": ({"train_backend": "megatron", "tensor_model_parallel_size": 2,
                  "resource": {"actor": [1, 4], "critic": [1, 4], "rollout": [1, 8], "advantages": [1, 0]}},
                 (4, 4)),
}  # fmt: skip


def _spec(case: str) -> tuple[Any, tuple[int, int] | None]:
    overrides, worlds = CASES[case]
    return normalize(obj={**BASE, **overrides}), worlds


def _demand_devices(result: Any) -> dict[str, int]:
    """GPUs per role as the demand counts them, and the job's total."""
    counts = {g.role: g.gpus for g in result.demand.groups}
    return {**counts, "total": result.demand.total_gpus}


def _scheduler_devices(result: Any, unit: int) -> dict[str, set[tuple[str, int]]]:
    """Each role's devices as the pass places them, on a pool of nodes of `unit` GPUs (one model-parallel
    group each): a device is (node, GPU of the node)."""
    demand = result.demand.model_dump(mode="json")
    cap = PoolCapacity("p", [Node(f"n{i}", "p", unit) for i in range(demand["total_gpus"] // unit)])
    cap.index()
    placement = place_demand(cap, gangs_of(demand), frozenset())
    assert placement is not None
    out: dict[str, set[tuple[str, int]]] = {}
    for a in placement.assignments:
        out.setdefault(a.role, set()).update((a.node, i) for i in range(a.gpus))
    return out


def _runtime_devices(result: Any, worlds: tuple[int, int] | None) -> tuple[dict[str, set[tuple]], int]:
    """Each role's devices as the driver reserves them (placement group, bundle), and the bundles in all."""
    spec = result.spec.to_dict()
    topology = plan_topology(
        spec["resource"],
        colocate=True,
        with_rollout=True,
        device=Device(DeviceKind.CUDA),
        with_critic=True,
        train_world=worlds[0] if worlds else None,
        critic_world=worlds[1] if worlds else None,
        demand=result.demand,
    )
    out = {
        str(role): {(s.group, s.bundle_index) for s in topology.role_slots(role)}
        for role in (Role.ACTOR, Role.CRITIC, Role.ROLLOUT)
    }
    return out, topology.num_bundles


@pytest.mark.parametrize("case", sorted(CASES))
def test_colocated_ppo_is_laid_out_alike_by_the_demand_the_scheduler_and_the_driver(case: str) -> None:
    result, worlds = _spec(case)
    actor_gpus, critic_gpus = result.spec.resource["actor"][1], result.spec.resource["critic"][1]
    # the demand: engines span actor + critic, which hold GPUs of their own; the job holds no more
    counts = _demand_devices(result)
    assert counts == {
        "actor": actor_gpus,
        "critic": critic_gpus,
        "rollout": actor_gpus + critic_gpus,
        "total": actor_gpus + critic_gpus,
    }
    unit = result.spec.tensor_model_parallel_size
    readings = {"scheduler": _scheduler_devices(result, unit), "driver": _runtime_devices(result, worlds)[0]}
    for name, devices in readings.items():
        actor, critic, rollout = devices["actor"], devices["critic"], devices["rollout"]
        assert (len(actor), len(critic)) == (actor_gpus, critic_gpus), name
        assert not actor & critic, f"{name}: the actor and the critic share a device"
        assert rollout == actor | critic, (
            f"{name}: the engines do not span the actor's and the critic's devices"
        )
    assert _runtime_devices(result, worlds)[1] == counts["total"]
