"""Best-fit, all-or-nothing gang placement over one pool's free GPUs, shared by every policy."""

from __future__ import annotations

from collections.abc import Iterable

from jobspec.demand import GpuGroup, role_layout
from scheduler.policy.types import Assignment, Gang, JobView, Node, Placement


class PoolCapacity:
    """Free GPUs per node of one pool, indexed by free count so best-fit costs O(GPUs per node).

    Mutable scratch state for one pass: the policy takes GPUs as it admits, gives them back when it
    plans preemptions, and hides nodes it holds back (reservations). Cordoned and dead nodes keep
    their allocations for reporting but never enter the index.
    """

    __slots__ = (
        "pool",
        "size",
        "free",
        "blocked",
        "hidden",
        "_nodes",
        "_labels",
        "_buckets",
        "_top",
        "_indexed",
        "_largest_schedulable",
        "_schedulable_gpus",
    )

    def __init__(self, pool: str, nodes: Iterable[Node]) -> None:
        nodes = tuple(nodes)
        self.pool = pool
        self._nodes = nodes
        self.size: dict[str, int] = {n.name: n.gpus for n in nodes}
        self.free: dict[str, int] = dict(self.size)
        # Cordoned or dead: never offered to a placement.
        self.blocked: set[str] = {n.name for n in nodes if not (n.schedulable and n.alive)}
        # Nodes taken out of the index for the rest of the pass (held for a job ahead).
        self.hidden: set[str] = set()
        self._labels: dict[str, frozenset[str]] | None = None
        self._top = max(self.size.values(), default=0)
        self._buckets: list[dict[str, None]] = []
        # Free GPUs on indexed nodes (schedulable, not hidden), kept up to date by every change.
        self._indexed = 0
        self._largest_schedulable = 0
        self._schedulable_gpus = 0

    @property
    def labels(self) -> dict[str, frozenset[str]]:
        if self._labels is None:
            self._labels = {n.name: n.labels for n in self._nodes}
        return self._labels

    def schedulable(self, node: str) -> bool:
        return node in self.size and node not in self.blocked

    # -- building -----------------------------------------------------------------------------
    def index(self) -> None:
        """Build the free-count buckets once held GPUs are subtracted from `free`."""
        top = self._top
        buckets: list[dict[str, None]] = [{} for _ in range(top + 1)]
        blocked = self.blocked
        total = 0
        for node, free in self.free.items():
            if free > 0 and node not in blocked:
                buckets[free][node] = None
                total += free
        self._buckets = buckets
        self._indexed = total
        sizes = [size for n, size in self.size.items() if n not in blocked]
        self._largest_schedulable = max(sizes, default=0)
        self._schedulable_gpus = sum(sizes)

    # -- queries ------------------------------------------------------------------------------
    def free_total(self) -> int:
        """Free GPUs a placement could use now (schedulable nodes, none held back)."""
        return self._indexed

    def largest_free(self) -> int:
        for f in range(self._top, 0, -1):
            if self._buckets[f]:
                return f
        return 0

    def best_fit(self, need: int, selector: frozenset[str] = frozenset()) -> str | None:
        """The indexed node with the fewest free GPUs that still has `need` (and the labels)."""
        buckets = self._buckets
        for f in range(max(need, 1), self._top + 1):
            bucket = buckets[f]
            if not bucket:
                continue
            if not selector:
                return next(iter(bucket))
            labels = self.labels
            for node in bucket:
                if selector <= labels[node]:
                    return node
        return None

    def eligible(self, node: str, selector: frozenset[str]) -> bool:
        """May a placement use this node at all (schedulable, not held back, right labels)?"""
        return (
            node not in self.blocked
            and node not in self.hidden
            and (not selector or selector <= self.labels[node])
        )

    def fits_somewhere(self, need: int, selector: frozenset[str]) -> bool:
        """Could any schedulable node of the pool host `need` GPUs if it were empty?"""
        if not selector:
            return need <= self._largest_schedulable
        return any(
            size >= need and n not in self.blocked and (not selector or selector <= self.labels[n])
            for n, size in self.size.items()
        )

    def largest_node(self) -> int:
        return self._top

    def schedulable_gpus(self) -> int:
        return self._schedulable_gpus

    # -- changes ------------------------------------------------------------------------------
    def take(self, node: str, gpus: int) -> None:
        self._move(node, self.free[node] - gpus)

    def give(self, node: str, gpus: int) -> None:
        self._move(node, self.free[node] + gpus)

    def hide(self, node: str) -> None:
        """Hold a node back: no later placement in this pass may use it."""
        if node in self.hidden:
            return
        self.hidden.add(node)
        free = self.free[node]
        if free > 0 and node not in self.blocked:
            del self._buckets[free][node]
            self._indexed -= free

    def unhide(self, node: str) -> None:
        """Offer a held node to placements again."""
        if node not in self.hidden:
            return
        self.hidden.discard(node)
        free = self.free[node]
        if free > 0 and node not in self.blocked:
            self._buckets[free][node] = None
            self._indexed += free

    def _move(self, node: str, new_free: int) -> None:
        old = self.free[node]
        self.free[node] = new_free
        if node in self.hidden or node in self.blocked:
            return
        if old > 0:
            del self._buckets[old][node]
        if new_free > 0:
            self._buckets[new_free][node] = None
        self._indexed += max(new_free, 0) - max(old, 0)

    # -- placement ----------------------------------------------------------------------------
    def place(self, job: JobView) -> Placement | None:
        """Place every gang of the job best-fit, or nothing at all (the GPUs taken stay taken)."""
        return place_demand(self, job.demand, job.node_selector)


def place_demand(cap: PoolCapacity, demand: tuple[Gang, ...], selector: frozenset[str]) -> Placement | None:
    """All-or-nothing: on failure every GPU taken so far is given back."""
    taken: list[tuple[str, int]] = []
    assignments: list[Assignment] = []
    # Big replicas first: they have the fewest candidate nodes.
    own = sorted((g for g in demand if g.colocate_with is None), key=lambda g: -g.gpus)
    for gang in own:
        for replica in range(gang.count):
            parts = _place_replica(cap, gang, selector)
            if parts is None:
                for node, gpus in taken:
                    cap.give(node, gpus)
                return None
            for node, gpus in parts:
                cap.take(node, gpus)
                taken.append((node, gpus))
                assignments.append(Assignment(gang.role, replica, node, gpus))
    for gang in demand:
        if gang.colocate_with is None:
            continue
        shared = _lay_on_host(gang, assignments)
        if shared is None:
            for node, gpus in taken:
                cap.give(node, gpus)
            return None
        assignments.extend(shared)
    return Placement(tuple(assignments))


def _place_replica(cap: PoolCapacity, gang: Gang, selector: frozenset[str]) -> list[tuple[str, int]] | None:
    need = gang.gpus
    node = cap.best_fit(need, selector)
    if node is not None:
        return [(node, need)]
    if gang.one_node:
        return None
    # A splittable replica: fewest nodes first (largest free blocks), which also keeps it compact.
    parts: list[tuple[str, int]] = []
    left = need
    candidates = sorted(
        ((free, n) for n, free in cap.free.items() if free > 0 and cap.eligible(n, selector)),
        reverse=True,
    )
    for free, n in candidates:
        use = min(free, left)
        parts.append((n, use))
        left -= use
        if left == 0:
            return parts
    return None


def _lay_on_host(gang: Gang, assignments: list[Assignment]) -> list[Assignment] | None:
    """Colocated replicas go onto the host role's GPUs, the host's GPU `colocate_at` on (the host's GPUs in
    its replicas' order), each replica on one node if one_node."""
    host_gpus = [
        a.node for a in assignments if a.role == gang.colocate_with and not a.shared for _ in range(a.gpus)
    ]
    out: list[Assignment] = []
    for replica in range(gang.count):
        start = gang.colocate_at + replica * gang.gpus
        nodes = host_gpus[start : start + gang.gpus]
        if len(nodes) < gang.gpus or (gang.one_node and len(set(nodes)) > 1):
            return None
        for node in dict.fromkeys(nodes):
            out.append(Assignment(gang.role, replica, node, nodes.count(node), shared=True))
    return out


def gangs_of(demand: dict) -> tuple[Gang, ...]:
    """The job spec's resource demand (`jobspec.demand.ResourceDemand` as JSON) as the policy's gangs, laid
    out as `jobspec.demand.role_layout` reads it (the driver reads it the same way)."""
    groups = [GpuGroup.model_validate({"one_node": True, **g}) for g in demand.get("groups", [])]
    layout = role_layout(groups)
    return tuple(
        Gang(
            role=g.role,
            gpus=g.gpus_per_replica,
            count=g.replicas,
            one_node=g.one_node,
            colocate_with=g.shares_with,
            colocate_at=layout[g.role].first if g.role in layout and g.shares_with else 0,
        )
        for g in groups
    )
