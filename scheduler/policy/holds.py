"""Nodes held back within a pass: for the blocked head job (so backfill cannot delay it), and the
GPUs that preemptions are freeing (for the job they are freed for)."""

from __future__ import annotations

from scheduler.policy.pass_state import PoolPass
from scheduler.policy.types import JobView


def can_be_overtaken(job: JobView) -> bool:
    """A lone 1-GPU job fits wherever a later job fits: holding nodes for it only wastes them."""
    return job.total_gpus > 1


def hold_for_head(p: PoolPass, job: JobView) -> list[str]:
    """Hold back, per replica (biggest first), the node closest to hosting it: the most free GPUs.

    Later jobs of the pass (backfill) cannot use held nodes, so they cannot delay the job. The
    hold is recomputed every pass from the snapshot alone; as nothing new lands on held nodes they
    only drain, and the same nodes stay the closest ones: the choice is stable across passes.
    """
    cap = p.cap
    selector = job.node_selector
    ranked = sorted((-free, n) for n, free in cap.free.items() if cap.eligible(n, selector))
    held: list[str] = []
    taken: set[str] = set()
    for gang in sorted((g for g in job.demand if g.colocate_with is None), key=lambda g: -g.gpus):
        for _ in range(gang.count):
            node = next(
                (n for _, n in ranked if n not in taken and (not gang.one_node or cap.size[n] >= gang.gpus)),
                None,
            )
            if node is None:
                break
            taken.add(node)
            held.append(node)
    for n in held:
        cap.hide(n)
    return held


def claim_incoming(p: PoolPass, job: JobView) -> bool:
    """Would the job fit once the jobs already PREEMPTING have stopped? Then those GPUs are its:
    the nodes are held for it, and no new victims are taken for it."""
    cap = p.cap
    incoming = {n: g for n, g in p.incoming.items() if g > 0 and n not in cap.hidden}
    if not incoming:
        return False
    for node, gpus in incoming.items():
        cap.give(node, gpus)
    placement = cap.place(job)
    if placement is not None:
        for node, gpus in placement.node_gpus:
            cap.give(node, gpus)
    for node, gpus in incoming.items():
        cap.take(node, gpus)
    if placement is None:
        return False
    for node, gpus in placement.node_gpus:
        if node in p.incoming:
            p.incoming[node] = max(0, p.incoming[node] - gpus)
        cap.hide(node)
    return True


def nodes_after(p: PoolPass, job: JobView, victims: list[JobView]) -> list[str]:
    """Nodes the job would take once the victims are gone (to hold for it for the rest of the pass)."""
    cap = p.cap
    for v in victims:
        assert v.placement is not None
        for node, gpus in v.placement.node_gpus:
            if node in cap.free:
                cap.give(node, gpus)
    placement = cap.place(job)
    nodes: list[str] = []
    if placement is not None:
        for node, gpus in placement.node_gpus:
            cap.give(node, gpus)
            nodes.append(node)
    for v in victims:
        assert v.placement is not None
        for node, gpus in v.placement.node_gpus:
            if node in cap.free:
                cap.take(node, gpus)
    return nodes
