"""Safety checks of a Decision against its Snapshot; an empty list means the pass was safe."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from scheduler.policy.types import QUEUED, Decision, JobView, Placement, Snapshot

T = TypeVar("T")


def _known(
    decided: Iterable[tuple[str, T]], jobs: dict[str, JobView], verb: str, out: list[str]
) -> Iterator[tuple[str, JobView, T]]:
    """(job id, its job, what the decision says of it) for each job `decided` names that the snapshot has;
    one it lacks is a violation ("<verb> <id> is not in the snapshot"), noted in `out` in its turn."""
    for job_id, said in decided:
        job = jobs.get(job_id)
        if job is None:
            out.append(f"{verb} {job_id} is not in the snapshot")
            continue
        yield job_id, job, said


def check(snapshot: Snapshot, decision: Decision) -> list[str]:
    """Violations of the scheduler's safety rules, as sentences (empty when there are none).

    - no GPU is allocated twice: per node, GPUs held (running and preempting jobs, which keep
      theirs until they stop, and engines taken back from elastic jobs until their drivers have stopped
      them, `JobView.releasing`, the GPUs a resize takes back included) plus GPUs admitted never exceed
      the node's GPUs;
    - nothing is placed on an unknown, cordoned or dead node, or off the job's pool or labels;
    - every admitted job is placed whole: each replica of each gang, on one node when it must be,
      colocated roles on their host's GPUs;
    - quotas hold for queues that admitted: nominal plus borrowing limit, and the pool's borrowing
      within what its queues lend (a queue filling its own nominal quota may take GPUs others
      borrowed: the guarantee comes first, and they become the ones to reclaim from);
    - only running, preemptible jobs are preempted (any job on a dead node may be requeued);
    - nodes are nominated only for waiting jobs, within their pool;
    - every queued job not admitted is told why it waits, with a distinct position in its pool.
    """
    out: list[str] = []
    jobs = {j.id: j for j in snapshot.jobs}
    nodes = {n.name: n for n in snapshot.nodes}
    queues = {q.name: q for q in snapshot.queues}

    held: dict[str, int] = {}
    used: dict[str, int] = {}
    for j in snapshot.jobs:
        for node, gpus in j.releasing:
            held[node] = held.get(node, 0) + gpus
        if j.state is not QUEUED and j.placement is not None:
            for node, gpus in j.placement.node_gpus:
                held[node] = held.get(node, 0) + gpus
            used[j.queue] = used.get(j.queue, 0) + j.total_gpus

    resized: set[str] = set()
    for job_id, job, r in _known(((r.job_id, r) for r in decision.resize), jobs, "resized", out):
        if job_id in resized:
            out.append(f"{job_id} resized twice")
        resized.add(job_id)
        gang = next((g for g in job.demand if g.role == r.role), None)
        if not job.running or job.placement is None:
            out.append(f"resized {job_id} is {job.state}, not running")
            continue
        if gang is None or not gang.elastic or not gang.floor <= r.after <= gang.ceiling:
            out.append(f"{job_id}: {r.role} resized to {r.after}, outside its elastic range")
        after = JobView(job.id, job.queue, job.submit_time, r.demand, state=job.state, placement=r.placement)
        out.extend(whole_placement_errors(after, r.placement))
        # what it takes back stays held (until the driver has stopped those engines); what it grants is added
        had = dict(job.placement.node_gpus)
        pool = queues[job.queue].pool if job.queue in queues else None
        for node, gpus in r.placement.node_gpus:
            held[node] = held.get(node, 0) + max(0, gpus - had.get(node, 0))
            if node not in nodes or nodes[node].pool != pool:
                out.append(f"{job_id} resized onto {node}, outside its pool {pool}")
        used[job.queue] = used.get(job.queue, 0) - job.total_gpus + after.total_gpus

    used_before = dict(used)
    admitted: set[str] = set()
    for job_id, job, placement in _known(decision.admit, jobs, "admitted", out):
        if job_id in admitted:
            out.append(f"{job_id} admitted twice")
        admitted.add(job_id)
        if job.state is not QUEUED:
            out.append(f"admitted {job_id} is {job.state}, not queued")
        queue = queues.get(job.queue)
        pool = queue.pool if queue else None
        for a in placement.assignments:
            node = nodes.get(a.node)
            if node is None:
                out.append(f"{job_id} placed on unknown node {a.node}")
                continue
            if not node.alive or not node.schedulable:
                out.append(f"{job_id} placed on {'dead' if not node.alive else 'cordoned'} node {a.node}")
            if node.pool != pool:
                out.append(f"{job_id} of pool {pool} placed on {a.node} of pool {node.pool}")
            if not job.node_selector <= node.labels:
                out.append(
                    f"{job_id} placed on {a.node} lacking labels {sorted(job.node_selector - node.labels)}"
                )
        out.extend(whole_placement_errors(job, placement))
        for node, gpus in placement.node_gpus:
            held[node] = held.get(node, 0) + gpus
        used[job.queue] = used.get(job.queue, 0) + job.total_gpus

    for name, gpus in held.items():
        node = nodes.get(name)
        if node is not None and gpus > node.gpus:
            out.append(f"node {name} has {gpus} GPUs allocated of {node.gpus}")

    admitting_queues = {jobs[j].queue for j in admitted | resized if j in jobs}
    # A queue may always fill its own nominal quota, even out of GPUs others had borrowed (they
    # are then the ones to reclaim from): for what may be lent, count such a queue as it was.
    lend_view = dict(used)
    for qname in admitting_queues:
        q = queues.get(qname)
        if q is not None and used.get(qname, 0) <= q.nominal_gpus:
            lend_view[qname] = used_before.get(qname, 0)
    for qname in sorted(admitting_queues):
        q = queues.get(qname)
        if q is None:
            out.append(f"jobs admitted to unknown queue {qname}")
            continue
        u = used.get(qname, 0)
        if q.borrowing_limit is not None and u > q.nominal_gpus + q.borrowing_limit:
            out.append(
                f"queue {qname} uses {u} GPUs, above nominal {q.nominal_gpus} + borrowing limit {q.borrowing_limit}"
            )
        if u > q.nominal_gpus:
            borrowed, lendable = _pool_borrowing(snapshot, q.pool, used, lend_view)
            if borrowed > lendable:
                out.append(f"pool {q.pool} borrows {borrowed} GPUs but its queues lend only {lendable}")

    for job_id, job, _reason in _known(decision.preempt, jobs, "preempted", out):
        if job_id in admitted:
            out.append(f"{job_id} both admitted and preempted")
        if not job.running:
            out.append(f"preempted {job_id} is {job.state}, not running")
        on_dead = job.placement is not None and any(
            n not in nodes or not nodes[n].alive for n in job.placement.nodes
        )
        if not job.preemptible and not on_dead:
            out.append(f"non-preemptible {job_id} preempted")

    for job_id, held in decision.nominate.items():
        job = jobs.get(job_id)
        if job is None or job.state is not QUEUED or job_id in admitted:
            out.append(f"nodes nominated for {job_id}, which is not a waiting job")
            continue
        pool = queues[job.queue].pool if job.queue in queues else None
        for n in held:
            if n not in nodes or nodes[n].pool != pool:
                out.append(f"node {n} nominated for {job_id} is not in its pool {pool}")

    positions: dict[tuple[str, int], str] = {}
    for j in snapshot.jobs:
        if j.state is not QUEUED or j.id in admitted:
            if j.id in decision.waiting and j.id in admitted:
                out.append(f"{j.id} admitted and also reported waiting")
            continue
        info = decision.waiting.get(j.id)
        if info is None:
            out.append(f"queued {j.id} neither admitted nor told why it waits")
            continue
        if info.code != "unknown_queue":
            key = (info.pool, info.position)
            if key in positions:
                out.append(f"{j.id} and {positions[key]} share position {info.position} in pool {info.pool}")
            positions[key] = j.id
    return out


def whole_placement_errors(job: JobView, placement: Placement) -> list[str]:
    """Is every replica of every gang placed, whole and on one node when it must be?"""
    out: list[str] = []
    parts: dict[tuple[str, int], list[tuple[str, int, bool]]] = {}
    for a in placement.assignments:
        parts.setdefault((a.role, a.replica), []).append((a.node, a.gpus, a.shared))
    expected: set[tuple[str, int]] = set()
    host_room: dict[str, dict[str, int]] = {}
    for a in placement.assignments:
        if not a.shared:
            room = host_room.setdefault(a.role, {})
            room[a.node] = room.get(a.node, 0) + a.gpus
    for gang in job.demand:
        for r in range(gang.count):
            expected.add((gang.role, r))
            got = parts.get((gang.role, r))
            if not got:
                out.append(f"{job.id}: {gang.role}[{r}] is not placed")
                continue
            if sum(g for _, g, _ in got) != gang.gpus:
                out.append(
                    f"{job.id}: {gang.role}[{r}] has {sum(g for _, g, _ in got)} GPUs, needs {gang.gpus}"
                )
            if gang.one_node and len({n for n, _, _ in got}) > 1:
                out.append(f"{job.id}: {gang.role}[{r}] split over nodes but must sit on one")
            shared = gang.colocate_with is not None
            if any(s != shared for _, _, s in got):
                out.append(
                    f"{job.id}: {gang.role}[{r}] {'must' if shared else 'must not'} share its host's GPUs"
                )
    for gang in job.demand:
        if gang.colocate_with is None:
            continue
        room = host_room.get(gang.colocate_with, {})
        on_node: dict[str, int] = {}
        for (role, _r), got in parts.items():
            if role == gang.role:
                for n, g, _ in got:
                    on_node[n] = on_node.get(n, 0) + g
        for n, g in on_node.items():
            if g > room.get(n, 0):
                out.append(
                    f"{job.id}: {gang.role} uses {g} GPUs of {gang.colocate_with} on {n}, which has {room.get(n, 0)}"
                )
    extra = set(parts) - expected
    if extra:
        out.append(f"{job.id}: assignments for replicas it does not have: {sorted(extra)}")
    return out


def _pool_borrowing(
    snapshot: Snapshot, pool: str, used: dict[str, int], lend_view: dict[str, int]
) -> tuple[int, int]:
    queues = [q for q in snapshot.queues if q.pool == pool]
    capacity = sum(n.gpus for n in snapshot.nodes if n.pool == pool)
    owned = sum(q.nominal_gpus for q in queues)
    borrowed = sum(max(0, used.get(q.name, 0) - q.nominal_gpus) for q in queues)
    lendable = max(0, capacity - owned)
    for q in queues:
        idle = max(0, q.nominal_gpus - lend_view.get(q.name, 0))
        lendable += idle if q.lending_limit is None else min(idle, q.lending_limit)
    return borrowed, lendable
