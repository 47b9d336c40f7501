"""Which Relax parameters each training backend (+ the built-in rollout) honours; anything else set is refused
by name.

A parameter is honoured by a backend when the code that runs the job reads it (`RuntimeSpec`'s fields are read
by the pipeline whatever the backend; the megatron backend reads Megatron's arguments from the spec's values);
a restricted one is honoured for some values only. Everything else set away from its default is refused at
submission (`spec.unsupported_by_backend`) and again by the driver."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from runtime.rollout.sglang import passthrough as sglang_passthrough
from runtime.spec import RuntimeSpec
from runtime.trackers import WANDB_PARAMETERS, wandb_installed

# The `resource` roles the torch backend runs (runtime.roles.placement.Role; kept apart so the API
# process importing this module does not import Ray).
RESOURCE_ROLES = frozenset({"actor", "rollout", "reference", "actor_fwd", "critic", "advantages"})

# rm-type names `runtime.rewards` scores (each also as `boxed_<name>`); kept equal to
# `runtime.rewards.known_rm_types()` by a test (imported here, they would pull the reward code into the API).
RM_TYPES = frozenset(
    {
        "dapo",
        "deepscaler",
        "dummy",
        "exact_match",
        "f1",
        "geo3k",
        "gpqa",
        "gsm8k",
        "math",
        "mopd",
        "multiple_choice",
        "openr1mm",
        "random",
        "remote_rm",
    }
)

# Parameters the pipeline reads whatever the backend: RuntimeSpec's fields...
COMMON_PARAMETERS: frozenset[str] = RuntimeSpec.field_names() | {
    # ...plus parameters that need nothing more from the backend, many of them set by Relax's derived
    # defaults in every normalized spec.
    "offload_train",  # restricted below: colocated roles offload/onload at every turn, and only they do
    "offload_rollout",
    "num_gpus_per_node",  # placement is per slot here
    # Relax's legacy per-role GPU flags: jobspec derives the equivalent `resource` from them
    # (rule.legacy_layout_resource), which placement reads
    "actor_num_nodes",
    "actor_num_gpus_per_node",
    "rollout_num_gpus",
    "rollout_num_gpus_per_engine",  # restricted below: the torch engine uses one device
    "checkpoint_engine_backend",  # restricted below: the platform picks the weight sync (runtime/weight_sync)
    # the collective weight sync's bucket bytes (runtime/weight_sync/select.py), whatever the backend
    "update_weight_buffer_size",
    "distributed_backend",  # restricted below: the trainer ranks pick their collective backend by device
    "optimizer",  # restricted below
    # restricted below: the megatron backend balances tokens across its data-parallel ranks; the torch
    # backend's one trainer has nothing to balance, so there only where Relax derives it (SFT)
    "balance_data",
    "dump_details",  # Relax derives save-debug-rollout-data and save-debug-train-data under it
    # every role's process reads the job's checkpoints into the page cache first (runtime/models/page_cache.py)
    "warm_hf_checkpoint_page_cache",
    "train_memory_margin_bytes",  # restricted below
    "sglang",  # restricted below: SGLang server arguments, on every engine server's command line
    # read by `runtime.rewards.RewardModel.from_spec` from the spec's values
    "rm_url",
    "group_rm",
    "reward_key",
    "eval_reward_key",
    "reward_max_concurrency",
    "reward_num_workers",  # restricted below: Relax's sync-reward actors; rewards run inline here
    "rollout_global_dataset",  # restricted below: Relax turns it off for SFT, which reads --prompt-data itself
    # the platform's reconciler (scheduler/recovery.py): a lost driver (killed, its node or Ray gone) is resumed
    # from the job's latest checkpoint, at most --max-global-restart times with --use-fault-tolerance
    "use_fault_tolerance",
    "max_global_restart",
    # the rollout engines' health check (runtime/roles/engine_health.py): a hung or dead engine server of the
    # job's own is replaced on the role's capacity with the current weights, its requests generated again;
    # replacements count against --max-global-restart
    "use_health_check",
    "rollout_health_check_interval",
    "rollout_health_check_timeout",
    "rollout_health_check_first_wait",
    # elastic rollout (runtime/roles/elastic.py): the job's own engines, on devices of their own, are scaled
    # out and in between steps as the autoscaler's YAML says, with these operations' timeouts and policy
    "autoscaler_config",  # restricted below
    "scale_out_timeout",
    "scale_out_partial_success_policy",
    "scale_in_drain_timeout",
    "scale_in_shutdown_timeout",
    # the platform's webhooks (scheduler/services/webhooks.py): every status change of the job is POSTed to
    # each http(s) URL, signed with the job's own secret (docs/reference/webhooks.md)
    "notify_urls",
    # experiment trackers (runtime/trackers.py): every metric point the driver reports also goes to
    # TensorBoard event files in the job's folder and, with --use-wandb, to W&B
    "use_tensorboard",
    "tb_project_name",
    "tb_experiment_name",
    "use_wandb",  # restricted below: where the wandb package is installed
    *WANDB_PARAMETERS,
}

# The torch backend reads nothing beyond the common parameters. (`distributed-timeout-minutes` is not
# among them: the torch backend's one trainer joins no process group; the megatron backend reads it.)
TORCH_BACKEND_PARAMETERS: frozenset[str] = COMMON_PARAMETERS

# Megatron's arguments the megatron backend reads from the spec's values (runtime/train/megatron/):
MEGATRON_ARGUMENTS: frozenset[str] = frozenset(
    {
        # parallel.py: the layout, and the process group's timeout (backend.py)
        "distributed_timeout_minutes",
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "num_virtual_stages_per_pipeline_rank",
        "num_layers_per_virtual_pipeline_stage",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "sequence_parallel",
        # model.py: the architecture (ModelArgs, flags over --hf-checkpoint's config.json)
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "group_query_attention",
        "num_query_groups",
        "kv_channels",
        "vocab_size",
        "max_position_embeddings",
        "seq_length",
        "padded_vocab_size",
        "make_vocab_size_divisible_by",
        "rotary_base",
        "rotary_percent",
        "use_rope_scaling",
        "rope_scaling_factor",
        "rope_type",
        "norm_epsilon",
        "normalization",
        "add_qkv_bias",
        "add_bias_linear",
        "qk_layernorm",
        "untie_embeddings_and_output_weights",
        "swiglu",
        "position_embedding_type",
        "num_experts",
        "moe_router_topk",
        "moe_ffn_hidden_size",
        "moe_shared_expert_intermediate_size",
        "moe_aux_loss_coeff",
        "moe_router_load_balancing_type",
        "moe_router_score_function",
        "moe_layer_freq",
        "moe_router_pre_softmax",
        # moe.py: the routed experts in torch's grouped GEMM; kernels.py: the token permutation in
        # TransformerEngine's fused-permutation slots (ours without TE)
        "moe_grouped_gemm",
        "moe_permute_fusion",
        "moe_token_dispatcher_type",
        "moe_router_dtype",
        "moe_router_topk_scaling_factor",
        # model.py: TransformerConfig (precision, dropout, init, recompute)
        "bf16",
        "fp16",
        "hidden_dropout",
        "attention_dropout",
        "init_method_std",
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
        "recompute_modules",
        # Megatron-LM's shorthand for --recompute-granularity selective, which the spec derives from it
        "recompute_activations",
        # model.py / kernels.py: RoPE through megatron's fused-RoPE hook (ours) unless --no-rope-fusion; the
        # legacy --use-rotary-position-embeddings (the spec derives --position-embedding-type rope from it)
        "apply_rope_fusion",
        "use_rotary_position_embeddings",
        # attention.py: SDPA (restricted below); its softmax is fp32 whatever the flag says
        "attention_backend",
        "attention_softmax_in_fp32",
        # backend.py: DDP, optimizer, loss scaling, the loss head, log-probs batching
        "use_distributed_optimizer",
        "overlap_grad_reduce",
        "overlap_param_gather",
        "accumulate_allreduce_grads_in_fp32",
        "check_for_nan_in_loss_and_grad",
        "ddp_bucket_size",
        "ddp_average_in_collective",
        "optimizer_cpu_offload",
        "optimizer_offload_fraction",
        "use_torch_optimizer_for_cpu_offload",
        "overlap_cpu_optimizer_d2h_h2d",
        "use_precision_aware_optimizer",
        "store_param_remainders",
        "loss_scale",
        "initial_loss_scale",
        "min_loss_scale",
        "loss_scale_window",
        "hysteresis",
        "log_probs_chunk_size",
        # backend.py: micro-batches as packed sequences (thd, Relax's default) or padded rows (bshd)
        "qkv_format",
        # backend.py + checkpoint.py: checkpoints, weights in and out
        "ckpt_format",
        "dist_ckpt_save_pre_mcore_014",
        "no_load_optim",
        "no_load_rng",
        "finetune",
        "megatron_to_hf_mode",
        "tokenizer_model",
        "tokenizer_type",
    }
)

MEGATRON_BACKEND_PARAMETERS: frozenset[str] = COMMON_PARAMETERS | MEGATRON_ARGUMENTS

BACKEND_PARAMETERS: dict[str, frozenset[str]] = {
    "torch": TORCH_BACKEND_PARAMETERS,
    "megatron": MEGATRON_BACKEND_PARAMETERS,
}
BACKENDS = tuple(BACKEND_PARAMETERS)


def _one_of(*allowed: Any) -> Callable[[Any, Mapping[str, Any]], bool]:
    return lambda value, _values: value is None or value in allowed


def _resource_ok(value: Any, values: Mapping[str, Any]) -> bool:
    """Roles the runtime runs; each forward-only role on one device; the trainer on one device (torch) or on
    any number of devices, one rank each (megatron; jobspec checks the parallel sizes); the critic on one
    device (torch; under megatron one rank with model-parallel sizes 1), or under megatron on N devices, one
    rank each in the job's parallel layout, when N ranks hold that layout (`_megatron_world_ok`)."""
    if not value:
        return True
    if not isinstance(value, Mapping) or not set(value) <= RESOURCE_ROLES:
        return False
    devices = {
        role: pair[1] for role, pair in value.items() if isinstance(pair, list | tuple) and len(pair) == 2
    }
    multi_rank = values.get("train_backend") == "megatron"
    if not values.get("debug_rollout_only") and not multi_rank and devices.get("actor", 1) != 1:
        return False
    critic = devices.get("critic", 1)
    if critic > 1 and not (multi_rank and _megatron_world_ok(critic, values)):
        return False
    return all(devices.get(role, 1) <= 1 for role in ("reference", "actor_fwd"))


def _megatron_world_ok(world: int, values: Mapping[str, Any]) -> bool:
    """`world` megatron-core ranks hold the job's layout: whole model replicas (TP x PP x CP; jobspec checks
    this for the actor's and the critic's GPUs) and, per pipeline stage, whole expert groups (EP x ETP, which
    jobspec checks for the actor only), as `runtime.train.megatron.parallel.ParallelLayout` requires."""

    def size(name: str) -> int:
        return int(values.get(name) or 1)

    tp, pp, cp, ep = (
        size(n)
        for n in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
            "expert_model_parallel_size",
        )
    )
    etp = int(values.get("expert_tensor_parallel_size") or tp)
    return world % (tp * pp * cp) == 0 and world % (ep * etp * pp) == 0


def _colocated(values: Mapping[str, Any]) -> bool:
    """The trainer and the rollout take turns on the same devices (RuntimeSpec.colocated), or external
    engines share them."""
    return bool(values.get("colocate")) and not values.get("hybrid") and not values.get("fully_async")


def _offload_ok(value: Any, values: Mapping[str, Any]) -> bool:
    """`offload-train` / `offload-rollout`: colocated roles release the idle side's device memory at every
    turn unless the flag turns it off (unset: on, as Relax derives it); roles on devices of their own have
    nothing to release, so on is refused there."""
    if value is None or not value or values.get("debug_rollout_only"):
        return True
    return _colocated(values)


def _offload_all_ok(value: Any, values: Mapping[str, Any]) -> bool:
    """`offload` (both of the above): only where the roles are colocated."""
    return not value or _colocated(values) or bool(values.get("debug_rollout_only"))


def _one_step_per_rollout(values: Mapping[str, Any]) -> bool:
    """One optimizer step per rollout: the old log-probs (the trainer's, or actor_fwd's with the same
    weights, computed before the update) are then the train forward's, as `true-on-policy-mode` takes them
    (Relax derives the mode exactly then, in fully-async mode)."""
    samples = int(values.get("rollout_batch_size") or 0) * int(values.get("n_samples_per_prompt") or 1)
    global_batch = values.get("global_batch_size")
    return not global_batch or int(global_batch) >= samples


_PLATFORM_REFERENCES = ("artifacts://", "job://")


def _tokenizer_model_ok(value: Any, values: Mapping[str, Any]) -> bool:
    """The tokenizer is `--hf-checkpoint`'s (Relax derives `--tokenizer-model` from it). At submission both
    are as written and must be equal; in the driver the platform has resolved `--hf-checkpoint` (a path
    field) but not `--tokenizer-model`, whose platform reference was compared at submission."""
    checkpoint = values.get("hf_checkpoint")
    if value is None or value == checkpoint:
        return True
    resolved = isinstance(checkpoint, str) and not checkpoint.startswith(_PLATFORM_REFERENCES)
    return resolved and isinstance(value, str) and value.startswith(_PLATFORM_REFERENCES)


def _elastic_problem(values: Mapping[str, Any]) -> str | None:
    """Why `--autoscaler-config` cannot scale this job's engines (None: it can)."""
    if _colocated(values):
        return (
            "the engines share the trainer's devices (--colocate): only engines on devices of their own scale"
        )
    if values.get("rollout_external"):
        return "external engines (--rollout-external) are not the job's to start or stop"
    if values.get("use_health_check"):
        return (
            "not yet with --use-health-check (its replacements and the scaling would both change the engines)"
        )
    if values.get("fully_async"):
        return "not yet in fully-async mode (engines change between steps, while no rollout runs)"
    return None


def _rm_type_ok(value: Any, values: Mapping[str, Any]) -> bool:
    """A type the reward stage scores; an unknown one only with `rm-type-fallback` (which then scores)."""
    if value is None or values.get("custom_rm_path"):
        return True
    base = str(value).strip().removeprefix("boxed_")
    return base in RM_TYPES or (base not in UNSUPPORTED_RM_TYPES and bool(values.get("rm_type_fallback")))


# Relax rm-types with no implementation here (runtime.rewards.UNSUPPORTED_RM_TYPES says why)
UNSUPPORTED_RM_TYPES = frozenset({"ifbench", "dapo-genrm"})


# Honoured parameters whose value still matters: name -> does the job's backend implement the value?
# (A check applies where the backend honours the name; `values` has the job's backend.)
RESTRICTIONS: dict[str, Callable[[Any, Mapping[str, Any]], bool]] = {
    "train_backend": _one_of(*BACKENDS),
    "offload": _offload_all_ok,
    "offload_train": _offload_ok,
    "offload_rollout": _offload_ok,
    "true_on_policy_mode": lambda value, values: not value or _one_step_per_rollout(values),
    "sglang": lambda value, _values: not sglang_passthrough.problems(value),
    "checkpoint_engine_backend": _one_of("nccl"),
    "reward_num_workers": _one_of(16),
    # the value is not read: the trainer ranks use NCCL on CUDA and gloo on CPU whatever it says, so only
    # Relax's default (which means "the accelerator's collectives") is accepted
    "distributed_backend": _one_of("nccl"),
    "balance_data": lambda value, values: (
        not value
        or values.get("train_backend") == "megatron"
        or values.get("loss_type") in ("sft", "sft_loss")
    ),
    # the torch backend runs one process; the megatron backend's SDPA core attention all-gathers K/V over the
    # context-parallel ranks (attention.py): any size the layout accepts
    "context_parallel_size": lambda value, values: value == 1 or values.get("train_backend") == "megatron",
    # megatron
    "ckpt_format": _one_of("torch_dist"),
    "megatron_to_hf_mode": _one_of("raw", "bridge"),
    "rope_type": _one_of("rope"),
    "tokenizer_type": _one_of("HuggingFaceTokenizer"),
    "tokenizer_model": lambda value, values: _tokenizer_model_ok(value, values),
    "dist_ckpt_save_pre_mcore_014": lambda _value, _values: True,
    "rollout_num_gpus_per_engine": _one_of(1),
    "optimizer": _one_of("adam"),
    # megatron-core needs TransformerEngine's FusedAdam for it, except under the CPU offload, which requires it
    # (its hybrid optimizer keeps the fp32 master copies)
    "use_precision_aware_optimizer": lambda value, values: (
        not value or bool(values.get("optimizer_cpu_offload"))
    ),
    # TransformerEngine's FusedAdam keeps bf16 remainders; without TE there are none (off: what Relax
    # derives under --fp16)
    "store_param_remainders": _one_of(None, False),
    "loss_type": _one_of("policy_loss", "custom_loss", "sft", "sft_loss"),
    "kl_loss_type": _one_of("k1", "k2", "k3", "low_var_kl"),
    "lr_decay_style": _one_of("constant", "linear", "cosine"),
    "resource": _resource_ok,
    "rm_type": _rm_type_ok,
    "rm_type_fallback": lambda value, _values: (
        value is None or str(value).removeprefix("boxed_") in RM_TYPES | {"zero"}
    ),
    # the built-in engine's server and SGLang itself, over SGLang's HTTP API; `rollout-external` only
    # with the servers' addresses
    "rollout_external": lambda value, values: not value or bool(values.get("rollout_external_engine_addrs")),
    "num_iters_per_train_update": _one_of(1),
    "max_staleness": lambda value, values: not value or bool(values.get("fully_async")),
    "eval_config": lambda value, values: value is None or values.get("loss_type") not in ("sft", "sft_loss"),
    # with loaded rollouts (no engines), or for SFT without generative predictions (which never starts engines:
    # Relax's SFT scripts set it)
    "debug_train_only": lambda value, values: (
        not value
        or bool(values.get("load_debug_rollout_data"))
        or (values.get("loss_type") in ("sft", "sft_loss") and values.get("sft_predict_interval") is None)
    ),
    # SDPA's dispatcher runs the flash kernel on CUDA (bf16/fp16); the other kernels are TransformerEngine's
    "attention_backend": _one_of("auto", "flash"),
    # megatron's flex dispatcher runs DeepEP's or HybridEP's kernels, which the platform's hosts do not have
    "moe_token_dispatcher_type": _one_of("alltoall", "allgather"),
    # no trainer memory is reserved; debug-rollout-only derives 0 (there is no trainer at all)
    "train_memory_margin_bytes": lambda value, values: (
        value in (None, 1 << 30) or bool(values.get("debug_rollout_only"))
    ),
    # on; off only where Relax turns it off itself (SFT)
    "rollout_global_dataset": lambda value, values: (
        value is not False or values.get("loss_type") in ("sft", "sft_loss")
    ),
    # on-policy distillation: the teacher held by the trainer; an SGLang teacher (its URL, routes, managed
    # servers, top-k log-probs) is not implemented, nor the top-k estimators (forward_kl, jsd)
    "opd_type": _one_of("megatron"),
    "opd_kl_type": _one_of("reverse_kl", "low_var_kl"),
    # W&B logging needs the `wandb` package (the optional extra relax-platform[wandb]); the platform's processes
    # and its clusters share one install, and the driver checks again where it runs
    "use_wandb": lambda value, _values: not value or wandb_installed(),
    "autoscaler_config": lambda value, values: not value or _elastic_problem(values) is None,
}


#: What a refused value needs instead, where "use a value the backend implements" would not say it.
RESTRICTION_HINTS: dict[str, str] = {
    "moe_token_dispatcher_type": "megatron's flex dispatcher needs DeepEP or HybridEP, which the platform's hosts "
    "do not have: use --moe-token-dispatcher-type alltoall (the same routing, NCCL all-to-all)",
    "autoscaler_config": "elastic rollout scales the job's own engines on devices of their own, between "
    "steps: not with --colocate, --rollout-external, --use-health-check or --fully-async (yet); remove "
    "--autoscaler-config or those flags (docs/reference/elastic-rollout.md)",
    "use_wandb": "the wandb package is not installed on this platform (the optional extra "
    "relax-platform[wandb]): remove --use-wandb, or ask the platform's admin to install it; every metric is "
    "in the API and, unless --no-use-tensorboard, in the job's TensorBoard event files",
    # SGLang server flags the platform sets itself (`sglang_problems` names them `sglang_<flag>`), by flag
    # and alias
    **{
        f"sglang_{key}": f"{why}: remove --sglang-{sglang_passthrough.flag_of(key)}"
        for key, why in sglang_passthrough.refused_flag_reasons().items()
    },
}


def sglang_problems(value: Any) -> list[str]:
    """The `sglang` passthrough's refused entries, each named after its flag (`sglang_port=30000` for
    `--sglang-port 30000`, whose hint says why; a name that is no SGLang server flag without a value)."""
    out = []
    for key, item, _why in sglang_passthrough.problems(value):
        name = f"sglang_{key}"
        out.append(f"{name}={item!r}" if name in RESTRICTION_HINTS else name)
    return out


#: How a refused restricted value is reported, where not as 'name=value'.
PROBLEM_NAMES: dict[str, Callable[[Any], list[str]]] = {"sglang": sglang_problems}


def job_backend(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    """The backend that runs the job: `train-backend`, else its default (Relax's: megatron)."""
    return str(values.get("train_backend") or defaults.get("train_backend") or "megatron")


def unsupported_parameters(
    values: Mapping[str, Any], defaults: Mapping[str, Any], changed: Collection[str] | None = None
) -> list[str]:
    """Parameters the job's backend cannot honour: names set away from their default that it does not
    implement, and 'name=value' for honoured names set to a value it does not implement. An unknown
    backend is the one problem reported (`train_backend=...`).

    `changed`, when given, holds every name whose value may differ from its default (`NormalizedSpec.changed`:
    the names given and derived): only those are compared with their defaults, and every honoured name with a
    restriction is checked whatever its value. The answer is the same as without it."""
    backend = job_backend(values, defaults)
    honoured = BACKEND_PARAMETERS.get(backend)
    if honoured is None:
        return [f"train_backend={backend!r}"]
    values = {**values, "train_backend": backend}
    if changed is None:
        names: Iterable[str] = values
    else:
        names = _restricted(backend).union(changed, ("train_backend",)).intersection(values)
    problems = []
    for name in names:
        value = values[name]
        if name in honoured:
            check = RESTRICTIONS.get(name)
            if check is not None and not check(value, values):
                itemized = PROBLEM_NAMES.get(name)
                problems += itemized(value) if itemized else [f"{name}={value!r}"]
        elif name in defaults and value is not None and value != defaults[name]:
            problems.append(name)
    return sorted(problems)


@functools.cache
def _restricted(backend: str) -> frozenset[str]:
    """The names `backend` honours for some values only: checked in every spec, set or not."""
    return BACKEND_PARAMETERS[backend].intersection(RESTRICTIONS)


def _cell(name: str, backend: str) -> str:
    if name not in BACKEND_PARAMETERS[backend]:
        return "no"
    if name in RESTRICTIONS:
        doc = RESTRICTION_DOCS.get(name)
        if isinstance(doc, dict):
            doc = doc.get(backend)
        return "values" + (f": {doc}" if doc else "")
    return "yes"


def render_markdown() -> str:
    """The capability table of docs/reference/capabilities.md: every Relax parameter x backend."""
    from jobspec.spec import FIELDS

    lines = [
        "# Backend capabilities",
        "",
        "Generated by `python -m runtime.capabilities > docs/reference/capabilities.md`; do not edit.",
        "A job that sets a parameter its backend does not implement (away from the default) is refused at",
        "submission with the parameter's name (`spec.unsupported_by_backend`).",
        "",
        "- **yes**: honoured · **values**: honoured for the listed values only · **no**: refused when set",
        "- `torch`: a Hugging Face model trained with AdamW in one process (CPU or one GPU).",
        "- `megatron` (Relax's default): megatron-core, one trainer process per rank (gloo on CPU, NCCL on CUDA);",
        "  it reads Megatron's arguments from the spec (runtime/train/megatron/, docs/adr/0006).",
        "",
        "| parameter | torch | megatron |",
        "|---|---|---|",
    ]
    for name in sorted(FIELDS):
        flag = "--" + name.replace("_", "-")
        lines.append(f"| `{flag}` | {_cell(name, 'torch')} | {_cell(name, 'megatron')} |")
    return "\n".join(lines) + "\n"


# How each restricted parameter is restricted, for the table.
RESTRICTION_DOCS: dict[str, str | dict[str, str]] = {
    "train_backend": "torch, megatron",
    "offload": "only with --colocate (colocated roles offload at every turn, and only they)",
    "offload_train": "on or off when colocated (the idle side releases its device memory at each turn); off otherwise",
    "offload_rollout": "on or off when colocated (the idle side releases its device memory at each turn); off otherwise",
    "true_on_policy_mode": "with one optimizer step per rollout (global batch = the rollout's samples), where "
    "the old log-probs computed before the update are the train forward's, as Relax derives it in fully-async "
    "mode: the trainer does not recompute them and the loss takes the train forward's, detached, unless "
    "something reads them before the loss (kl-coef reward shaping or on-policy distillation without "
    "--use-rollout-logprobs, an actor_fwd role, --rollout-data-postprocess-path, --save-debug-train-data), "
    "which keeps the recompute",
    "sglang": (
        f"every server argument of SGLang {sglang_passthrough.SGLANG_VERSION} (`--sglang-X v` reaches the "
        "engine servers as `--X v`): SGLang's server takes them all; the built-in engine's server reads "
        + ", ".join(f"--{flag}" for flag in sglang_passthrough.BUILTIN_READS)
        + " and logs the others at startup. Not --sglang-host, --sglang-port, --sglang-api-key, "
        "--sglang-config, --sglang-model-path, --sglang-tp-size (the platform sets them), nor --sglang-dp-size, "
        "--sglang-pp-size, --sglang-ep-size above 1 (one GPU per engine), nor names that are not SGLang "
        "server arguments. Relax's own "
        + ", ".join(f"--sglang-{f}" for f in sglang_passthrough.RELAX_SGLANG_FLAGS)
        + " are accepted and not forwarded (no router here; one batch request per engine at a time)"
    ),
    "checkpoint_engine_backend": "nccl (the default): the platform picks the weight sync: in place for engines "
    "in the trainer, a collective (NCCL on GPUs, gloo on CPU) for the job's engines on devices of their own, "
    "Ray's object store otherwise",
    "reward_num_workers": "16 (the default): rewards are computed inline in the rollout, with no worker actors",
    "distributed_backend": "nccl (the default): the trainer ranks use NCCL on CUDA and gloo on CPU by themselves",
    "balance_data": {
        "torch": "only under --loss-type sft, where Relax derives it (one trainer: nothing to balance)",
        "megatron": "yes: data-parallel shares of equal size with balanced token counts",
    },
    "context_parallel_size": {
        "torch": "1 (one trainer process)",
        "megatron": "any size the layout accepts, dense or MoE, packed (thd) or padded (bshd) sequences "
        "(SDPA attention over K/V all-gathered across the context-parallel ranks)",
    },
    "ckpt_format": "torch_dist",
    "megatron_to_hf_mode": "raw, bridge (one mapping, runtime/train/megatron/convert.py)",
    "rope_type": "rope",
    "tokenizer_type": "HuggingFaceTokenizer (the tokenizer is --hf-checkpoint's)",
    "tokenizer_model": "--hf-checkpoint (as Relax derives it)",
    "dist_ckpt_save_pre_mcore_014": "either (Relax derives it on): checkpoints are written in the installed "
    "megatron-core's layout (its ShardedTensor no longer writes the pre-0.14 one); loading reads the layout "
    "from the checkpoint",
    "rollout_num_gpus_per_engine": "1",
    "optimizer": "adam",
    "use_precision_aware_optimizer": "only with --optimizer-cpu-offload (which needs it; otherwise it needs "
    "TransformerEngine's FusedAdam)",
    "store_param_remainders": "off (TransformerEngine's FusedAdam keeps them; Relax derives off under --fp16)",
    "loss_type": "policy_loss, custom_loss, sft",
    "kl_loss_type": "k1, k2, k3, low_var_kl",
    "lr_decay_style": "constant, linear, cosine",
    "resource": {
        "torch": "roles actor, rollout, reference, actor_fwd, critic, advantages; actor, reference, actor_fwd "
        "and critic on one device",
        "megatron": "roles actor, rollout, reference, actor_fwd, critic, advantages; the actor on any number of "
        "devices (one rank each); reference and actor_fwd on one device; the critic on one device (one "
        "megatron-core rank, model-parallel sizes 1) or on N devices, one rank each in the job's parallel "
        "layout (N a multiple of TP x PP x CP and of EP x ETP x PP)",
    },
    "rm_type": "the rm-types of runtime/rewards (ifbench and dapo-genrm are not); any with --rm-type-fallback",
    "rm_type_fallback": "zero, or an rm-type of runtime/rewards",
    "rollout_external": "with --rollout-external-engine-addrs",
    "num_iters_per_train_update": "1",
    "max_staleness": "0 unless --fully-async",
    "eval_config": "RL jobs (SFT takes --eval-prompt-data or --eval-size)",
    "debug_train_only": "with --load-debug-rollout-data, or for SFT without --sft-predict-interval",
    "attention_backend": "auto, flash (SDPA: its flash kernel on CUDA in bf16/fp16; the others are TransformerEngine's)",
    "moe_token_dispatcher_type": "alltoall, allgather (flex needs DeepEP or HybridEP kernels, not installed)",
    "train_memory_margin_bytes": "the default, or 0 as --debug-rollout-only derives it",
    "rollout_global_dataset": "on; off under --loss-type sft (Relax turns it off there)",
    "opd_type": "megatron (the teacher is loaded by the trainer from --opd-teacher-load); not sglang (an "
    "SGLang teacher server)",
    "opd_kl_type": "reverse_kl, low_var_kl (the estimators on the student's sampled tokens; forward_kl and jsd "
    "need top-k distributions)",
    "use_wandb": "where the wandb package is installed (the optional extra relax-platform[wandb])",
    "autoscaler_config": "a YAML of min/max engines and scale-out/in thresholds (docs/reference/elastic-rollout.md); "
    "the job's own engines on devices of their own, between steps: not with --colocate, --rollout-external, "
    "--use-health-check or --fully-async",
}


if __name__ == "__main__":
    print(render_markdown(), end="")
