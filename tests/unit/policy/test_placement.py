"""Best-fit, all-or-nothing gang placement."""

from __future__ import annotations

from scheduler.policy import Gang, Node, schedule
from scheduler.policy.invariants import whole_placement_errors
from scheduler.policy.placement import PoolCapacity, place_demand
from tests.unit.policy.snapshots import admitted, decide, nodes, queue, queued, running, snapshot


def capacity(free: dict[str, int], size: int = 8, **node_kw) -> PoolCapacity:
    cap = PoolCapacity("p", [Node(n, "p", size, **node_kw.get(n, {})) for n in free])
    for n, f in free.items():
        cap.free[n] = f
    cap.index()
    return cap


def test_best_fit_takes_the_fullest_node_that_fits():
    cap = capacity({"a": 8, "b": 3, "c": 2, "d": 5})
    placement = place_demand(cap, (Gang("w", 3),), frozenset())
    assert placement.node_gpus == (("b", 3),)
    assert cap.free == {"a": 8, "b": 0, "c": 2, "d": 5}


def test_small_jobs_leave_empty_nodes_empty():
    cap = capacity({"a": 8, "b": 8, "c": 1})
    assert place_demand(cap, (Gang("w", 1),), frozenset()).nodes == ("c",)
    assert place_demand(cap, (Gang("w", 1),), frozenset()).nodes in (("a",), ("b",))
    # The next one goes to the node now partly used, not to the other empty one.
    third = place_demand(cap, (Gang("w", 1),), frozenset())
    assert cap.free[third.nodes[0]] == 6


def test_all_or_nothing_gives_back_what_it_took():
    cap = capacity({"a": 8, "b": 6})
    before = dict(cap.free)
    assert place_demand(cap, (Gang("w", 8, count=2),), frozenset()) is None
    assert cap.free == before
    assert cap.free_total() == 14


def test_one_node_groups_are_never_split():
    cap = capacity({"a": 4, "b": 4})
    assert place_demand(cap, (Gang("w", 8),), frozenset()) is None
    split = place_demand(cap, (Gang("w", 8, one_node=False),), frozenset())
    assert sorted(split.node_gpus) == [("a", 4), ("b", 4)]


def test_a_job_bigger_than_a_node_takes_whole_nodes():
    cap = capacity({"a": 8, "b": 7, "c": 8, "d": 8})
    placement = place_demand(cap, (Gang("actor", 8, count=3),), frozenset())
    assert sorted(placement.nodes) == ["a", "c", "d"]
    assert all(g == 8 for _, g in placement.node_gpus)


def test_biggest_groups_are_placed_first():
    cap = capacity({"a": 8, "b": 4})
    # Placed smallest-first, the 4-GPU group would take "b"... and then the 8 could not fit;
    # biggest-first puts 8 on "a" and 4 on "b".
    placement = place_demand(cap, (Gang("small", 4), Gang("big", 8)), frozenset())
    assert dict(placement.node_gpus) == {"a": 8, "b": 4}


def test_colocated_roles_share_their_hosts_gpus():
    cap = capacity({"a": 8, "b": 8, "c": 8})
    demand = (Gang("actor", 8, count=2), Gang("rollout", 2, count=8, colocate_with="actor"))
    placement = place_demand(cap, demand, frozenset())
    # 16 GPUs held, not 32: rollout engines ride on the actor's GPUs.
    assert sum(g for _, g in placement.node_gpus) == 16
    shared = [a for a in placement.assignments if a.role == "rollout"]
    assert len(shared) == 8 and all(a.shared for a in shared)
    assert {a.node for a in shared} == {a.node for a in placement.assignments if a.role == "actor"}
    job = queued("j", "q", demand=demand)
    assert whole_placement_errors(job, placement) == []


def test_a_colocated_group_must_fit_inside_one_host_group():
    cap = capacity({"a": 8, "b": 8})
    # Two actor groups of 4 on different nodes cannot host one rollout engine of 8 GPUs.
    demand = (Gang("actor", 4, count=2), Gang("rollout", 8, colocate_with="actor"))
    cap.free["a"], cap.free["b"] = 4, 4
    cap.index()
    assert place_demand(cap, demand, frozenset()) is None
    assert cap.free == {"a": 4, "b": 4}


def test_labels_cordons_and_dead_nodes():
    cap = PoolCapacity(
        "p",
        [
            Node("plain", "p", 8),
            Node("h200", "p", 8, labels=frozenset({"gpu=h200"})),
            Node("cordoned", "p", 8, labels=frozenset({"gpu=h200"}), schedulable=False),
            Node("dead", "p", 8, labels=frozenset({"gpu=h200"}), alive=False),
        ],
    )
    cap.index()
    assert cap.free_total() == 16
    placement = place_demand(cap, (Gang("w", 8),), frozenset({"gpu=h200"}))
    assert placement.nodes == ("h200",)
    assert place_demand(cap, (Gang("w", 8),), frozenset({"gpu=h200"})) is None


def test_the_policy_places_every_group_whole():
    snap = snapshot(
        0,
        nodes(4),
        [queue("q", 32)],
        [
            running("r", "q", {"n0": 5}),
            queued("big", "q", 8, 2, submit=1),
            queued("mid", "q", 3, submit=2),
        ],
    )
    decision = decide(schedule, snap)
    placed = admitted(decision)
    assert sorted(dict(placed["big"].node_gpus).values()) == [8, 8]
    assert placed["mid"].node_gpus == (("n0", 3),)
