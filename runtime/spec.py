"""The one loader of job specs for the runtime: raw or normalized spec -> `RuntimeSpec` (the fields it reads)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)

# Estimators whose advantages take the `kl-coef` reward-shaping KL (runtime.algos.advantages)
KL_SHAPED_ESTIMATORS = frozenset({"rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"})


@dataclass
class RuntimeSpec:
    """The Relax parameters the runtime reads, with Relax's names (underscored) and defaults.

    `extra` keeps every other parameter of the normalized spec, so capability checks can see them.
    """

    name: str | None = None  # the job file's `name:`; not a Relax parameter
    train_backend: str = "megatron"
    # checkpoints
    hf_checkpoint: str | None = None
    ref_load: str | None = None
    ref_ckpt_step: int | None = None
    load: str | None = None
    save: str | None = None
    save_interval: int | None = None
    save_hf: str | None = None
    no_save_optim: bool = False
    async_save: bool = False
    rotate_ckpt: bool = False
    max_actor_ckpt_to_keep: int | None = None
    start_rollout_id: int | None = None
    # data
    prompt_data: str | None = None
    input_key: str = "input"
    label_key: str | None = None
    metadata_key: str = "metadata"
    tool_key: str | None = "tools"
    conversation_key_map: dict[str, str] | None = None
    apply_chat_template: bool = False
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None
    rollout_shuffle: bool = False
    rollout_seed: int = 42
    data_source_path: str = "relax.engine.rollout.data_source.RolloutDataSourceWithBuffer"
    # rollout
    rollout_batch_size: int | None = None
    n_samples_per_prompt: int = 1
    rollout_max_response_len: int | None = None
    rollout_max_prompt_len: int | None = None
    rollout_max_context_len: int | None = None
    rollout_stop: list[str] | None = None
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    rollout_top_k: int = -1
    rollout_stop_token_ids: list[int] | None = None
    rollout_skip_special_tokens: bool = False
    num_rollout: int | None = None
    num_epoch: int | None = None
    update_weights_interval: int = 1
    # over-sampling, dynamic filtering, partial rollout, custom functions
    over_sampling_batch_size: int | None = None
    dynamic_sampling_filter_path: str | None = None
    buffer_filter_path: str | None = None
    partial_rollout: bool = False
    partial_rollout_max_aborted_count: int | None = None
    mask_offpolicy_in_partial_rollout: bool = False
    rollout_function_path: str = "relax.engine.rollout.sglang_rollout.generate_rollout"
    eval_function_path: str | None = None
    custom_generate_function_path: str | None = None
    rollout_data_postprocess_path: str | None = None
    # external engines (`--rollout-external`): the job drives SGLang-protocol servers it did not start
    rollout_external: bool = False
    rollout_external_engine_addrs: list[str] | None = None
    # rewards (the rest of the reward parameters reach `RewardModel.from_spec` through `values()`)
    rm_type: str | None = None
    custom_rm_path: str | None = None
    rm_type_fallback: str | None = None
    rm_type_infer: bool = False
    custom_reward_post_process_path: str | None = None
    # batching and optimizer
    global_batch_size: int | None = None
    micro_batch_size: int = 1
    use_dynamic_batch_size: bool = False
    max_tokens_per_gpu: int | None = None
    log_probs_max_tokens_per_gpu: int | None = None  # forward-only passes' token budget (both backends)
    num_steps_per_rollout: int | None = None
    lr: float = 1e-6
    min_lr: float = 0.0
    lr_decay_style: str = "linear"
    lr_warmup_iters: int = 0
    lr_decay_iters: int | None = None
    clip_grad: float = 1.0
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    seed: int = 1234
    # algorithm
    advantage_estimator: str = "grpo"
    normalize_advantages: bool = False
    disable_grpo_std_normalization: bool = False
    disable_rewards_normalization: bool = False
    disable_compute_advantages_and_returns: bool = False  # SFT, or a custom loss that needs none
    gamma: float = 1.0
    lambd: float = 1.0
    kl_coef: float = 0.0  # KL reward shaping (rloo, reinforce_plus_plus(_baseline), ppo)
    loss_type: str = "policy_loss"
    custom_loss_function_path: str | None = None
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    eps_clip_c: float | None = None
    value_clip: float = 0.2
    entropy_coef: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    use_unbiased_kl: bool = False
    ref_update_interval: int | None = None
    calculate_per_token_loss: bool = False
    custom_pg_loss_reducer_function_path: str | None = None
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    # off-policy correction
    use_rollout_logprobs: bool = False
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    custom_tis_function_path: str | None = None
    get_mismatch_metrics: bool = False  # the TIS function's metrics without its weights (Relax's flag)
    use_opsm: bool = False
    opsm_delta: float = 1e-4
    # on-policy distillation (runtime.algos.opd): a teacher checkpoint held by the trainer (`opd-type megatron`)
    use_opd: bool = False
    opd_type: str | None = None
    opd_teacher_load: str | None = None
    opd_teacher_ckpt_step: int | None = None
    opd_kl_type: str = "reverse_kl"
    opd_kl_coef: float = 1.0
    opd_loss_coef: float = 0.0
    opd_log_prob_min_clamp: float | None = None
    opd_per_token_clip: float | None = None
    opd_is_clip: float | None = None
    opd_only_reward: bool = False
    # parameter freezing
    only_train_params_name_list: list[str] | None = None
    freeze_params_name_list: list[str] | None = None
    # critic (ppo)
    critic_load: str | None = None
    critic_save: str | None = None
    critic_lr: float | None = None
    critic_lr_warmup_iters: int = 0
    num_critic_only_steps: int = 0
    critic_train_only: bool = False
    # roles
    colocate: bool = False
    offload: bool = False
    resource: dict[str, Any] | None = None
    # modes
    fully_async: bool = False
    hybrid: bool = False  # fully-async with colocated training roles; rollout on devices of its own
    max_staleness: int = 0
    true_on_policy_mode: bool = False
    num_iters_per_train_update: int = 1
    debug_rollout_only: bool = False
    debug_train_only: bool = False
    load_debug_rollout_data: str | None = None
    load_debug_rollout_data_subsample: float | None = None
    save_debug_rollout_data: str | None = None
    save_debug_train_data: str | None = None
    # SFT
    eval_size: float | None = None
    sft_predict_interval: int | None = None
    sft_oversize_strategy: str = "keep"
    sft_oversize_custom_function_path: str | None = None
    context_parallel_size: int = 1
    # eval
    eval_interval: int | None = None
    eval_prompt_data: list[str] | None = None
    eval_config: str | None = None
    eval_input_key: str | None = None
    eval_label_key: str | None = None
    eval_tool_key: str | None = None
    n_samples_per_eval_prompt: int = 1
    eval_temperature: float | None = None
    eval_top_p: float | None = None
    eval_top_k: int | None = None
    eval_max_response_len: int | None = None
    eval_max_prompt_len: int | None = None
    eval_max_context_len: int | None = None
    eval_min_new_tokens: int | None = None
    skip_eval_before_train: bool = False
    log_passrate: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls)) - {"extra", "name"}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, name: str | None = None) -> RuntimeSpec:
        """Build from a flat mapping whose keys may use '-' or '_' (a leading '--' is ignored)."""
        known = cls.field_names()
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for raw_key, value in values.items():
            key = str(raw_key).lstrip("-").replace("-", "_")
            if key in known:
                kwargs[key] = value
            else:
                extra[key] = value
        if isinstance(kwargs.get("resource"), str):
            kwargs["resource"] = json.loads(kwargs["resource"])
        if isinstance(kwargs.get("apply_chat_template_kwargs"), str):
            kwargs["apply_chat_template_kwargs"] = json.loads(kwargs["apply_chat_template_kwargs"])
        if isinstance(kwargs.get("conversation_key_map"), str):
            kwargs["conversation_key_map"] = json.loads(kwargs["conversation_key_map"])
        if isinstance(kwargs.get("eval_prompt_data"), str):
            kwargs["eval_prompt_data"] = kwargs["eval_prompt_data"].split()
        if isinstance(kwargs.get("rollout_stop"), str):
            kwargs["rollout_stop"] = [kwargs["rollout_stop"]]
        for name in (
            "rollout_external_engine_addrs",
            "only_train_params_name_list",
            "freeze_params_name_list",
        ):
            if isinstance(kwargs.get(name), str):
                kwargs[name] = kwargs[name].split()
        kwargs = {k: v for k, v in kwargs.items() if v is not None or _nullable(k)}
        return cls(name=name, extra=extra, **kwargs)

    def values(self) -> dict[str, Any]:
        """Every parameter: the fields read here and `extra`, flat, underscore names."""
        values = {name: getattr(self, name) for name in self.field_names()}
        return {**self.extra, **values}

    # -- derived values (Relax's own derivations) -----------------------------------------------------------
    @property
    def is_sft(self) -> bool:
        return self.loss_type in ("sft", "sft_loss")

    @property
    def colocated(self) -> bool:
        """Rollout shares the trainer's devices (hybrid mode gives rollout devices of its own)."""
        return self.colocate and not self.hybrid and not self.fully_async

    @property
    def trains(self) -> bool:
        return not self.debug_rollout_only

    @property
    def generates(self) -> bool:
        """Whether rollout engines run: RL (unless training on loaded debug data), SFT predictions."""
        if self.is_sft:
            return self.sft_predict_interval is not None
        return not (self.debug_train_only or self.load_debug_rollout_data)

    @property
    def starts_engines(self) -> bool:
        """Whether the job starts rollout engines of its own (external engines are already running)."""
        return self.generates and not self.rollout_external

    @property
    def has_critic(self) -> bool:
        """PPO trains a value model (the `critic` role) next to the policy."""
        return self.advantage_estimator == "ppo" and not self.is_sft and self.trains

    @property
    def needs_reference(self) -> bool:
        """A KL term needs the reference model's log-probs: the KL loss, or KL reward shaping by the
        estimators that use `kl-coef` (the GRPO family ignores it, as in Relax)."""
        shaped = self.kl_coef != 0 and self.advantage_estimator in KL_SHAPED_ESTIMATORS
        return not self.is_sft and (self.use_kl_loss or shaped)

    @property
    def has_teacher(self) -> bool:
        """On-policy distillation runs: the trainer holds the teacher (`opd-type megatron`) and the
        advantages stage or the loss applies its KL. Off for SFT (as Relax turns it off) and without a
        trainer."""
        return self.use_opd and self.opd_type == "megatron" and not self.is_sft and self.trains

    @property
    def has_eval_data(self) -> bool:
        return bool(self.eval_prompt_data or self.eval_config or self.eval_size is not None)

    @property
    def effective_eps_clip_high(self) -> float:
        return self.eps_clip if self.eps_clip_high is None else self.eps_clip_high

    @property
    def samples_per_rollout(self) -> int:
        return int(self.rollout_batch_size or 0) * (1 if self.is_sft else self.n_samples_per_prompt)

    @property
    def effective_global_batch_size(self) -> int:
        if self.global_batch_size:
            return self.global_batch_size
        if self.num_steps_per_rollout:
            return max(1, self.samples_per_rollout // self.num_steps_per_rollout)
        return self.samples_per_rollout

    def total_rollouts(self, dataset_size: int) -> int:
        """`num-rollout`, or `num-epoch` passes over the prompt set."""
        if self.num_rollout is not None:
            return self.num_rollout
        if self.num_epoch is not None and self.rollout_batch_size:
            return max(1, self.num_epoch * dataset_size // self.rollout_batch_size)
        raise ValueError("set num-rollout or num-epoch")


def _nullable(key: str) -> bool:
    default = {f.name: f for f in dataclasses.fields(RuntimeSpec)}[key].default
    return default is None


def read_spec_file(path: str | Path) -> tuple[dict[str, Any], str | None]:
    """A `.json`/`.yaml` job file: either `{name, spec: {...}}` or a flat spec. Returns (spec, name)."""
    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a job file holds an object")
    if isinstance(data.get("spec"), dict):
        return dict(data["spec"]), data.get("name")
    return data, data.pop("name", None) if isinstance(data.get("name"), str) else None


def load_spec(raw: Mapping[str, Any], *, name: str | None = None, normalized: bool = False) -> RuntimeSpec:
    """The single entry point. A spec from the platform is already normalized (every field present with its
    default); a hand-written one goes through `jobspec.normalize` when that is available, which applies
    Relax's cross-field rules and derived defaults, else through our own defaults."""
    return load_spec_with_warnings(raw, name=name, normalized=normalized)[0]


def load_spec_with_warnings(
    raw: Mapping[str, Any], *, name: str | None = None, normalized: bool = False
) -> tuple[RuntimeSpec, list[Any]]:
    """`load_spec`, and the warnings of `jobspec`'s rules (`jobspec.SpecIssue`s; none for a spec the
    platform normalized, whose warnings were given at submission)."""
    warnings: list[Any] = []
    if not normalized:
        try:
            from jobspec import normalize  # type: ignore[attr-defined]
        except ImportError:
            log.debug("jobspec.normalize unavailable; using the runtime's own defaults")
        else:
            result = normalize(obj=dict(raw))  # raises jobspec.SpecError listing every issue
            spec_model, warnings = result.spec, list(result.warnings)
            raw = spec_model.to_dict() if hasattr(spec_model, "to_dict") else spec_model.model_dump()
    return RuntimeSpec.from_mapping(raw, name=name), warnings


def parameter_defaults() -> dict[str, Any] | None:
    """Relax's default of every parameter, from jobspec when it is importable (None otherwise)."""
    try:
        from jobspec.spec import FIELDS
    except ImportError:
        return None
    return {name: getattr(f, "default", None) for name, f in FIELDS.items()}
