"""Plain builders of policy snapshots for the policy tests (nodes, queues, queued and running jobs)."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.policy import Assignment, Decision, Gang, JobView, Node, Placement, Queue, Snapshot
from scheduler.policy.invariants import check
from wire.jobs import JobStatus

POOL = "p"


def nodes(count: int, gpus: int = 8, *, pool: str = POOL, prefix: str = "n", **kw) -> list[Node]:
    return [Node(f"{prefix}{i}", pool, gpus, **kw) for i in range(count)]


def queue(name: str, nominal: int, *, pool: str = POOL, **kw) -> Queue:
    return Queue(name, pool, f"team-{name}", nominal, **kw)


def queued(job_id: str, q: str, gpus: int = 1, count: int = 1, *, submit: float = 0.0, **kw) -> JobView:
    """A queued job of `count` replicas of `gpus` GPUs, each on one node."""
    demand = kw.pop("demand", None) or (Gang("worker", gpus, count),)
    return JobView(job_id, q, submit, demand, **kw)


def running(
    job_id: str,
    q: str,
    on: dict[str, int],
    *,
    started_at: float = 0.0,
    submit: float | None = None,
    last_checkpoint_at: float | None = None,
    **kw,
) -> JobView:
    """A running job holding `on` = {node: GPUs}, one replica per node."""
    sizes = set(on.values())
    if len(sizes) == 1:
        demand = (Gang("worker", sizes.pop(), len(on)),)
        assignments = tuple(Assignment("worker", r, node, g) for r, (node, g) in enumerate(on.items()))
    else:
        demand = tuple(Gang(f"worker{r}", g) for r, g in enumerate(on.values()))
        assignments = tuple(Assignment(f"worker{r}", 0, node, g) for r, (node, g) in enumerate(on.items()))
    return JobView(
        job_id,
        q,
        started_at if submit is None else submit,
        demand,
        state=kw.pop("state", JobStatus.RUNNING),
        placement=Placement(assignments),
        started_at=started_at,
        last_checkpoint_at=last_checkpoint_at,
        **kw,
    )


def snapshot(
    now: float, node_list: Iterable[Node], queues: Iterable[Queue], jobs: Iterable[JobView]
) -> Snapshot:
    return Snapshot(now, tuple(node_list), tuple(queues), tuple(jobs))


def decide(policy, snap: Snapshot, **kw) -> Decision:
    """Run a policy and fail on any safety violation: every test pass is checked."""
    decision = policy(snap, **kw)
    violations = check(snap, decision)
    assert not violations, violations
    return decision


def admitted(decision: Decision) -> dict[str, Placement]:
    return dict(decision.admit)


def preempted(decision: Decision) -> list[str]:
    return [job_id for job_id, _ in decision.preempt]
