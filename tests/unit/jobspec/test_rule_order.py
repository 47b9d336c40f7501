"""The order the rules run in, pinned: `jobspec.rules` lists them explicitly, and the list must stay this one.

Recorded from `jobspec/rules.py` at 6fd48c2, where the rules ran in the order the file defined them, before the
rules became a package of modules with one explicit list (issue 13). Derivations come before the checks that
read their result, so an order change can change what a spec normalizes to. A new rule goes into both lists,
at the same place; a retired code leaves both (and joins `RETIRED_RULES`).

Added since, from the runtime pipeline's own checks (issue 13): `rule.debug_train_only_needs_rollout_data`
(after the debug modes are settled), `rule.sft_predict_interval_without_debug_train_only` (beside the other
`--sft-predict-interval` checks) and `rule.rm_type_unset` (with the reward rules); from issue 15,
`rule.notify_urls_http` (after the other service rules; it reads only --notify-urls).
"""

from __future__ import annotations

import importlib
import pkgutil

import jobspec.rules
from jobspec.rules import INPUT_RULES, RULES, Rule

RECORDED_INPUT_ORDER = ("rule.loss_type_sft_loss",)

RECORDED_ORDER = (
    "rule.sft_disables_rl_terms",
    "rule.fully_async_colocate_is_hybrid",
    "rule.load_debug_rollout_data_implies_debug_train_only",
    "rule.debug_modes_exclusive",
    "rule.debug_train_only_needs_rollout_data",
    "rule.debug_rollout_only_topology",
    "rule.agentic_rollout",
    "rule.legacy_layout_resource",
    "rule.ppo_topology",
    "rule.ppo_disables_kl",
    "rule.critic_defaults",
    "rule.critic_options_need_ppo",
    "rule.offload_implies_both",
    "rule.colocate_implies_offload",
    "rule.ppo_offloads_train",
    "rule.offload_defaults",
    "rule.rollout_batch_size_required",
    "rule.num_steps_per_rollout_sets_global_batch_size",
    "rule.global_batch_size_divides_rollout",
    "rule.over_sampling_batch_size",
    "rule.num_rollout_or_num_epoch",
    "rule.num_epoch_needs_rollout_global_dataset",
    "rule.dynamic_batch_needs_max_tokens_per_gpu",
    "rule.log_probs_max_tokens_per_gpu_default",
    "rule.dynamic_batch_token_budget",
    "rule.bshd_without_dynamic_batch",
    "rule.bshd_needs_micro_batch_size",
    "rule.bshd_needs_megatron",
    "rule.micro_batch_size_ignored_with_dynamic_batch",
    "rule.balance_data_no_effect_fully_async",
    "rule.save_interval_needs_save",
    "rule.rotate_ckpt_requirements",
    "rule.max_actor_ckpt_to_keep_needs_save",
    "rule.hf_checkpoint_required",
    "rule.initial_weights",
    "rule.kl_coef_and_kl_loss_coef",
    "rule.kl_loss_coef_without_use_kl_loss",
    "rule.kl_needs_reference_model",
    "rule.ref_update_interval_needs_ref_load",
    "rule.eps_clip_high_default",
    "rule.custom_loss_needs_function_path",
    "rule.reinforce_plus_plus_needs_normalize_advantages",
    "rule.kl_coef_ignored_by_grpo_family",
    "rule.rloo_one_step_per_rollout",
    "rule.rloo_without_normalize_advantages",
    "rule.group_baseline_needs_rewards_normalization",
    "rule.fully_async_without_normalize_advantages",
    "rule.fully_async_without_dynamic_global_batch_size",
    "rule.single_sample_disables_grpo_std",
    "rule.fully_async_true_on_policy",
    "rule.fully_async_resource_roles",
    "rule.get_mismatch_metrics_needs_tis_function",
    "rule.rollout_logprobs_and_tis_exclusive",
    "rule.tis_clip_range",
    "rule.rollout_routing_replay_implies_routing_replay",
    "rule.partial_rollout_and_rollout_routing_replay",
    "rule.partial_rollout_options",
    "rule.freeze_lists_exclusive",
    "rule.use_opd_needs_opd_type",
    "rule.opd_coefficients_exclusive",
    "rule.opd_token_selection_needs_top_k",
    "rule.opd_kl_type_for_sampled_tokens",
    "rule.opd_megatron_needs_teacher_load",
    "rule.opd_clips_positive",
    "rule.opd_is_clip_needs_loss_mode",
    "rule.opd_teacher_inputs_need_sglang",
    "rule.opd_sglang_teacher_source",
    "rule.opd_teacher_routes",
    "rule.opd_teacher_load_needs_use_opd",
    "rule.fully_async_without_opd_megatron",
    "rule.rollout_max_prompt_len_default",
    "rule.prompt_len_within_context",
    "rule.context_within_position_embeddings",
    "rule.eval_prompt_data_pairs",
    "rule.eval_config_overrides_eval_prompt_data",
    "rule.sft_eval_without_eval_config",
    "rule.eval_interval_needs_eval_data",
    "rule.eval_size_only_for_sft",
    "rule.eval_size_exclusive_with_eval_prompt_data",
    "rule.eval_size_fraction_or_count",
    "rule.sft_predict_interval_requirements",
    "rule.sft_predict_interval_without_debug_train_only",
    "rule.eval_function_path_default",
    "rule.eval_input_key_default",
    "rule.eval_max_context_len_default",
    "rule.eval_reward_key_default",
    "rule.sft_needs_prompt_data",
    "rule.sft_needs_dynamic_batch_size",
    "rule.sft_balances_data",
    "rule.sft_oversize_custom_needs_function_path",
    "rule.sft_max_in_flight_steps",
    "rule.sft_async_prepack_requirements",
    "rule.sft_options_need_sft",
    "rule.max_staleness_colocate",
    "rule.enable_mtp_training_needs_mtp_num_layers",
    "rule.sft_chunked_logits_compatibility",
    "rule.prompt_data_required",
    "rule.conversation_key_map_needs_no_label_key",
    "rule.prefetch_needs_streaming_dataset",
    "rule.rm_type_unset",
    "rule.remote_rm_needs_rm_url",
    "rule.genrm_sampling_config_keys",
    "rule.genrm_options_need_model",
    "rule.rollout_external_needs_addrs",
    "rule.sticky_routing_needs_slime_router",
    "rule.slime_router_options",
    "rule.max_global_restart_needs_health_check",
    "rule.dump_details_sets_debug_paths",
    "rule.custom_config_applied_at_launch",
    "rule.notify_urls_http",
    "rule.sglang_profile_steps",
    "rule.profile_step_range",
    "rule.memory_snapshot_needs_history",
    "rule.relax_resets_megatron_defaults",
    "rule.megatron_backend_defaults",
    "rule.fp16_and_bf16_exclusive",
    "rule.bf16_grads_in_fp32",
    "rule.fp16_compat_fallbacks",
    "rule.fp16_dynamic_loss_scale_valid",
    "rule.loss_scale_options_need_dynamic_fp16",
    "rule.megatron_sequence_length_placeholders",
    "rule.megatron_rope_type",
    "rule.megatron_padded_vocab_size",
    "rule.megatron_tokenizer_from_hf_checkpoint",
    "rule.megatron_expert_tensor_parallel_default",
    "rule.megatron_recompute_activations",
    "rule.megatron_rotary_position_embeddings",
    "rule.moe_token_dispatcher_alltoall",
    "rule.sequence_parallel_needs_tp",
    "rule.recompute_options",
    "rule.attention_heads_shape",
    "rule.experts_divisible_by_expert_parallel",
    "rule.megatron_uneven_pipeline_needs_pp",
    "rule.context_parallel_needs_per_token_loss",
    "rule.megatron_save_needs_save_interval",
    "rule.megatron_min_lr_within_lr",
    "rule.optimizer_cpu_offload_needs_precision_aware_optimizer",
    "rule.overlap_param_gather_needs_overlap_grad_reduce",
    "rule.optimizer_overlap_compatibility",
    "rule.cpu_optimizer_overlap_needs_offload",
    "rule.pool_node_size",
    "rule.resource_roles",
    "rule.resource_needs_actor_and_rollout",
    "rule.actor_gpus_divisible_by_model_parallel",
    "rule.expert_parallel_fits_actor",
    "rule.actor_whole_nodes",
    "rule.tensor_parallel_within_node",
    "rule.rollout_engines_fit",
    "rule.colocate_rollout_spans_actor",
    "rule.genrm_layout",
    "rule.opd_managed_teacher_colocate_layout",
    "rule.global_batch_size_divisible_by_micro_batches",
)


def test_input_rules_run_in_the_recorded_order() -> None:
    assert [r.code for r in INPUT_RULES] == list(RECORDED_INPUT_ORDER)


def test_rules_run_in_the_recorded_order() -> None:
    assert [r.code for r in RULES] == list(RECORDED_ORDER)


def test_every_rule_is_listed_once() -> None:
    listed = INPUT_RULES + RULES
    codes = [r.code for r in listed]
    assert len(codes) == len(set(codes)), sorted({c for c in codes if codes.count(c) > 1})
    assert len({id(r.fn) for r in listed}) == len(listed)


def test_every_rule_written_is_listed_once_under_its_code() -> None:
    """A rule written in a module but left out of the list would never run; one listed twice would run twice."""
    written: list[Rule] = []
    for info in pkgutil.iter_modules(jobspec.rules.__path__):
        module = importlib.import_module(f"jobspec.rules.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, Rule):
                assert name == value.code.removeprefix("rule."), (module.__name__, name, value.code)
                written.append(value)
    listed = INPUT_RULES + RULES
    assert sorted(id(r) for r in written) == sorted(id(r) for r in listed)
    assert len(written) == len(RECORDED_INPUT_ORDER) + len(RECORDED_ORDER)
