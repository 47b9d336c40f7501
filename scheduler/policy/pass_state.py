"""Per-pass scratch state shared by every policy: held GPUs per node, queue usage, queued jobs."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.policy.placement import PoolCapacity
from scheduler.policy.quota import PoolQuota
from scheduler.policy.types import (
    QUEUED,
    Decision,
    JobView,
    Node,
    Placement,
    Queue,
    QueueUsage,
    Snapshot,
    WaitInfo,
)


@dataclass
class PoolPass:
    """One pool during one pass. Mutated as the policy admits, plans preemptions and reserves."""

    name: str
    cap: PoolCapacity
    quota: PoolQuota
    # Running jobs that could be preempted (not those already stopping or on dead nodes).
    running: dict[str, JobView] = field(default_factory=dict)
    queued: list[JobView] = field(default_factory=list)
    # GPUs per node that jobs already PREEMPTING will free and no queued job has claimed yet.
    incoming: dict[str, int] = field(default_factory=dict)
    # Queued job -> nodes nominated for it by an earlier pass (held from the start of this one).
    nominated: dict[str, list[str]] = field(default_factory=dict)
    _by_queue: dict[str, list[JobView]] | None = None
    _facts: list[tuple[JobView, int, float]] | None = None
    _forgotten: bool = False

    def victim_facts(self, build) -> list[tuple[JobView, int, float]]:
        """(job, service tier, loss) of every running job that could ever be a victim, worked
        out by `build(running jobs)` once per pass, and only when some job considers preempting."""
        if self._facts is None:
            self._facts = build(self.running.values())
        elif self._forgotten:
            # Victims taken earlier in the pass are no longer candidates.
            running = self.running
            self._facts = [f for f in self._facts if f[0].id in running]
            self._forgotten = False
        return self._facts

    def running_in(self, queue: str) -> list[JobView]:
        """Running (preemptible-candidate) jobs of one queue, grouped on first use."""
        if self._by_queue is None:
            by: dict[str, list[JobView]] = {}
            for j in self.running.values():
                by.setdefault(j.queue, []).append(j)
            self._by_queue = by
        return [j for j in self._by_queue.get(queue, ()) if j.id in self.running]

    def forget_running(self, job_id: str) -> None:
        """A job chosen as a victim this pass: no longer a candidate for anything else."""
        del self.running[job_id]
        self._forgotten = True

    def reset_running_views(self) -> None:
        """Running jobs were resized (`policy.elastic`): what was worked out from their old views goes."""
        self._facts = None
        self._by_queue = None
        self._forgotten = False

    def admit(self, job: JobView, placement: Placement, decision: Decision) -> None:
        decision.admit.append((job.id, placement))
        self.quota.add(job.queue, job.total_gpus)

    def wait(self, job: JobView, position: int, code: str, note: str = "") -> WaitInfo:
        return WaitInfo(
            position,
            code,
            job.demand,
            job.queue,
            self.name,
            self.quota.used[job.queue],
            self.quota.queues[job.queue].nominal_gpus,
            self.cap.free_total(),
            note,
        )

    def never_fits(self, job: JobView) -> bool:
        """No amount of waiting helps: a group is bigger than any eligible node, or the job than the pool."""
        cap = self.cap
        return (
            any(
                g.colocate_with is None and g.one_node and not cap.fits_somewhere(g.gpus, job.node_selector)
                for g in job.demand
            )
            or job.total_gpus > cap.schedulable_gpus()
        )


def prepare(snapshot: Snapshot, decision: Decision) -> dict[str, PoolPass]:
    """Count every held GPU per node and per queue; requeue jobs on dead or vanished nodes.

    This visits every running job each pass, so it is a few tight loops over plain dicts;
    everything else a pass does scales with the queue, not with the cluster.
    """
    nodes_by_pool: dict[str, list[Node]] = {}
    for n in snapshot.nodes:
        nodes_by_pool.setdefault(n.pool, []).append(n)
    queues_by_pool: dict[str, list[Queue]] = {}
    for q in snapshot.queues:
        queues_by_pool.setdefault(q.pool, []).append(q)
    names = list(nodes_by_pool) + [q for q in queues_by_pool if q not in nodes_by_pool]
    pool_of_queue = {q.name: q.pool for q in snapshot.queues}
    queued: dict[str | None, list[JobView]] = {name: [] for name in names}
    holding: dict[str | None, list[JobView]] = {name: [] for name in names}
    queued[None] = []
    holding[None] = []
    if len(names) == 1 and all(q.pool == names[0] for q in snapshot.queues):
        # One pool (the common case): two list comprehensions instead of a dict lookup per job.
        jobs = snapshot.jobs
        known = pool_of_queue.keys()
        queued[names[0]] = [j for j in jobs if j.state is QUEUED and j.queue in known]
        holding[names[0]] = [j for j in jobs if j.state is not QUEUED and j.queue in known]
        queued[None] = [j for j in jobs if j.state is QUEUED and j.queue not in known]
    else:
        for job in snapshot.jobs:
            (queued if job.state is QUEUED else holding)[pool_of_queue.get(job.queue)].append(job)
    for job in queued.pop(None):
        decision.waiting[job.id] = WaitInfo(0, "unknown_queue", job.demand, job.queue, "?", 0, 0, 0)
    # Jobs holding GPUs for a queue the snapshot lacks: nothing to count them against.
    holding.pop(None)

    pools: dict[str, PoolPass] = {}
    for name in names:
        nodes = nodes_by_pool.get(name, [])
        cap = PoolCapacity(name, nodes)
        dead = {n.name for n in nodes if not n.alive}
        used, running, incoming = _count_held(holding[name], cap.free, dead, name, decision)
        cap.index()
        quota = PoolQuota(queues_by_pool.get(name, ()), sum(cap.size.values()), used)
        nominated = _nominations(queued[name], cap)
        pools[name] = PoolPass(name, cap, quota, running, queued[name], incoming, nominated)
    return pools


def _nominations(queued: list[JobView], cap) -> dict[str, list[str]]:
    """Hold every node nominated for a queued job; a node claimed twice goes to the earlier job."""
    out: dict[str, list[str]] = {}
    for job in sorted((j for j in queued if j.nominated_nodes), key=lambda j: (j.submit_time, j.id)):
        nodes = [n for n in sorted(job.nominated_nodes) if cap.schedulable(n) and n not in cap.hidden]
        if nodes:
            out[job.id] = nodes
            for n in nodes:
                cap.hide(n)
    return out


def _count_held(
    jobs: list[JobView], free: dict[str, int], dead: set[str], pool: str, decision: Decision
) -> tuple[dict[str, int], dict[str, JobView], dict[str, int]]:
    """Subtract held GPUs from `free`; GPUs used per queue, running jobs, GPUs being freed.

    The hot loop of every pass (it visits each running job): plain dict operations only.
    """
    used: dict[str, int] = {}
    running: dict[str, JobView] = {}
    incoming: dict[str, int] = {}
    for j in jobs:
        releasing = j.releasing
        if releasing:  # engines taken back, still stopping: held, then freed for a job waiting for them
            for node, gpus in releasing:
                if node in free:
                    free[node] -= gpus
                    incoming[node] = incoming.get(node, 0) + gpus
        placement = j.placement
        if placement is None:
            continue
        node_gpus = placement.node_gpus
        lost = None
        for node, gpus in node_gpus:
            if node in free:
                free[node] -= gpus
                if node in dead:
                    lost = node
            else:
                lost = node
        q = j.queue
        used[q] = used.get(q, 0) + j.total_gpus
        if j.running:
            if lost is None:
                running[j.id] = j
            else:
                # Its processes there are gone: requeue it; it resumes from its latest checkpoint.
                decision.preempt.append((j.id, f"node {lost} is down or left pool {pool}"))
        else:
            for node, gpus in node_gpus:
                incoming[node] = incoming.get(node, 0) + gpus
    return used, running, incoming


def report(snapshot: Snapshot, pools: dict[str, PoolPass], decision: Decision) -> None:
    """Fill the decision's queue usage and per-node allocation, as they stand after admissions."""
    admitted = {job_id for job_id, _ in decision.admit}
    waiting: dict[str, list[int]] = {}
    for p in pools.values():
        for job in p.queued:
            if job.id in admitted:
                continue
            c = waiting.get(job.queue)
            if c is None:
                waiting[job.queue] = [1, job.total_gpus]
            else:
                c[0] += 1
                c[1] += job.total_gpus
    for q in snapshot.queues:
        used = pools[q.pool].quota.used[q.name]
        c = waiting.get(q.name, (0, 0))
        decision.queues[q.name] = QueueUsage(
            q.name, q.pool, used, q.nominal_gpus, max(0, used - q.nominal_gpus), c[0], c[1]
        )
    for p in pools.values():
        free = p.cap.free
        decision.pools[p.name] = {n: size - free[n] for n, size in p.cap.size.items()}
