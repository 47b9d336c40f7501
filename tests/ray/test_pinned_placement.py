"""The allocation is the placement: on a real Ray cluster of several nodes, the driver's placement groups land on
exactly the nodes the scheduling pass chose for each role (`jobspec.demand.gpu_nodes` of the allocations ->
per-bundle `ray.io/node-id` selectors), and two jobs never share a slot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jobspec import normalize
from jobspec.demand import gpu_nodes
from runtime.devices import Device, DeviceKind
from runtime.roles.placement import COLOCATED_GROUP, Role, plan_topology, release, reserve
from scheduler.policy import Node
from scheduler.policy.placement import PoolCapacity, gangs_of, place_demand

CPU = Device(DeviceKind.CPU)  # a CPU pool: one slot = one CPU, as the embedded pool counts them
SPEC: dict[str, Any] = {
    "hf_checkpoint": "/m",
    "ref_load": "/r",
    "prompt_data": "/d.jsonl",
    "rollout_batch_size": 8,
    "num_rollout": 3,
    "train_backend": "torch",
    "advantage_estimator": "ppo",
    "colocate": True,
    "resource": {"actor": [1, 1], "critic": [1, 1], "rollout": [1, 2], "advantages": [1, 0]},
}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """Two Ray nodes of 2 slots each (the head, with its dashboard, and one more), on this machine."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": True})
    c.add_node(num_cpus=2)
    ray.init(address=c.address, logging_level="WARNING")
    c.wait_for_nodes()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture
def cluster(ray_cluster: Any) -> dict[str, str]:
    """Node name -> Ray node id: w0 the head, w1 the other."""
    (worker,) = ray_cluster.worker_nodes
    return {"w0": ray_cluster.head_node.node_id, "w1": worker.node_id}


def _allocations(demand: dict, cap: PoolCapacity, ray_ids: dict[str, str]) -> list[dict[str, Any]]:
    """What the pass writes (scheduler/scheduling.py) and the platform hands the driver
    (`JobReports.driver_placement`): one row per assignment, with its node's Ray id."""
    placement = place_demand(cap, gangs_of(demand), frozenset())
    assert placement is not None
    return [
        {
            "role": a.role,
            "replica": a.replica,
            "node": a.node,
            "ray_node_id": ray_ids[a.node],
            "gpus": a.gpus,
            "shared": a.shared,
        }
        for a in placement.assignments
    ]


def test_each_gang_lands_where_the_pass_put_it_and_jobs_never_share_a_slot(cluster: dict[str, str]) -> None:
    from ray.util.placement_group import placement_group_table

    result = normalize(obj=SPEC)
    demand = result.demand.model_dump(mode="json")
    cap = PoolCapacity("p", [Node(name, "p", 2) for name in reversed(cluster)])  # the pass fills w1 first
    cap.index()
    by_id = {ray_id: name for name, ray_id in cluster.items()}
    reserved = []
    try:
        used: list[str] = []
        first = True
        for _job in range(2):
            allocations = _allocations(demand, cap, cluster)
            topology = plan_topology(
                SPEC["resource"],
                colocate=True,
                with_rollout=True,
                device=CPU,
                with_critic=True,
                demand=result.demand,
            )
            pgs = reserve(topology, nodes=gpu_nodes(allocations), timeout_s=30)
            reserved.append(pgs)
            table = placement_group_table(pgs[COLOCATED_GROUP])
            landed = [by_id[table["bundles_to_node_id"][i]] for i in range(topology.groups[COLOCATED_GROUP])]
            # bundle i is the host's GPU i (rollout: the actor's, then the critic's), on the pass's node for it
            host_nodes = [a["node"] for a in allocations if a["role"] == "rollout" for _ in range(a["gpus"])]
            assert landed == host_nodes
            actor, critic = topology.role_slots(Role.ACTOR)[0], topology.role_slots(Role.CRITIC)[0]
            assert landed[actor.bundle_index] == next(a["node"] for a in allocations if a["role"] == "actor")
            assert landed[critic.bundle_index] == next(
                a["node"] for a in allocations if a["role"] == "critic"
            )
            if (
                first
            ):  # without the pins Ray packs it on the head, w0 (checked): it went where the pass put it
                assert set(landed) == {"w1"}
                first = False
            used += sorted(set(landed))
        assert sorted(used) == sorted(cluster), "the two jobs share a node's slots"
        # the pass has no slot left; a bundle pinned to a full node is never granted (no sharing behind its back)
        with pytest.raises(RuntimeError, match="could not reserve"):
            reserve(topology, nodes={"rollout": [cluster["w0"], cluster["w0"]]}, timeout_s=2)
    finally:
        for pgs in reserved:
            release(pgs)


def test_the_pools_nodes_are_rays_and_a_lost_node_is_seen_dead(
    ray_cluster: Any, cluster: dict[str, str]
) -> None:
    """What `tasks.sync_pool_nodes` reads (`RayJobLauncher.nodes`, Ray's state API over the Jobs API client):
    each node's id, what it advertises, alive; a node Ray loses is listed dead within seconds."""
    import time

    from runtime.launcher import RayJobLauncher

    launcher = RayJobLauncher(f"http://{ray_cluster.head_node.address_info['webui_url']}")
    listed = {n.node_id: n for n in launcher.nodes()}
    assert set(listed) == set(cluster.values()) and all(n.alive for n in listed.values())
    assert all(n.resources["CPU"] == 2 and n.labels["ray.io/node-id"] == i for i, n in listed.items())
    (worker,) = ray_cluster.worker_nodes
    ray_cluster.remove_node(worker)
    deadline = time.monotonic() + 30
    while {n.node_id: n.alive for n in launcher.nodes()}.get(cluster["w1"], False):
        assert time.monotonic() < deadline, "Ray still lists the removed node alive after 30 s"
        time.sleep(0.5)
    assert {n.node_id: n.alive for n in launcher.nodes()}[cluster["w0"]]
