"""Plain frozen data the scheduling policy reads (Snapshot) and returns (Decision)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

from wire.jobs import HOLDING_SLOTS, STOPPING, JobStatus

# A job as the policy sees it, by its status (`JobView.state`): QUEUED waits for admission (also after a
# preemption, until readmitted); a job that holds its slots either runs on its placement (ADMITTED, STARTING,
# RUNNING: `JobView.running`, it may be preempted or resized) or is being stopped (`STOPPING`: it keeps its GPUs
# until its process has stopped).
_RUNS = HOLDING_SLOTS - STOPPING
#: `JobStatus.QUEUED` (read through its class, a member costs ~10x a global's lookup: the policy compares every
#: job's status with it, by identity, several times a pass).
QUEUED = JobStatus.QUEUED


@dataclass(frozen=True, slots=True)
class Node:
    """One machine of a pool; the policy counts GPUs, Ray binds the device indices."""

    name: str
    pool: str
    gpus: int
    labels: frozenset[str] = frozenset()
    # False when cordoned (or down): nothing new is placed here; running jobs stay.
    schedulable: bool = True
    # False when the node is down: its running jobs are requeued by the policy.
    alive: bool = True


@dataclass(frozen=True, slots=True)
class Queue:
    """A team's queue in one pool, with its guaranteed (nominal) GPUs and borrowing rules."""

    name: str
    pool: str
    team: str
    nominal_gpus: int
    # Most GPUs this queue may use above nominal (from other queues' idle quota); None: no limit.
    borrowing_limit: int | None = None
    # Most of this queue's idle nominal GPUs that others may borrow; None: all of them.
    lending_limit: int | None = None
    # Fair-share weight: a queue's share is usage / (weight * nominal).
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    preemptible: bool = True


@dataclass(frozen=True, slots=True)
class Gang:
    """`count` replicas of `gpus` GPUs each, for one role of a job.

    `one_node`: each replica must sit on a single node (a tensor-parallel group, a rollout engine).
    A job bigger than one node is written as replicas of a whole node each (32 GPUs on 8-GPU nodes:
    `Gang("actor", gpus=8, count=4)`); with `one_node=False` a replica may be split over nodes.
    `colocate_with`: the role whose GPUs this role shares (Relax `--colocate`); such a gang
    consumes no GPUs of its own, its replicas are laid onto the host role's placement, from the host's
    GPU `colocate_at` on (in the host's replica order; `jobspec.demand.role_layout`: colocated PPO's
    critic starts after the actor's GPUs).
    `min_count` / `max_count`: an elastic gang (the rollout engines of a job with `--autoscaler-config`):
    `count` is how many replicas it holds now, `base_count` how many its spec asks (what admission
    places; None: `count`). The policy grows it up to `max_count` into idle GPUs, and takes replicas back
    down to `min_count` instead of preempting a job: those above `base_count` from any job that needs
    them, the others only from a job that could preempt this one (`scheduler.policy.elastic`).
    `wish`: the replicas the job's driver asks for now (its autoscaler YAML's thresholds on the rollout's share of
    the step, `runtime.rollout.elastic.Autoscaler.ask`), `wish_reason` why ("rollout 0.12 of the step <
    scale_in 0.2"); None before it has asked. The policy grows the gang only up to `wanted` (the wish, or
    `base_count` before any) and gives back the replicas it holds above it.
    """

    role: str
    gpus: int
    count: int = 1
    one_node: bool = True
    colocate_with: str | None = None
    colocate_at: int = 0
    min_count: int | None = None
    max_count: int | None = None
    base_count: int | None = None
    wish: int | None = None
    wish_reason: str = field(default="", compare=False)
    # Demands are dict keys in every pass (identical demands share one placement attempt): hash once.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.min_count is not None or self.max_count is not None:
            low = self.count if self.min_count is None else self.min_count
            high = self.count if self.max_count is None else self.max_count
            base = self.base
            if self.colocate_with is not None or not (
                1 <= low <= min(self.count, base) and high >= max(self.count, base)
            ):
                raise ValueError(
                    f"elastic gang {self.role}: needs 1 <= min_count ({low}) <= count ({self.count}) and "
                    f"base_count ({base}) <= max_count ({high}), on GPUs of its own"
                )
        if self.wish is not None and (not self.elastic or self.wish < 1):
            raise ValueError(
                f"gang {self.role}: a wish ({self.wish}) needs an elastic gang and at least 1 replica"
            )
        object.__setattr__(
            self,
            "_hash",
            hash((self.role, self.gpus, self.count, self.one_node, self.colocate_with, self.colocate_at)),
        )

    @property
    def elastic(self) -> bool:
        return self.min_count is not None or self.max_count is not None

    @property
    def floor(self) -> int:
        """The fewest replicas it runs with (`count` for a rigid gang)."""
        return self.count if self.min_count is None else self.min_count

    @property
    def base(self) -> int:
        """The replicas its spec asks for (admission's size)."""
        return self.count if self.base_count is None else self.base_count

    @property
    def ceiling(self) -> int:
        """The most replicas it may grow to (`count` for a rigid gang)."""
        return self.count if self.max_count is None else self.max_count

    @property
    def wanted(self) -> int:
        """The replicas the job wants now: its driver's `wish` within `floor` .. `ceiling`, or `base` before it has
        asked (the pass grows it no further, and gives back what it holds above)."""
        if self.wish is None:
            return self.base
        return min(max(self.wish, self.floor), self.ceiling)

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True, slots=True)
class Assignment:
    """GPUs of one node given to one replica of a role (a split replica has several)."""

    role: str
    replica: int
    node: str
    gpus: int
    # True for a colocated role riding on its host role's GPUs: not counted against the node twice.
    shared: bool = False


@dataclass(frozen=True, slots=True)
class Placement:
    assignments: tuple[Assignment, ...]
    # GPUs held per node (shared assignments excluded), derived once so usage sums stay cheap.
    node_gpus: tuple[tuple[str, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        per_node: dict[str, int] = {}
        for a in self.assignments:
            if not a.shared:
                per_node[a.node] = per_node.get(a.node, 0) + a.gpus
        object.__setattr__(self, "node_gpus", tuple(per_node.items()))

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.node_gpus)


def demand_gpus(demand: tuple[Gang, ...]) -> int:
    """GPUs a demand holds: colocated gangs ride on their host and add none."""
    return sum(g.gpus * g.count for g in demand if g.colocate_with is None)


@dataclass(frozen=True, slots=True)
class JobView:
    """What the policy knows about one job. It never knows how long the job will run."""

    id: str
    queue: str
    submit_time: float
    demand: tuple[Gang, ...]
    priority: int = 0
    # The job's rank beyond its queue's nominal quota, when its class counts only within it (None: `priority`
    # everywhere). An eval job (docs/adr/0011-eval-priority-class.md) has the eval class's `priority` against
    # its own queue's jobs and while it stays within nominal quota; where it would borrow, in the pool's order
    # and against other queues' jobs, it ranks at this (its team's highest training class).
    borrow_priority: int | None = None
    preemptible: bool = True
    state: JobStatus = JobStatus.QUEUED
    placement: Placement | None = None
    # Start of the current run (running / preempting jobs).
    started_at: float | None = None
    # Latest registered checkpoint of the job (any run); None when it has none.
    last_checkpoint_at: float | None = None
    # When the job last entered the queue: submit time, or the end of its last preemption.
    queued_at: float | None = None
    # How many times the job has been preempted (or requeued by a node failure).
    preemptions: int = 0
    # Labels a node must carry to host the job.
    node_selector: frozenset[str] = frozenset()
    # GPU-seconds the job ran in its earlier runs (its current run counts from `started_at`):
    # the attained service that ranks it against newer jobs (least attained service first).
    service_gpu_s: float = 0.0
    # Nodes that preemptions are freeing for this queued job (`Decision.nominate` of the last
    # pass): no other job may start there before it, even one ahead of it in the queue.
    nominated_nodes: frozenset[str] = frozenset()
    # GPUs per node of engines the pass took back from this (elastic) job that its driver may still run: held, as
    # a stopping job's are, until the driver reports it has stopped them (`scheduler.policy.elastic`). Not in
    # `placement` nor `total_gpus` (the job no longer has them), never given to another job until released.
    releasing: tuple[tuple[str, int], ...] = ()
    total_gpus: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_gpus", demand_gpus(self.demand))

    @property
    def running(self) -> bool:
        """Holds its placement and is not being stopped: the policy may preempt or resize it."""
        return self.state in _RUNS

    @property
    def waiting_since(self) -> float:
        return self.submit_time if self.queued_at is None else self.queued_at


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    jobs: tuple[JobView, ...]
    priority_classes: tuple[PriorityClass, ...] = ()


class WaitInfo(NamedTuple):
    """Why a queued job waits, kept as numbers; `reason` renders them for people.

    A named tuple rather than a dataclass: a pass builds one per queued job, and this is the
    cheapest immutable record Python has. Rendering is lazy for the same reason.
    """

    # 1-based place in its pool's admission order this pass.
    position: int
    # Stable machine-readable cause, one of WAIT_CODES.
    code: str
    demand: tuple[Gang, ...]
    queue: str
    pool: str
    queue_used: int
    queue_nominal: int
    # Free GPUs in the pool that this job could use (not held back for jobs ahead).
    pool_free: int
    # Extra detail for the cause (which job holds the reservation, which limit was hit...).
    note: str = ""

    @property
    def ahead(self) -> int:
        return self.position - 1

    @property
    def reason(self) -> str:
        """E.g. 'needs 2 groups of 8 GPUs; queue math is at 16/16 of its quota in pool h200; 3 jobs ahead'."""
        parts = [f"needs {describe_demand(self.demand)}"]
        if self.code == "unknown_queue":
            parts.append(f"queue {self.queue} does not exist")
        else:
            parts.append(
                f"queue {self.queue} is at {self.queue_used}/{self.queue_nominal} of its quota in pool {self.pool}"
            )
            if self.code in ("capacity", "behind_head"):
                parts.append(f"{self.pool_free} GPU{'' if self.pool_free == 1 else 's'} free for it")
        if self.note:
            parts.append(self.note)
        ahead = self.position - 1
        if self.code != "unknown_queue":
            parts.append(f"{ahead} job{'' if ahead == 1 else 's'} ahead")
        return "; ".join(parts)


@functools.lru_cache(maxsize=4096)
def describe_demand(demand: tuple[Gang, ...]) -> str:
    """'2 groups of 8 GPUs', '1 GPU', '1 group of 4 GPUs + 2 groups of 2 GPUs (rollout shares actor)'.
    Memoized: every waiting job's reason names its demand, and jobs submitted alike share one demand tuple
    (`scheduler.scheduling._gangs_of_text`)."""
    own = [g for g in demand if g.colocate_with is None]
    if len(own) == 1 and own[0].count == 1 and own[0].gpus == 1:
        text = "1 GPU"
    else:
        text = " + ".join(
            f"{g.count} group{'' if g.count == 1 else 's'} of {g.gpus} GPU{'' if g.gpus == 1 else 's'}"
            for g in own
        )
    shared = [g for g in demand if g.colocate_with is not None]
    if shared:
        text += " (" + ", ".join(f"{g.role} shares {g.colocate_with}" for g in shared) + ")"
    return text


WAIT_CODES = (
    "capacity",  # not enough free GPUs of the right shape for it (some may be held for jobs ahead)
    "behind_head",  # strict FIFO only: a job ahead does not fit and nothing may pass it
    "quota",  # its queue is at its borrowing limit, or no idle quota is left to borrow
    "preempting",  # GPUs are being freed for it by preemptions already under way
    "no_fit",  # no node of the pool (matching its selector) could ever host it
    "unknown_queue",  # its queue is not in the snapshot
)


@dataclass(frozen=True, slots=True)
class QueueUsage:
    queue: str
    pool: str
    used_gpus: int
    nominal_gpus: int
    # GPUs used above nominal (taken from other queues' idle quota).
    borrowed_gpus: int
    queued_jobs: int
    queued_gpus: int


@dataclass
class Decision:
    """What one pass decided; the caller applies it in one transaction."""

    admit: list[tuple[str, Placement]] = field(default_factory=list)
    # (job id, reason) for jobs to checkpoint and stop (PREEMPTING, then QUEUED).
    preempt: list[tuple[str, str]] = field(default_factory=list)
    # Queued job -> nodes being freed for it. The caller stores them as the job's
    # `nominated_nodes` for the next pass (and clears them for every other queued job): a pass
    # re-issues each nomination it keeps, so a nomination lives only while it is still needed.
    nominate: dict[str, tuple[str, ...]] = field(default_factory=dict)
    waiting: dict[str, WaitInfo] = field(default_factory=dict)
    queues: dict[str, QueueUsage] = field(default_factory=dict)
    # pool -> node -> GPUs allocated once this decision's admissions are applied.
    pools: dict[str, dict[str, int]] = field(default_factory=dict)
    # Running elastic jobs to resize (`scheduler.policy.elastic`), applied before the admissions (a shrink
    # frees the GPUs an admission of the same pass may use): the job's new demand and placement, and why.
    resize: list[Resize] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Resize:
    """One elastic gang of a running job resized: from `before` to `after` replicas (its engines scaled in
    or out); `demand` and `placement` are the job's whole new ones. The GPUs it gives back stay held
    (`JobView.releasing`) until its driver has stopped those engines: no job is placed on them in this pass."""

    job_id: str
    role: str
    before: int
    after: int
    demand: tuple[Gang, ...]
    placement: Placement
    reason: str

    @property
    def gpus(self) -> int:
        """GPUs the job gains (> 0) or gives back (< 0)."""
        gang = next(g for g in self.demand if g.role == self.role)
        return (self.after - self.before) * gang.gpus
