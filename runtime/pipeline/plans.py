"""What a job's spec asks of its trainer, critic, roles and data: pure spec -> config functions, no I/O.

Both kinds of pipeline (`rl.py`, `sft.py`) and the driver (`role_plan` sizes a private Ray cluster) read
these; they hold no state and start nothing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
from collections.abc import Mapping
from typing import Any

import torch

from jobspec.demand import PLACEMENT_KEY, gpu_nodes
from runtime.access import owner_of
from runtime.algos.advantages import AdvantageConfig
from runtime.algos.losses import LossConfig
from runtime.algos.opd import OPDConfig
from runtime.data.prompts import DatasetConfig
from runtime.devices import Device, DeviceKind
from runtime.roles.groups import (
    DEFAULT_ENGINE_KIND,
    ENGINE_KIND_ENV,
    CriticPlan,
    EngineKind,
    RolePlan,
    explicit_engine_kind,
)
from runtime.roles.placement import Role, critic_world_size, spec_demand, train_world_size
from runtime.rollout.elastic import ElasticSettings
from runtime.rollout.health import HealthCheckConfig
from runtime.rollout.sglang.passthrough import server_argv
from runtime.spec import KL_SHAPED_ESTIMATORS, RuntimeSpec
from runtime.train.base import is_multi_rank
from runtime.train.checkpoint import resolve_model_folder
from runtime.train.critic import CriticConfig
from runtime.train.schedule import DecayStyle, LRSchedule
from runtime.train.torch_backend import OptimizerConfig, TrainConfig
from runtime.types import RolloutBatch

log = logging.getLogger("runtime.pipeline")


def train_config_from(spec: RuntimeSpec, total_rollouts: int) -> TrainConfig:
    gbs = spec.effective_global_batch_size
    steps_per_rollout = _optimizer_steps_per_rollout(spec)
    style = DecayStyle(spec.lr_decay_style)
    schedule = LRSchedule(
        lr=spec.lr,
        min_lr=spec.min_lr,
        style=style,
        warmup_steps=spec.lr_warmup_iters,
        decay_steps=spec.lr_decay_iters or total_rollouts * steps_per_rollout,
    )
    optimizer = _spec_fields(
        spec,
        OptimizerConfig,
        loss=loss_config_from(spec),
        lr_schedule=schedule,
        global_batch_size=gbs or None,
        max_tokens_per_micro_batch=spec.max_tokens_per_gpu if spec.use_dynamic_batch_size else None,
        owner=owner_of(spec),
    )
    return TrainConfig(
        **optimizer,
        loss_type=spec.loss_type,
        log_probs_max_tokens=spec.log_probs_max_tokens_per_gpu,
        log_probs_temperature=1.0 if spec.is_sft else spec.rollout_temperature,
        save_optimizer=not spec.no_save_optim,
        ref_load=spec.ref_load,
        ref_ckpt_step=spec.ref_ckpt_step,
        ref_update_interval=spec.ref_update_interval,
        opd_teacher_load=spec.opd_teacher_load if spec.has_teacher else None,
        opd_teacher_ckpt_step=spec.opd_teacher_ckpt_step if spec.has_teacher else None,
        only_train_params=tuple(spec.only_train_params_name_list or ()),
        freeze_params=tuple(spec.freeze_params_name_list or ()),
        old_log_probs_from_forward=old_log_probs_from_train_forward(spec),
    )


def loss_config_from(spec: RuntimeSpec) -> LossConfig:
    """The loss parameters (policy loss, KL loss, off-policy corrections, value loss, hooks)."""
    return LossConfig(
        **_spec_fields(
            spec,
            LossConfig,
            eps_clip_high=spec.effective_eps_clip_high,
            per_token_loss=spec.calculate_per_token_loss,
            opd=opd_config(spec),
        )
    )


def _spec_fields(spec: RuntimeSpec, config: type, *, prefix: str = "", **derived: Any) -> dict[str, Any]:
    """The arguments of the dataclass `config` whose fields are spec fields: each the spec's field of the
    same name after `prefix`, but those in `derived` (named otherwise in the spec, or computed from it)."""
    same = {
        f.name: getattr(spec, prefix + f.name) for f in dataclasses.fields(config) if f.name not in derived
    }
    return {**same, **derived}


def opd_config(spec: RuntimeSpec) -> OPDConfig | None:
    """On-policy distillation's parameters (`use-opd`: each field the spec's `opd_` one), None where it does
    not run (`has_teacher`)."""
    if not spec.has_teacher:
        return None
    return OPDConfig(**_spec_fields(spec, OPDConfig, prefix="opd_"))


def student_log_probs(spec: RuntimeSpec, batch: RolloutBatch) -> torch.Tensor | None:
    """pi_old of the sampled tokens, as the advantages stage reads it (KL shaping, OPD's advantage mode and
    `opd/kl`): the engine's with `use-rollout-logprobs`, else the trainer's recompute."""
    return batch.rollout_log_probs if spec.use_rollout_logprobs else batch.old_log_probs


def old_log_probs_readers(spec: RuntimeSpec) -> list[str]:
    """What reads the old log-probs (`batch.old_log_probs`) before or outside the policy loss, so that
    the log-probs stage must recompute them even in true-on-policy mode; [] when only the loss reads them
    (the ratio's pi_old, TIS's train side, the OPD loss's ratio, `use-unbiased-kl`, a custom loss or TIS
    function: all served by the train forward's own log-probs, detached)."""
    readers = []
    if _optimizer_steps_per_rollout(spec) > 1:
        readers.append("more than one optimizer step per rollout (later steps need the pre-update policy)")
    if Role.ACTOR_FWD in (spec.resource or {}):
        readers.append("an actor_fwd role computes them")
    if not spec.use_rollout_logprobs:  # `student_log_probs` is the trainer's: the advantages stage reads it
        if spec.kl_coef != 0 and spec.advantage_estimator in KL_SHAPED_ESTIMATORS:
            readers.append("kl-coef reward shaping (the advantages stage)")
        if spec.has_teacher:
            readers.append("on-policy distillation's advantages and opd/* metrics")
    if spec.rollout_data_postprocess_path:
        readers.append("rollout-data-postprocess-path (the hook sees the batch)")
    if spec.save_debug_train_data:
        readers.append("save-debug-train-data (the dumped batch carries them)")
    return readers


def old_log_probs_from_train_forward(spec: RuntimeSpec) -> bool:
    """True-on-policy mode (`true-on-policy-mode`) with one optimizer step per rollout and nothing
    reading the old log-probs before the loss (`old_log_probs_readers`): the trainer is not asked for them
    and the loss takes the train forward's log-probs, detached, as pi_old (the same values: the weights
    have not moved yet; the ratio is 1 and the surrogate's gradient is unchanged)."""
    return spec.true_on_policy_mode and not spec.is_sft and not old_log_probs_readers(spec)


def _optimizer_steps_per_rollout(spec: RuntimeSpec) -> int:
    gbs = spec.effective_global_batch_size
    return math.ceil(spec.samples_per_rollout / gbs) if gbs else 1


def advantage_config(spec: RuntimeSpec, *, rewards_normalization: bool) -> AdvantageConfig:
    """The advantages stage's parameters, on-policy distillation's (`opd_config`) included."""
    return AdvantageConfig(
        std_normalization=not spec.disable_grpo_std_normalization,
        rewards_normalization=rewards_normalization,
        gamma=spec.gamma,
        lambd=spec.lambd,
        kl_coef=spec.kl_coef,
        kl_type=spec.kl_loss_type,
        normalize_advantages=spec.normalize_advantages,
        opd=opd_config(spec),
    )


def critic_plan(
    spec: RuntimeSpec, total_rollouts: int, initial_weights: str, device: Device | None = None
) -> CriticPlan | None:
    """PPO's critic: the policy's initial weights with a fresh value head, `critic-lr` (default lr) with
    its own `critic-lr-warmup-iters`, the policy's batching and optimizer settings; on the job's train
    backend (megatron: megatron-core, which reads its architecture and layout from the spec's values, on
    `placement.critic_world_size` ranks: one per device of the critic's `resource` entry)."""
    if not spec.has_critic:
        return None
    policy = train_config_from(spec, total_rollouts)
    schedule = dataclasses.replace(
        policy.lr_schedule,
        lr=spec.critic_lr if spec.critic_lr is not None else spec.lr,
        warmup_steps=spec.critic_lr_warmup_iters,
    )
    multi_rank = is_multi_rank(spec.train_backend)
    # the policy's OptimizerConfig fields, but the critic's learning rate
    shared = {f.name: getattr(policy, f.name) for f in dataclasses.fields(CriticConfig)}
    return CriticPlan(
        model_path=initial_weights,
        backend=spec.train_backend,
        hf_checkpoint=str(spec.hf_checkpoint),
        values=spec.values() if multi_rank else {},
        world=(
            critic_world_size(spec.resource, _model_parallel_size(spec), device or Device.for_roles())
            if multi_rank
            else None
        ),
        config=CriticConfig(**{**shared, "lr_schedule": schedule}),
    )


def dataset_config(
    spec: RuntimeSpec,
    *,
    input_key: str | None = None,
    label_key: str | None = None,
    tool_key: str | None = None,
) -> DatasetConfig:
    return DatasetConfig(
        input_key=input_key or spec.input_key,
        label_key=label_key if label_key is not None else spec.label_key,
        metadata_key=spec.metadata_key,
        tool_key=tool_key or spec.tool_key,
        conversation_key_map=dict(spec.conversation_key_map or {}),
        apply_chat_template=spec.apply_chat_template,
        apply_chat_template_kwargs=dict(spec.apply_chat_template_kwargs or {}),
        system_prompt=spec.system_prompt,
    )


def trainer_world(spec: RuntimeSpec, device: Device | None = None) -> int | None:
    """A multi-rank backend's number of trainer ranks (`placement.train_world_size`); None for the torch
    backend (one trainer). Reads the model-parallel sizes from the spec's values (Megatron's dests)."""
    if not is_multi_rank(spec.train_backend) or not spec.trains:
        return None
    return train_world_size(spec.resource, _model_parallel_size(spec), device or Device.for_roles())


def _model_parallel_size(spec: RuntimeSpec) -> int:
    """Tensor x pipeline x context parallel sizes, from the spec's values (Megatron's dests)."""
    values = spec.values()
    model_parallel = 1
    for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        model_parallel *= int(values.get(name) or 1)
    return model_parallel


# train backends whose ranks yield their weights on the device (`iter_device_weights`) for an engine they host
HOSTING_BACKENDS = ("torch", "megatron")


def in_trainer_refusal(spec: RuntimeSpec, *, by_default: bool, sglang_runs: bool = False) -> str | None:
    """Why this job's rollout engines cannot live in the trainer's rank actors (`EngineKind.IN_TRAINER`);
    None: they can. `by_default`: nobody asked for it (`RELAX_ROLLOUT_ENGINE` unset), so what asks for
    engine servers keeps them: `--sglang-*` server arguments, `--use-health-check` (it replaces servers),
    SGLang itself where it runs (`sglang_runs`: importable, on CUDA)."""
    values = spec.values()
    if not spec.colocated:
        return "the job is not colocated (--colocate, not hybrid or fully-async)"
    if spec.is_sft or not spec.trains or not spec.starts_engines:
        return "only an RL job that trains with engines of its own hosts them in its trainer"
    if spec.train_backend not in HOSTING_BACKENDS:
        return f"the {spec.train_backend} backend does not hand its weights over in place"
    if int(values.get("pipeline_model_parallel_size") or 1) > 1:
        return "pipeline-model-parallel-size > 1: a rank holds only its stage's weights"
    if by_default:
        if server_argv(spec.extra.get("sglang")):
            return "the job's SGLang server arguments ask for engine servers"
        if values.get("use_health_check"):
            return "--use-health-check checks and replaces engine servers"
        if sglang_runs:
            return "SGLang is installed and CUDA present: its servers run the rollout"
    return None


def engine_kind(spec: RuntimeSpec, explicit: EngineKind | None, *, sglang_runs: bool = False) -> EngineKind:
    """How the job's rollout engines run. A colocated RL job hosts the built-in engine in each trainer
    rank's actor (`EngineKind.IN_TRAINER`: weights in place, no object store) unless
    `RELAX_ROLLOUT_ENGINE` names another kind or `in_trainer_refusal` says why not; otherwise the kind
    named, else engine servers (`DEFAULT_ENGINE_KIND`)."""
    if explicit is not None and explicit is not EngineKind.IN_TRAINER:
        return explicit
    why = in_trainer_refusal(spec, by_default=explicit is None, sglang_runs=sglang_runs)
    if why is None:
        return EngineKind.IN_TRAINER
    if explicit is EngineKind.IN_TRAINER and spec.generates:
        log.warning("%s=in-trainer: %s; the engines run as servers of their own", ENGINE_KIND_ENV, why)
    return DEFAULT_ENGINE_KIND


def offload_flags(spec: RuntimeSpec) -> tuple[bool, bool]:
    """`--offload-train`, `--offload-rollout`; unset: on when colocated (as jobspec derives them)."""
    values = spec.values()
    train, rollout = values.get("offload_train"), values.get("offload_rollout")
    if values.get("offload"):
        train = rollout = True
    return (
        spec.colocated if train is None else bool(train),
        spec.colocated if rollout is None else bool(rollout),
    )


def role_plan(spec: RuntimeSpec, total: int, device: Device | None = None) -> RolePlan:
    """The roles a job runs, from `resource` and the mode."""
    resource = spec.resource or {}
    initial = (
        str(resolve_model_folder(spec.ref_load, spec.ref_ckpt_step))
        if spec.ref_load
        else str(spec.hf_checkpoint)
    )
    separate: dict[Role, str] = {}
    # colocated and hybrid modes swap these models into the actor's devices (the platform reserves none
    # for them): they live in the trainer's process
    if not spec.colocate and spec.trains:
        if Role.REFERENCE in resource and spec.needs_reference:
            separate[Role.REFERENCE] = initial
        elif Role.REFERENCE in resource:
            log.warning("resource.reference is set but no KL term needs a reference model: not started")
        if Role.ACTOR_FWD in resource and not spec.is_sft:
            separate[Role.ACTOR_FWD] = initial
    return RolePlan(
        backend=spec.train_backend,
        hf_checkpoint=str(spec.hf_checkpoint),
        train_config=train_config_from(spec, total),
        resource=spec.resource,
        colocate=spec.colocated,
        with_train=spec.trains,
        with_rollout=spec.generates,
        need_ref=spec.needs_reference and Role.REFERENCE not in separate,
        separate=separate,
        log_probs_temperature=1.0 if spec.is_sft else spec.rollout_temperature,
        engine_kind=engine_kind(spec, explicit_engine_kind(), sglang_runs=_sglang_runs(device)),
        engine_args=server_argv(spec.extra.get("sglang")),
        external_engines=tuple(spec.rollout_external_engine_addrs or ()) if spec.rollout_external else (),
        critic=critic_plan(spec, total, initial, device),
        train_world=trainer_world(spec, device),
        values=spec.values() if is_multi_rank(spec.train_backend) else {},
        warm_page_cache=_warmed_folders(spec, initial),
        # without `resource` the runtime runs DEFAULT_RESOURCE, not Relax's legacy 8-GPU actor
        demand=spec_demand(spec.values()) if spec.resource else None,
        gpu_nodes=gpu_nodes(spec.extra.get(PLACEMENT_KEY) or ()),
        health=HealthCheckConfig.from_values(spec.values()) if spec.generates else None,
        elastic=ElasticSettings.from_values(spec.values()) if spec.generates else None,
        offload_train=offload_flags(spec)[0],
        offload_rollout=offload_flags(spec)[1],
        rollout_samples=rollout_samples(spec.values()),
    )


def rollout_samples(values: Mapping[str, Any]) -> int:
    """The samples one rollout asks the engines for: `--rollout-batch-size` prompts (or
    `--over-sampling-batch-size`, when larger) x `--n-samples-per-prompt`."""
    prompts = max(
        int(values.get("rollout_batch_size") or 1), int(values.get("over_sampling_batch_size") or 0)
    )
    return prompts * max(1, int(values.get("n_samples_per_prompt") or 1))


def _sglang_runs(device: Device | None) -> bool:
    """SGLang's servers would run the rollout (the engine servers' default launcher): importable, CUDA."""
    kind = (device or Device.for_roles()).kind
    return kind is DeviceKind.CUDA and importlib.util.find_spec("sglang") is not None


def _warmed_folders(spec: RuntimeSpec, initial: str) -> tuple[str, ...]:
    """`--warm-hf-checkpoint-page-cache`: the Hugging Face folders the roles load (the policy's, and the
    reference's / initial weights' when they differ)."""
    if not spec.values().get("warm_hf_checkpoint_page_cache"):
        return ()
    return tuple(dict.fromkeys((str(spec.hf_checkpoint), initial)))
