"""The GPU layout: Relax's legacy per-role GPU flags (turned into --resource before any rule reads it),
offloading on colocated GPUs, and the layout checks a spec passes before `jobspec.demand` turns it into a
ResourceDemand (the pool's node size, the --resource roles, model parallelism over the actor's GPUs,
rollout and GenRM engines, the managed OPD teacher)."""

from __future__ import annotations

from jobspec.demand import (
    KNOWN_ROLES,
    actor_gpus,
    critic_gpus,
    genrm_gpus,
    legacy_actor_note,
    managed_teacher,
    model_parallel_size,
    rollout_gpus,
)
from jobspec.demand import resource_roles as roles_of
from jobspec.rules.context import RuleContext, rule
from jobspec.spec import FIELDS

# =============================================================================================
# Relax's legacy per-role GPU flags (before every rule that reads --resource)

#: The flags Relax sizes roles with when --resource is absent (slime's layout flags).
LEGACY_LAYOUT_FLAGS = ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus")


@rule(
    "rule.legacy_layout_resource",
    "actor-num-nodes",
    "actor-num-gpus-per-node",
    "rollout-num-gpus",
    "resource",
    summary="Without --resource, Relax's legacy --actor-num-nodes x --actor-num-gpus-per-node (and "
    "--rollout-num-gpus, which --colocate overrides to the actor's GPUs) size the roles: the platform derives "
    "the equivalent --resource from them, so placement and the demand read one layout.",
)
def legacy_layout_resource(ctx: RuleContext) -> None:
    if ctx.resource is not None or not any(ctx.given(name) for name in LEGACY_LAYOUT_FLAGS):
        return
    nodes = int(ctx.actor_num_nodes if ctx.actor_num_nodes is not None else 1)
    total = actor_gpus(ctx.values)
    resource: dict[str, list[int]] = {"actor": [nodes, total]}
    if ctx.colocate:
        resource["rollout"] = [1, total]  # Relax: colocated engines span the actor's GPUs
    elif ctx.rollout_num_gpus is not None:
        resource["rollout"] = [1, int(ctx.rollout_num_gpus)]
    ctx.derive("resource", resource)


# =============================================================================================
# Offloading


@rule(
    "rule.offload_implies_both",
    "offload",
    "offload-train",
    "offload-rollout",
    summary="--offload means --offload-train and --offload-rollout (derived); it overrides an explicit "
    "--no-offload-* (warning), as Relax does.",
)
def offload_implies_both(ctx: RuleContext) -> None:
    if not ctx.offload or ctx.debug_rollout_only:
        return  # --debug-rollout-only turns both off after --offload (rule.debug_rollout_only_topology)
    for name in ("offload_train", "offload_rollout"):
        if ctx.values[name] is False:
            ctx.warn(
                f"--offload turns on --{FIELDS[name].flag}, overriding --no-{FIELDS[name].flag}",
                f"remove --offload or --no-{FIELDS[name].flag}",
                fields=("offload", FIELDS[name].flag),
            )
        if ctx.values[name] is not True:
            ctx.derive(name, True)


@rule(
    "rule.colocate_implies_offload",
    "colocate",
    "offload-train",
    "offload-rollout",
    summary="--colocate (not hybrid) turns on --offload-train and --offload-rollout unless set (derived).",
)
def colocate_implies_offload(ctx: RuleContext) -> None:
    if not ctx.colocate or ctx.hybrid:
        return
    for name in ("offload_train", "offload_rollout"):
        if ctx.values[name] is None:
            ctx.derive(name, True)
        elif ctx.values[name] is False:
            ctx.warn(
                f"--colocate with --no-{FIELDS[name].flag}: the reference says colocated roles always offload, "
                "so both models must fit in GPU memory at once",
                f"remove --no-{FIELDS[name].flag} unless the models really fit together",
                fields=("colocate", FIELDS[name].flag),
            )


@rule(
    "rule.ppo_offloads_train",
    "advantage-estimator",
    "offload-train",
    summary="PPO (with a critic) always offloads the training actor (derived).",
)
def ppo_offloads_train(ctx: RuleContext) -> None:
    if ctx.is_ppo and not ctx.is_sft and ctx.offload_train is not True:
        ctx.derive("offload_train", True)


@rule(
    "rule.offload_defaults",
    "offload-train",
    "offload-rollout",
    summary="--offload-train / --offload-rollout left unset resolve to false (derived).",
)
def offload_defaults(ctx: RuleContext) -> None:
    for name in ("offload_train", "offload_rollout"):
        if ctx.values[name] is None:
            ctx.derive(name, False)


# =============================================================================================
# Topology (GPU layout); `jobspec.demand` turns a layout that passes these into a ResourceDemand


@rule(
    "rule.pool_node_size",
    "num-gpus-per-node",
    "rollout-num-gpus-per-engine",
    "genrm-num-gpus-per-engine",
    summary="With the pool's node size known (max_gpus_per_node): an unset --num-gpus-per-node takes it "
    "(derived); an explicit larger one, or an engine that cannot sit on such nodes, is an error.",
    deviation="Relax knows no pools: it takes --num-gpus-per-node as given. The platform sizes the job for "
    "the nodes of the pool it will run in, and refuses a layout those nodes cannot hold.",
)
def pool_node_size(ctx: RuleContext) -> None:
    limit = ctx.max_gpus_per_node
    if limit is None:
        return
    if not ctx.given("num_gpus_per_node"):
        if ctx.num_gpus_per_node != limit:
            ctx.derive("num_gpus_per_node", limit)
    elif ctx.num_gpus_per_node > limit:
        ctx.error(
            f"--num-gpus-per-node {ctx.num_gpus_per_node} exceeds this pool's {limit} GPUs per node",
            f"set --num-gpus-per-node {limit} (and size --resource for it)",
            fields=("num-gpus-per-node",),
        )
    for name in ("rollout_num_gpus_per_engine", "genrm_num_gpus_per_engine"):
        size = ctx.values[name]
        if size > limit and size % limit and (name != "genrm_num_gpus_per_engine" or ctx.genrm_model_path):
            ctx.error(
                f"--{FIELDS[name].flag} {size} does not fit on this pool's nodes of {limit} GPUs",
                f"use an engine size <= {limit}",
                fields=(FIELDS[name].flag,),
            )


@rule(
    "rule.resource_roles",
    "resource",
    summary="--resource roles: known names (warning otherwise), at least one replica, GPUs divisible by replicas.",
)
def resource_roles(ctx: RuleContext) -> None:
    for role, (replicas, gpus) in roles_of(ctx.values).items():
        if role not in KNOWN_ROLES:
            ctx.warn(
                f"--resource role {role!r} is not one Relax knows ({', '.join(KNOWN_ROLES)})",
                "check the spelling of the role",
            )
        if replicas < 1:
            ctx.error(f"--resource {role!r} has {replicas} replicas", f"use [1, {gpus}]")
        elif gpus % replicas and role not in ("actor", "critic", "rollout", "genrm"):
            ctx.error(
                f"--resource {role!r}: {gpus} GPUs cannot be split evenly over {replicas} replicas",
                "make the GPU count a multiple of the replica count",
            )


@rule(
    "rule.resource_needs_actor_and_rollout",
    "resource",
    "colocate",
    "debug-train-only",
    "debug-rollout-only",
    summary="--resource needs an 'actor' entry (unless rollout-only) and, without --colocate, a 'rollout' entry "
    "or --rollout-num-gpus (unless train-only or external engines); without --resource Relax's legacy default "
    "applies: an actor of --actor-num-nodes 1 x --actor-num-gpus-per-node 8 = 8 GPUs (warning).",
)
def resource_needs_actor_and_rollout(ctx: RuleContext) -> None:
    roles = roles_of(ctx.values)
    if ctx.resource is None:
        note = legacy_actor_note(ctx.values) if not ctx.debug_rollout_only else None
        ctx.warn(
            f"--resource is not set: {note}" if note else "--resource is not set",
            'set --resource \'{"actor": [1, N], "rollout": [1, M]}\' to size the job',
        )
    elif "actor" not in roles and not ctx.debug_rollout_only:
        ctx.error(
            f"--resource has no 'actor' entry (roles: {', '.join(sorted(roles)) or 'none'})",
            'add "actor": [1, N]',
        )
    if rollout_gpus(ctx.values) is None:
        ctx.error(
            "the rollout engines have no GPUs: without --colocate, --resource needs a 'rollout' entry (or "
            "--rollout-num-gpus)",
            'add "rollout": [1, M] to --resource, or --colocate',
        )


@rule(
    "rule.actor_gpus_divisible_by_model_parallel",
    "resource",
    "tensor-model-parallel-size",
    "pipeline-model-parallel-size",
    "context-parallel-size",
    summary="The actor's (and critic's) GPUs must be a multiple of TP x PP x CP.",
)
def actor_gpus_divisible_by_model_parallel(ctx: RuleContext) -> None:
    if ctx.debug_rollout_only:
        return
    mp = model_parallel_size(ctx.values)
    for role, gpus in (("actor", actor_gpus(ctx.values)), ("critic", critic_gpus(ctx.values))):
        if role == "critic" and not gpus:
            continue
        if gpus < mp or gpus % mp:
            ctx.error(
                f"the {role} has {gpus} GPUs, not a multiple of TP x PP x CP = {ctx.tensor_model_parallel_size} x "
                f"{ctx.pipeline_model_parallel_size} x {ctx.context_parallel_size} = {mp}",
                f"give the {role} a multiple of {mp} GPUs in --resource, or change the parallel sizes",
            )


@rule(
    "rule.expert_parallel_fits_actor",
    "expert-model-parallel-size",
    "expert-tensor-parallel-size",
    "resource",
    summary="The actor's GPUs per pipeline stage must be divisible by EP x ETP (Megatron).",
)
def expert_parallel_fits_actor(ctx: RuleContext) -> None:
    if ctx.debug_rollout_only:
        return
    per_stage = actor_gpus(ctx.values) // ctx.pipeline_model_parallel_size
    group = ctx.expert_model_parallel_size * (
        ctx.expert_tensor_parallel_size or ctx.tensor_model_parallel_size
    )
    if group > 1 and per_stage % group:
        ctx.error(
            f"{per_stage} actor GPUs per pipeline stage are not divisible by EP x ETP = "
            f"{ctx.expert_model_parallel_size} x {ctx.expert_tensor_parallel_size} = {group}",
            "choose expert parallel sizes that divide the GPUs of a pipeline stage",
        )


@rule(
    "rule.actor_whole_nodes",
    "resource",
    "num-gpus-per-node",
    summary="An actor (or critic) larger than a node must use whole nodes (Relax derives nodes by integer division).",
    deviation="Relax derives --actor-num-nodes by integer division, so an actor of 12 GPUs on nodes of 8 "
    "would train on 8; the platform refuses GPUs the job would be given and not use.",
)
def actor_whole_nodes(ctx: RuleContext) -> None:
    node = ctx.num_gpus_per_node
    for role, gpus in (("actor", actor_gpus(ctx.values)), ("critic", critic_gpus(ctx.values))):
        if gpus > node and gpus % node:
            ctx.error(
                f"the {role} has {gpus} GPUs, more than one node of {node} but not a whole number of nodes",
                f"use a multiple of {node} GPUs for the {role}, or set --num-gpus-per-node",
            )


@rule(
    "rule.tensor_parallel_within_node",
    "tensor-model-parallel-size",
    "num-gpus-per-node",
    summary="A tensor-parallel group larger than a node spans nodes (slow; warning).",
)
def tensor_parallel_within_node(ctx: RuleContext) -> None:
    if ctx.tensor_model_parallel_size > ctx.num_gpus_per_node:
        ctx.warn(
            f"--tensor-model-parallel-size {ctx.tensor_model_parallel_size} exceeds a node of "
            f"{ctx.num_gpus_per_node} GPUs; tensor parallelism across nodes is slow",
            "keep TP within a node and use PP across nodes",
        )


@rule(
    "rule.rollout_engines_fit",
    "rollout-num-gpus-per-engine",
    "resource",
    "num-gpus-per-node",
    summary="Rollout GPUs must be a multiple of --rollout-num-gpus-per-engine, and an engine larger than a node "
    "must span whole nodes.",
    deviation="Relax starts rollout_num_gpus // rollout_num_gpus_per_engine engines and leaves the remainder "
    "idle; the platform refuses GPUs the job would be given and not use.",
)
def rollout_engines_fit(ctx: RuleContext) -> None:
    total = rollout_gpus(ctx.values)
    per, node = ctx.rollout_num_gpus_per_engine, ctx.num_gpus_per_node
    if total:
        if total % per:
            ctx.error(
                f"{total} rollout GPUs cannot be split into engines of --rollout-num-gpus-per-engine {per}",
                f"make the rollout GPU count a multiple of {per}",
            )
    if total and per > node and per % node:
        ctx.error(
            f"a rollout engine of {per} GPUs is larger than a node of {node} and not a whole number of nodes",
            f"use an engine size <= {node} or a multiple of {node}",
            fields=("rollout-num-gpus-per-engine", "num-gpus-per-node"),
        )


@rule(
    "rule.colocate_rollout_spans_actor",
    "colocate",
    "resource",
    summary="In colocate mode the rollout engines span the actor (and critic) GPUs; a different 'rollout' entry "
    "is overridden (warning).",
)
def colocate_rollout_spans_actor(ctx: RuleContext) -> None:
    roles = roles_of(ctx.values)
    if (
        not ctx.colocate
        or ctx.hybrid
        or ctx.genrm_model_path
        or managed_teacher(ctx.values)
        or "rollout" not in roles
    ):
        return
    expected = actor_gpus(ctx.values) + critic_gpus(ctx.values)
    if roles["rollout"][1] != expected:
        ctx.warn(
            f"--resource rollout has {roles['rollout'][1]} GPUs, but colocated rollout spans the "
            f"{expected} actor{'+critic' if critic_gpus(ctx.values) else ''} GPUs (Relax overrides it)",
            f'write "rollout": [1, {expected}]',
        )


@rule(
    "rule.genrm_layout",
    "genrm-num-gpus",
    "genrm-num-gpus-per-engine",
    "colocate",
    "resource",
    summary="GenRM GPUs divide into engines; colocated GenRM either splits the actor GPUs with rollout "
    "(rollout + genrm == actor) or shares them (rollout == genrm == actor).",
)
def genrm_layout(ctx: RuleContext) -> None:
    genrm = genrm_gpus(ctx.values)
    if not genrm:
        return
    if genrm % ctx.genrm_num_gpus_per_engine:
        ctx.error(
            f"{genrm} GenRM GPUs cannot be split into engines of --genrm-num-gpus-per-engine "
            f"{ctx.genrm_num_gpus_per_engine}",
            "make the GenRM GPU count a multiple of the engine size",
        )
    if ctx.colocate and not ctx.hybrid:
        actor = actor_gpus(ctx.values) + critic_gpus(ctx.values)
        rollout = rollout_gpus(ctx.values)
        if rollout is None:
            return  # reported by rule.resource_needs_actor_and_rollout
        if not (rollout + genrm == actor or rollout == genrm == actor):
            ctx.error(
                f"colocated GenRM needs rollout + genrm == actor ({rollout} + {genrm} != {actor}) or "
                f"rollout == genrm == actor ({actor})",
                f'e.g. "rollout": [1, {actor - genrm}] with --genrm-num-gpus {genrm}',
            )


@rule(
    "rule.opd_managed_teacher_colocate_layout",
    "resource",
    "colocate",
    "teacher-hf-checkpoint",
    "opd-teacher-routes",
    summary="A Relax-managed OPD teacher in colocate mode lives inside the actor's GPUs after the rollout engines: "
    "rollout GPUs + the 'teacher' entry's GPUs must equal the actor's (and critic's) GPUs.",
)
def opd_managed_teacher_colocate_layout(ctx: RuleContext) -> None:
    if not ctx.colocate or ctx.hybrid or not managed_teacher(ctx.values):
        return
    roles = roles_of(ctx.values)
    rollout = rollout_gpus(ctx.values)
    if rollout is None:
        return  # reported by rule.resource_needs_actor_and_rollout
    actor = actor_gpus(ctx.values) + critic_gpus(ctx.values)
    teacher = roles["teacher"][1]
    if rollout + teacher != actor:
        ctx.error(
            f"a managed OPD teacher in colocate mode splits the actor's GPUs with rollout: rollout + teacher must "
            f"be {actor}, got {rollout} + {teacher}",
            f'e.g. "rollout": [1, {max(actor - teacher, 0)}] with "teacher": [1, {teacher}]',
        )


@rule(
    "rule.global_batch_size_divisible_by_micro_batches",
    "global-batch-size",
    "micro-batch-size",
    "resource",
    summary="Static batching: --global-batch-size must be a multiple of micro_batch_size x data-parallel size.",
)
def global_batch_size_divisible_by_micro_batches(ctx: RuleContext) -> None:
    if ctx.use_dynamic_batch_size or ctx.global_batch_size is None or ctx.debug_rollout_only:
        return
    mp = model_parallel_size(ctx.values)
    gpus = actor_gpus(ctx.values)
    if gpus < mp or gpus % mp:
        return  # reported by rule.actor_gpus_divisible_by_model_parallel
    dp = gpus // mp
    unit = ctx.micro_batch_size * dp
    if ctx.global_batch_size % unit:
        ctx.error(
            f"--global-batch-size {ctx.global_batch_size} is not a multiple of micro_batch_size x data-parallel size "
            f"= {ctx.micro_batch_size} x {dp} = {unit}",
            f"use a global batch size that is a multiple of {unit}, or --use-dynamic-batch-size",
        )
