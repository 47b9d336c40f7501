"""The cross-field rules and derived defaults of the Relax configuration, and the one list of their order.

The rules live in modules by concern (`modes`, `topology`, `algorithms`, `batches`, ...; `context` defines
`Rule`, `RuleContext` and `@rule`). They run in the order of `INPUT_RULES` (raw values, before type checks)
and `RULES` below, and nowhere else: a rule not listed here never runs. The order follows Relax's own
start-up checks (`slime_validate_args` in relax/utils/arguments.py) where the reference is silent about
order: derivations come before the checks that read their result.

To add a rule: write it with `@rule(code, flags..., summary=...)` (or, for one of the shared checks, one call
of `context`'s `requires`, `value_needs`, `options_need`, `exclusive`, `implies` or `defaults_to`) in the
module of its concern, under the name its code gives (``rule.x_needs_y`` -> ``x_needs_y``), list it below
after the rules whose derived values it reads, record it in tests/unit/jobspec/test_rule_order.py, and add a
broken and a satisfied case to tests/unit/jobspec/test_rules.py (a test fails for any listed rule without both).
"""

from __future__ import annotations

from typing import Any

from jobspec.rules import (
    algorithms,
    batches,
    checkpoints,
    evaluation,
    megatron_checks,
    megatron_defaults,
    modes,
    offpolicy,
    opd,
    profiling,
    services,
    sft,
    topology,
)
from jobspec.rules.context import Rule, RuleContext, rule

__all__ = [
    "Rule",
    "RuleContext",
    "RULES",
    "INPUT_RULES",
    "PLATFORM_DEVIATIONS",
    "RETIRED_RULES",
    "deviations",
    "run_input_rules",
    "run_rules",
    "rule",
]

#: The rules that read the raw values, before type checks (deprecated values), in order.
INPUT_RULES: tuple[Rule, ...] = (modes.loss_type_sft_loss,)

#: Every other rule, in the order it runs.
RULES: tuple[Rule, ...] = (
    # Mode resolution
    modes.sft_disables_rl_terms,
    modes.fully_async_colocate_is_hybrid,
    modes.load_debug_rollout_data_implies_debug_train_only,
    modes.debug_modes_exclusive,
    modes.debug_train_only_needs_rollout_data,
    modes.debug_rollout_only_topology,
    modes.agentic_rollout,
    # Relax's legacy per-role GPU flags (before every rule that reads --resource)
    topology.legacy_layout_resource,
    # PPO (before KL and offload rules, which read what it changes)
    algorithms.ppo_topology,
    algorithms.ppo_disables_kl,
    algorithms.critic_defaults,
    algorithms.critic_options_need_ppo,
    # Offloading
    topology.offload_implies_both,
    topology.colocate_implies_offload,
    topology.ppo_offloads_train,
    topology.offload_defaults,
    # Batch sizes
    batches.rollout_batch_size_required,
    batches.num_steps_per_rollout_sets_global_batch_size,
    batches.global_batch_size_divides_rollout,
    batches.over_sampling_batch_size,
    batches.num_rollout_or_num_epoch,
    batches.num_epoch_needs_rollout_global_dataset,
    batches.dynamic_batch_needs_max_tokens_per_gpu,
    batches.log_probs_max_tokens_per_gpu_default,
    batches.dynamic_batch_token_budget,
    batches.bshd_without_dynamic_batch,
    batches.bshd_needs_micro_batch_size,
    batches.bshd_needs_megatron,
    batches.micro_batch_size_ignored_with_dynamic_batch,
    batches.balance_data_no_effect_fully_async,
    # Checkpoints
    checkpoints.save_interval_needs_save,
    checkpoints.rotate_ckpt_requirements,
    checkpoints.max_actor_ckpt_to_keep_needs_save,
    checkpoints.hf_checkpoint_required,
    checkpoints.initial_weights,
    # KL and reference model
    algorithms.kl_coef_and_kl_loss_coef,
    algorithms.kl_loss_coef_without_use_kl_loss,
    algorithms.kl_needs_reference_model,
    algorithms.ref_update_interval_needs_ref_load,
    algorithms.eps_clip_high_default,
    # Algorithm and loss
    algorithms.custom_loss_needs_function_path,
    algorithms.reinforce_plus_plus_needs_normalize_advantages,
    algorithms.kl_coef_ignored_by_grpo_family,
    algorithms.rloo_one_step_per_rollout,
    algorithms.rloo_without_normalize_advantages,
    algorithms.group_baseline_needs_rewards_normalization,
    algorithms.fully_async_without_normalize_advantages,
    algorithms.fully_async_without_dynamic_global_batch_size,
    algorithms.single_sample_disables_grpo_std,
    algorithms.fully_async_true_on_policy,
    algorithms.fully_async_resource_roles,
    # Off-policy correction, routing replay, partial rollout
    offpolicy.get_mismatch_metrics_needs_tis_function,
    offpolicy.rollout_logprobs_and_tis_exclusive,
    offpolicy.tis_clip_range,
    offpolicy.rollout_routing_replay_implies_routing_replay,
    offpolicy.partial_rollout_and_rollout_routing_replay,
    offpolicy.partial_rollout_options,
    offpolicy.freeze_lists_exclusive,
    # OPD
    opd.use_opd_needs_opd_type,
    opd.opd_coefficients_exclusive,
    opd.opd_token_selection_needs_top_k,
    opd.opd_kl_type_for_sampled_tokens,
    opd.opd_megatron_needs_teacher_load,
    opd.opd_clips_positive,
    opd.opd_is_clip_needs_loss_mode,
    opd.opd_teacher_inputs_need_sglang,
    opd.opd_sglang_teacher_source,
    opd.opd_teacher_routes,
    opd.opd_teacher_load_needs_use_opd,
    opd.fully_async_without_opd_megatron,
    # Prompt / context lengths
    batches.rollout_max_prompt_len_default,
    batches.prompt_len_within_context,
    batches.context_within_position_embeddings,
    # Evaluation
    evaluation.eval_prompt_data_pairs,
    evaluation.eval_config_overrides_eval_prompt_data,
    evaluation.sft_eval_without_eval_config,
    evaluation.eval_interval_needs_eval_data,
    evaluation.eval_size_only_for_sft,
    evaluation.eval_size_exclusive_with_eval_prompt_data,
    evaluation.eval_size_fraction_or_count,
    evaluation.sft_predict_interval_requirements,
    evaluation.sft_predict_interval_without_debug_train_only,
    evaluation.eval_function_path_default,
    evaluation.eval_input_key_default,
    evaluation.eval_max_context_len_default,
    evaluation.eval_reward_key_default,
    # SFT
    sft.sft_needs_prompt_data,
    sft.sft_needs_dynamic_batch_size,
    sft.sft_balances_data,
    sft.sft_oversize_custom_needs_function_path,
    sft.sft_max_in_flight_steps,
    sft.sft_async_prepack_requirements,
    sft.sft_options_need_sft,
    sft.max_staleness_colocate,
    sft.enable_mtp_training_needs_mtp_num_layers,
    sft.sft_chunked_logits_compatibility,
    # Data, rewards, GenRM, rollout services
    services.prompt_data_required,
    services.conversation_key_map_needs_no_label_key,
    services.prefetch_needs_streaming_dataset,
    services.rm_type_unset,
    services.remote_rm_needs_rm_url,
    services.genrm_sampling_config_keys,
    services.genrm_options_need_model,
    services.rollout_external_needs_addrs,
    services.sticky_routing_needs_slime_router,
    services.slime_router_options,
    services.max_global_restart_needs_health_check,
    services.dump_details_sets_debug_paths,
    services.custom_config_applied_at_launch,
    services.notify_urls_http,
    # Profiling
    profiling.sglang_profile_steps,
    profiling.profile_step_range,
    profiling.memory_snapshot_needs_history,
    # The megatron backend: Relax's own defaults (`_set_default_megatron_args`, for every job of that backend)
    megatron_defaults.relax_resets_megatron_defaults,
    megatron_defaults.megatron_backend_defaults,
    megatron_defaults.fp16_and_bf16_exclusive,
    megatron_defaults.bf16_grads_in_fp32,
    megatron_defaults.fp16_compat_fallbacks,
    megatron_defaults.fp16_dynamic_loss_scale_valid,
    megatron_defaults.loss_scale_options_need_dynamic_fp16,
    megatron_defaults.megatron_sequence_length_placeholders,
    megatron_defaults.megatron_rope_type,
    megatron_defaults.megatron_padded_vocab_size,
    megatron_defaults.megatron_tokenizer_from_hf_checkpoint,
    # The megatron backend: Megatron-LM's `validate_args` and Relax's additions (not with --debug-rollout-only)
    megatron_checks.megatron_expert_tensor_parallel_default,
    megatron_checks.megatron_recompute_activations,
    megatron_checks.megatron_rotary_position_embeddings,
    megatron_checks.moe_token_dispatcher_alltoall,
    megatron_checks.sequence_parallel_needs_tp,
    megatron_checks.recompute_options,
    megatron_checks.attention_heads_shape,
    megatron_checks.experts_divisible_by_expert_parallel,
    megatron_checks.megatron_uneven_pipeline_needs_pp,
    megatron_checks.context_parallel_needs_per_token_loss,
    megatron_checks.megatron_save_needs_save_interval,
    megatron_checks.megatron_min_lr_within_lr,
    megatron_checks.optimizer_cpu_offload_needs_precision_aware_optimizer,
    megatron_checks.overlap_param_gather_needs_overlap_grad_reduce,
    megatron_checks.optimizer_overlap_compatibility,
    megatron_checks.cpu_optimizer_overlap_needs_offload,
    # Topology (GPU layout); `jobspec.demand` turns a layout that passes these into a ResourceDemand
    topology.pool_node_size,
    topology.resource_roles,
    topology.resource_needs_actor_and_rollout,
    topology.actor_gpus_divisible_by_model_parallel,
    topology.expert_parallel_fits_actor,
    topology.actor_whole_nodes,
    topology.tensor_parallel_within_node,
    topology.rollout_engines_fit,
    topology.colocate_rollout_spans_actor,
    topology.genrm_layout,
    topology.opd_managed_teacher_colocate_layout,
    topology.global_batch_size_divisible_by_micro_batches,
)


def _unique_codes(rules: tuple[Rule, ...]) -> None:
    seen: set[str] = set()
    for r in rules:
        if r.code in seen:
            raise ValueError(f"duplicate rule code {r.code}")
        seen.add(r.code)


_unique_codes(INPUT_RULES + RULES)


#: Deviations from Relax's code that are not one rule's check: (code, flags, reason).
PLATFORM_DEVIATIONS: list[tuple[str, tuple[str, ...], str]] = [
    (
        "rule.torch_backend_is_platform_extension",
        ("train-backend",),
        "--train-backend torch is a Relax Platform backend: Relax's own parser accepts megatron only. It is "
        "the backend this platform runs; the resolved argv keeps --train-backend torch, so it runs here, not "
        "under Relax's launcher.",
    ),
]

#: Codes that are no longer reported, and why (codes are an API: a retired code is never reused).
RETIRED_RULES: dict[str, str] = {
    "rule.ppo_needs_rollout_logprobs": "not a rule of Relax main, whose PPO scripts run without "
    "--use-rollout-logprobs. Nor a limit of this platform: both backends recompute the old-policy log-probs "
    "with the trainer before every update (the ratio's pi_old unless --use-rollout-logprobs picks the "
    "engine's), so PPO runs with or without the flag.",
    "rule.torch_backend_is_platform_extension": "the note is listed among the deviations "
    "(PLATFORM_DEVIATIONS) instead of being a warning on every job that selects the torch backend.",
    "rule.reinforce_plus_plus_baseline_without_kl_coef": "not a limit any more: reinforce_plus_plus_baseline "
    "applies --kl-coef as Relax does (A_t = reward - group mean - kl_coef * KL_t, then whitened), so the "
    "setting is accepted (issue 17).",
}


def deviations() -> list[tuple[str, tuple[str, ...], str]]:
    """Every deliberate deviation from Relax's code: (code, flags, reason), rules first in registry order.

    `python -m jobspec.docs` lists them in docs/reference/parameters.md.
    """
    out = [(r.code, r.fields, r.deviation) for r in INPUT_RULES + RULES if r.deviation]
    return out + list(PLATFORM_DEVIATIONS)  # type: ignore[return-value]


def _run(registry: tuple[Rule, ...], ctx: RuleContext) -> RuleContext:
    for r in registry:
        ctx._rule = r
        r.fn(ctx)
    ctx._rule = None
    return ctx


def run_input_rules(values: dict[str, Any], explicit: set[str]) -> RuleContext:
    return _run(INPUT_RULES, RuleContext(values, explicit))


def run_rules(
    values: dict[str, Any], explicit: set[str], max_gpus_per_node: int | None = None
) -> RuleContext:
    return _run(RULES, RuleContext(values, explicit, max_gpus_per_node))
