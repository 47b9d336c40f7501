"""`--use-health-check` when a node is lost: on a real Ray cluster of three nodes on this machine (the head
with the trainer's one slot, two workers of two slots), the node holding both rollout engines is removed
mid-run; Ray moves the engines' placement-group bundles to the other worker, the health check replaces both
engines there with the current weights, and the run finishes every step."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import driver
from tests.ray.conftest import read_metrics, read_reports
from tests.ray.test_rollout_health import health_spec, steps_done

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    # Ray marks a node whose raylet stopped answering dead after `health_check_failure_threshold` checks
    # `health_check_period_ms` apart (default 5 x 3 s): 3 x 1 s here, so the lost node's placement-group bundles
    # move ~10 s sooner (a check still waits up to its 10 s timeout for a busy raylet before it counts as failed)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
        },
    )
    cluster.add_node(num_cpus=2)
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, logging_level="WARNING")
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def rollout_nodes() -> set[str]:
    """The nodes the job's rollout placement group (the one of two bundles) holds now."""
    import ray

    nodes: set[str] = set()
    for table in ray.util.placement_group_table().values():
        if table.get("state") == "CREATED" and len(table.get("bundles") or {}) == 2:
            nodes |= {str(n) for n in (table.get("bundles_to_node_id") or {}).values()}
    return nodes


def test_the_node_of_the_engines_is_lost_and_they_come_back_on_another(
    three_nodes: Any, artifacts: dict[str, Path], tmp_path: Path
) -> None:
    lost: list[str] = []
    quit_ = threading.Event()

    def remove_engines_node() -> None:
        while steps_done(tmp_path) < 2:
            if quit_.wait(0.1):
                return
        (node_id,) = rollout_nodes()
        (node,) = [n for n in three_nodes.worker_nodes if n.node_id == node_id]
        three_nodes.remove_node(node, allow_graceful=False)
        lost.append(node_id)

    thread = threading.Thread(target=remove_engines_node, daemon=True)
    thread.start()
    spec = health_spec(artifacts, tmp_path, **{"num-rollout": 12})
    spec_file = tmp_path / "node.json"
    spec_file.write_text(json.dumps({"name": "health-node", "spec": spec}))
    try:
        assert driver.main(["--spec-file", str(spec_file)]) == 0
    finally:
        quit_.set()
        thread.join(timeout=30)
    assert len(lost) == 1
    metrics = read_metrics(tmp_path / "report")
    assert metrics["rollout/engine_replacements"][11] == 2
    assert metrics["rollout/healthy_engines"][11] == 2
    assert (
        max(metrics["rollout/logprob_abs_diff"].values()) < 1e-3
    )  # the new engines took the current weights
    for step in range(12):
        rows = (tmp_path / "ckpt" / "rollout_result" / "train" / f"{step}.jsonl").read_text().splitlines()
        assert len(rows) == 128
    logs = [item["message"] for r in read_reports(tmp_path / "report") for item in r.get("logs", [])]
    replaced = [m for m in logs if m.startswith("rollout engine") and "replaced in" in m]
    assert len(replaced) == 2 and all("placement-group bundle" in m for m in replaced), replaced
    assert lost[0] not in rollout_nodes()
