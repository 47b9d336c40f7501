"""Resource demand: the GPU groups a job needs, derived from --resource, --colocate and parallel sizes.

The layout helpers here are pure functions over field values; `jobspec.rules` uses them to check
that a topology is feasible, and `compute_demand` turns a spec that passed those checks into the
`ResourceDemand` the scheduler places.

How Relax reads ``--resource '{"role": [replicas, gpus]}'``: the second number is the role's total
GPU count (Relax's ``_derive_cluster_args_from_resource`` reads it as ``*_total_gpus``); 0 means a
CPU-only role (``"advantages": [1, 0]``). Without ``--resource`` Relax falls back to its legacy
per-role flags: an actor of ``--actor-num-nodes`` (1) x ``--actor-num-gpus-per-node`` (8) GPUs, rollout
engines on ``--rollout-num-gpus`` GPUs, a critic of ``--critic-num-nodes`` x ``--critic-num-gpus-per-node``
(the actor's layout when unset).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jobspec.bounds import MAX_DEMAND_GPUS

__all__ = [
    "GpuGroup",
    "ResourceDemand",
    "RoleBundles",
    "compute_demand",
    "elastic_rollout",
    "role_layout",
    "PLACEMENT_KEY",
    "gpu_nodes",
    "KNOWN_ROLES",
    "LEGACY_ACTOR_GPUS",
    "actor_gpus",
    "legacy_actor_note",
    "critic_gpus",
    "rollout_gpus",
    "genrm_gpus",
    "model_parallel_size",
    "resource_roles",
]

#: Roles Relax's launcher knows in --resource.
KNOWN_ROLES = (
    "actor",
    "rollout",
    "reference",
    "actor_fwd",
    "advantages",
    "critic",
    "genrm",
    "teacher",
    "sft",
)
#: Relax's legacy --actor-num-nodes 1 x --actor-num-gpus-per-node 8, used when --resource is absent.
LEGACY_ACTOR_GPUS = 8
_LEGACY_ACTOR_NODES, _LEGACY_ACTOR_GPUS_PER_NODE = 1, 8


class GpuGroup(BaseModel):
    """GPUs one role needs: `replicas` x `gpus_per_replica`.

    one_node: each replica's GPUs must sit on one node (an inference engine, or an actor
    model-parallel group that fits in a node). shares_with: the role whose GPUs this one reuses
    (colocated roles add no GPUs to the total).
    """

    model_config = ConfigDict(frozen=True)

    role: str
    replicas: int = Field(ge=0)
    gpus_per_replica: int = Field(ge=0)
    one_node: bool
    shares_with: str | None = None
    min_replicas: int | None = Field(
        None,
        ge=1,
        description="elastic (the rollout engines of a job with --autoscaler-config): the fewest replicas the "
        "scheduler may take it down to; null: a fixed count",
    )
    max_replicas: int | None = Field(
        None, ge=1, description="elastic: the most replicas the scheduler may grow it to; null: a fixed count"
    )

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def elastic(self) -> bool:
        return self.min_replicas is not None


class ResourceDemand(BaseModel):
    """What the scheduler must place for one job."""

    model_config = ConfigDict(frozen=True)

    groups: list[GpuGroup]
    total_gpus: int = Field(description="GPUs the job occupies (shared groups add none)")
    num_gpus_per_node: int
    colocated: bool
    nodes_needed: int = Field(description="minimum number of nodes of num_gpus_per_node GPUs")
    cpu_roles: list[str] = Field(default_factory=list, description="roles that need no GPU")
    summary: str = ""
    legacy_layout: bool = Field(
        default=False,
        description="no --resource: the actor's GPUs come from Relax's legacy --actor-num-nodes x "
        "--actor-num-gpus-per-node (8 GPUs unless set)",
    )


# ---------------------------------------------------------------------------------------------
# Layout helpers (pure, over a dict of field values)


def resource_roles(v: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """role -> (replicas, total gpus) from --resource (empty when it is not given)."""
    res = v.get("resource") or {}
    return {role: (int(pair[0]), int(pair[1])) for role, pair in res.items()}


def model_parallel_size(v: dict[str, Any]) -> int:
    """GPUs of one actor model replica: TP x PP x CP."""
    return (
        int(v["tensor_model_parallel_size"])
        * int(v["pipeline_model_parallel_size"])
        * int(v["context_parallel_size"])
    )


def _legacy_actor(v: dict[str, Any]) -> tuple[int, int]:
    """(--actor-num-nodes, --actor-num-gpus-per-node): Relax's legacy actor layout, 1 x 8 unless set."""
    nodes = v.get("actor_num_nodes")
    per_node = v.get("actor_num_gpus_per_node")
    return (
        int(nodes) if nodes is not None else _LEGACY_ACTOR_NODES,
        int(per_node) if per_node is not None else _LEGACY_ACTOR_GPUS_PER_NODE,
    )


def actor_gpus(v: dict[str, Any]) -> int:
    """The actor's GPUs: its --resource entry, else Relax's legacy --actor-num-nodes x --actor-num-gpus-per-node."""
    roles = resource_roles(v)
    if "actor" in roles:
        return roles["actor"][1]
    nodes, per_node = _legacy_actor(v)
    return nodes * per_node


def legacy_actor_note(v: dict[str, Any]) -> str | None:
    """What the demand says when the actor's GPUs come from Relax's legacy flags (None: --resource has one)."""
    if "actor" in resource_roles(v):
        return None
    nodes, per_node = _legacy_actor(v)
    default = (nodes, per_node) == (_LEGACY_ACTOR_NODES, _LEGACY_ACTOR_GPUS_PER_NODE)
    which = "Relax's legacy default" if default else "Relax's legacy per-role flags"
    return (
        f"--resource has no actor entry, so {which} applies: the actor gets --actor-num-nodes {nodes} x "
        f"--actor-num-gpus-per-node {per_node} = {nodes * per_node} GPUs"
    )


def critic_gpus(v: dict[str, Any]) -> int:
    """Critic GPUs: PPO only. Its --resource entry, else --critic-num-nodes x --critic-num-gpus-per-node, each
    defaulting to the actor's (as Relax defaults them)."""
    if v.get("advantage_estimator") != "ppo":
        return 0
    roles = resource_roles(v)
    if "critic" in roles:
        return roles["critic"][1]
    nodes, per_node = v.get("critic_num_nodes"), v.get("critic_num_gpus_per_node")
    if nodes is None and per_node is None:
        return actor_gpus(v)
    if "actor" in roles:  # Relax derives the actor's per-node flags from its --resource entry
        total = actor_gpus(v)
        actor_per_node = min(int(v.get("num_gpus_per_node") or 8), total)
        actor_nodes = max(1, total // actor_per_node) if actor_per_node else 0
    else:
        actor_nodes, actor_per_node = _legacy_actor(v)
    return int(actor_nodes if nodes is None else nodes) * int(
        actor_per_node if per_node is None else per_node
    )


def genrm_gpus(v: dict[str, Any]) -> int:
    if not v.get("genrm_model_path"):
        return 0
    roles = resource_roles(v)
    return roles["genrm"][1] if "genrm" in roles else int(v["genrm_num_gpus"])


def managed_teacher(v: dict[str, Any]) -> bool:
    """A Relax-managed OPD teacher: --teacher-hf-checkpoint or --opd-teacher-routes with a 'teacher' role."""
    return "teacher" in resource_roles(v) and bool(
        v.get("teacher_hf_checkpoint") or v.get("opd_teacher_routes")
    )


def rollout_gpus(v: dict[str, Any]) -> int | None:
    """GPUs of the rollout engines, as Relax resolves them (None: not determinable)."""
    if v.get("debug_train_only") or v.get("rollout_external"):
        return 0
    if v.get("loss_type") == "sft" and v.get("sft_predict_interval") is None:
        return 0  # SFT brings up rollout engines only for generative prediction
    roles = resource_roles(v)
    if v.get("colocate") and not v.get("hybrid") and not v.get("genrm_model_path") and not managed_teacher(v):
        # Relax overrides rollout_num_gpus to span the actor (and critic) GPUs in colocate mode.
        return actor_gpus(v) + critic_gpus(v)
    if "rollout" in roles:
        return roles["rollout"][1]
    if v.get("rollout_num_gpus") is not None:
        return int(v["rollout_num_gpus"])  # Relax's legacy flag, used without a 'rollout' entry
    return None


# ---------------------------------------------------------------------------------------------
# Demand


# Beyond MAX_DEMAND_GPUS a layout is not computed (packing enumerates replicas).


def _pack_nodes(groups: list[GpuGroup], node: int) -> int:
    """Minimum nodes (first-fit decreasing) holding every non-shared replica."""
    full_nodes = 0
    items: list[int] = []
    for g in groups:
        if g.shares_with is not None or g.gpus_per_replica == 0:
            continue
        for _ in range(g.replicas):
            if g.one_node:
                items.append(g.gpus_per_replica)
            else:
                full_nodes += g.gpus_per_replica // node
                if g.gpus_per_replica % node:
                    items.append(g.gpus_per_replica % node)
    bins: list[int] = []
    for size in sorted(items, reverse=True):
        for i, free in enumerate(bins):
            if free >= size:
                bins[i] = free - size
                break
        else:
            bins.append(node - size)
    return full_nodes + len(bins)


def _group(role: str, total: int, per_replica: int, node: int, shares: str | None) -> GpuGroup:
    per_replica = max(per_replica, 1)
    return GpuGroup(
        role=role,
        replicas=total // per_replica,
        gpus_per_replica=per_replica,
        one_node=per_replica <= node,
        shares_with=shares,
    )


def compute_demand(spec: Any) -> ResourceDemand:
    """The GPU groups of a normalized spec (the feasibility rules have already passed)."""
    v = spec.model_dump() if hasattr(spec, "model_dump") else dict(spec)
    node = int(v["num_gpus_per_node"])
    colocate, hybrid = bool(v["colocate"]), bool(v["hybrid"])
    roles = resource_roles(v)
    mp = model_parallel_size(v)
    groups: list[GpuGroup] = []
    cpu_roles: list[str] = []

    if not v["debug_rollout_only"]:
        groups.append(_group("actor", actor_gpus(v), mp, node, None))
    if critic_gpus(v):
        groups.append(_group("critic", critic_gpus(v), mp, node, None))

    rollout = rollout_gpus(v) or 0
    if rollout:
        shares = "actor" if colocate and not hybrid and not v["debug_rollout_only"] else None
        groups.append(_group("rollout", rollout, int(v["rollout_num_gpus_per_engine"]), node, shares))
    genrm = genrm_gpus(v)
    if genrm:
        shares = "actor" if colocate and not hybrid else None
        groups.append(_group("genrm", genrm, int(v["genrm_num_gpus_per_engine"]), node, shares))

    handled = {"actor", "critic", "rollout", "genrm"}
    for role, (replicas, gpus) in roles.items():
        if role in handled:
            continue
        if gpus == 0:
            cpu_roles.append(role)
            continue
        # In colocate and hybrid modes the reference / actor_fwd / teacher models swap into the
        # actor's GPUs; in fully-async mode they are separate GPU groups.
        shares = "actor" if colocate and role in ("reference", "actor_fwd", "teacher") else None
        groups.append(_group(role, gpus, gpus // max(replicas, 1), node, shares))

    # Models Relax swaps into the actor's own GPUs when they have no --resource entry: the reference
    # model of a KL term (synchronous and hybrid modes) and a megatron OPD teacher.
    if not v["debug_rollout_only"] and (colocate or not v["fully_async"]):
        actor = next(g for g in groups if g.role == "actor")
        kl = v["use_kl_loss"] or v["kl_coef"] != 0
        opd_teacher = v["use_opd"] and v["opd_type"] == "megatron"
        for role, wanted in (("reference", kl), ("teacher", opd_teacher)):
            if wanted and role not in roles:
                groups.append(actor.model_copy(update={"role": role, "shares_with": "actor"}))

    # Colocated PPO: the rollout engines span the actor's and the critic's GPUs, so the rollout
    # group is the one that holds GPUs, in model-parallel-sized pieces (each actor or critic replica
    # fills one), and every colocated role rides on it.
    rollout_group = next((g for g in groups if g.role == "rollout" and g.shares_with == "actor"), None)
    actor_group = next((g for g in groups if g.role == "actor"), None)
    if rollout_group is not None and actor_group is not None and rollout_group.gpus > actor_group.gpus:
        colocated = {"actor", "critic"} | {g.role for g in groups if g.shares_with == "actor"}
        host = _group("rollout", rollout_group.gpus, mp, node, None)
        groups = [
            host
            if g is rollout_group
            else g.model_copy(update={"shares_with": "rollout"})
            if g.role in colocated
            else g
            for g in groups
        ]

    total = sum(g.gpus for g in groups if g.shares_with is None)
    if total > MAX_DEMAND_GPUS:  # only reachable for a spec with errors (SpecError.understood)
        raise ValueError(f"a demand of {total} GPUs is beyond any cluster")
    nodes = _pack_nodes(groups, node)
    parts = []
    for g in groups:
        where = f", shares {g.shares_with}'s GPUs" if g.shares_with else ""
        span = "" if g.one_node else " (spans nodes)"
        parts.append(f"{g.role} {g.replicas}x{g.gpus_per_replica} GPU{span}{where}")
    if cpu_roles:
        parts.append("CPU-only: " + ", ".join(cpu_roles))
    mode = "colocated" if colocate and not hybrid else "hybrid" if hybrid else "decoupled"
    summary = f"{total} GPU(s) on at least {nodes} node(s) of {node} GPUs, {mode}: " + "; ".join(parts)
    legacy = None if v["debug_rollout_only"] else legacy_actor_note(v)
    if legacy:
        summary = f"{legacy}. {summary}"
    return ResourceDemand(
        groups=groups,
        total_gpus=total,
        num_gpus_per_node=node,
        colocated=colocate,
        nodes_needed=nodes,
        cpu_roles=cpu_roles,
        summary=summary,
        legacy_layout=legacy is not None,
    )


def elastic_rollout(demand: ResourceDemand, min_engines: int, max_engines: int) -> ResourceDemand:
    """The demand with its rollout engines elastic (`--autoscaler-config`'s `min_engines` .. `max_engines`,
    `jobspec.autoscaler`): the scheduler admits the replicas `resource` asks for, may take engines back down to
    `min_engines` instead of preempting a job, and grow them up to `max_engines` into idle GPUs. Raises
    ValueError (naming the fields) when the job has no rollout engines of their own or asks for a count
    outside the bounds."""
    rollout = next((g for g in demand.groups if g.role == "rollout"), None)
    if rollout is None or rollout.shares_with is not None or not rollout.gpus:
        raise ValueError(
            "autoscaler-config: the job has no rollout engines on GPUs of their own to scale"
            + (
                f" (its rollout shares {rollout.shares_with}'s GPUs)"
                if rollout and rollout.shares_with
                else ""
            )
        )
    if not min_engines <= rollout.replicas <= max_engines:
        raise ValueError(
            f"autoscaler-config: resource asks for {rollout.replicas} rollout engine(s), outside the autoscaler's "
            f"min_engines {min_engines} .. max_engines {max_engines}; ask for a count within them"
        )
    elastic = rollout.model_copy(update={"min_replicas": min_engines, "max_replicas": max_engines})
    groups = [elastic if g is rollout else g for g in demand.groups]
    summary = demand.summary.replace(
        f"rollout {rollout.replicas}x{rollout.gpus_per_replica} GPU",
        f"rollout {rollout.replicas}x{rollout.gpus_per_replica} GPU (elastic {min_engines}..{max_engines})",
        1,
    )
    return demand.model_copy(update={"groups": groups, "summary": summary})


# ---------------------------------------------------------------------------------------------
# Layout: where each role's replicas sit, read once for the scheduler and the driver alike

#: Colocated roles that train on GPUs of their own within their host's (Relax's colocated PPO: the rollout
#: engines span the actor's GPUs, then the critic's). Every other colocated role (reference, actor_fwd,
#: teacher, genrm, or rollout engines riding on the actor) lies on the host's GPUs from the first one.
_OWN_GPUS_IN_HOST = ("actor", "critic")


class RoleBundles(BaseModel):
    """Where one GPU role's replicas sit: GPUs `first` .. `first + gpus - 1` of `host`'s GPUs (in replica
    order, `gpus_per_replica` each). `host` is the role itself unless it is colocated: then the role whose
    GPUs it shares. The scheduler places each host's GPUs on nodes; the driver reserves one placement-group
    bundle per host GPU and puts each role's replicas on its range of them."""

    model_config = ConfigDict(frozen=True)

    role: str
    host: str
    first: int = Field(ge=0)
    replicas: int = Field(ge=0)
    gpus_per_replica: int = Field(ge=0)

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def shared(self) -> bool:
        return self.host != self.role

    @property
    def bundles(self) -> range:
        """Indices of its GPUs among its host's."""
        return range(self.first, self.first + self.gpus)


def role_layout(demand: ResourceDemand | Iterable[GpuGroup]) -> dict[str, RoleBundles]:
    """The one reading of a job's layout: every GPU role of the demand with its host and its range of the
    host's GPUs. Colocated PPO (host `rollout`): the actor takes the first GPUs, the critic the next ones,
    the engines span both. (A range that runs past its host's GPUs cannot be placed: the scheduler finds no
    placement for it, and the driver refuses it.)"""
    groups = demand.groups if isinstance(demand, ResourceDemand) else list(demand)
    cursor: dict[str, int] = {}
    out: dict[str, RoleBundles] = {}
    for g in groups:
        if not g.gpus:
            continue
        host = g.shares_with or g.role
        first = 0
        if g.shares_with is not None and g.role in _OWN_GPUS_IN_HOST and host not in _OWN_GPUS_IN_HOST:
            first = cursor.get(host, 0)
            cursor[host] = first + g.gpus
        out[g.role] = RoleBundles(
            role=g.role, host=host, first=first, replicas=g.replicas, gpus_per_replica=g.gpus_per_replica
        )
    return out


#: Key of the driver's spec under which the platform hands the driver its job's allocations (what the scheduling
#: pass wrote: role, replica, node, its Ray node id, GPUs, shared), in the order the pass placed them.
PLACEMENT_KEY = "platform_placement"


def gpu_nodes(allocations: Iterable[Mapping[str, Any]]) -> dict[str, list[str | None]]:
    """role -> the Ray node id of each of its own GPUs, in the order `role_layout` counts a host's GPUs (replica
    by replica, a split replica's parts in the pass's order); None where the node has no Ray id. Shared
    allocations hold no GPUs of their own: a colocated role's GPUs are its host's (`RoleBundles.bundles`)."""
    out: dict[str, list[str | None]] = {}
    ordered = sorted(
        enumerate(allocations),
        key=lambda item: (str(item[1]["role"]), int(item[1].get("replica", 0)), item[0]),
    )
    for _, a in ordered:
        if a.get("shared"):
            continue
        out.setdefault(str(a["role"]), []).extend([a.get("ray_node_id") or None] * int(a["gpus"]))
    return out
