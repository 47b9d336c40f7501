"""Every rule in jobspec.rules, broken and satisfied (one table; a rule missing from it fails the suite)."""

from __future__ import annotations

from typing import Any

import pytest

from jobspec import SpecError, normalize
from jobspec.rules import INPUT_RULES, RETIRED_RULES, RULES, deviations, rule

DROP = object()

BASE: dict[str, Any] = {
    "hf-checkpoint": "/models/qwen",
    "ref-load": "/ckpt/ref",
    "prompt-data": "/data/train.jsonl",
    "rm-type": "math",
    "rollout-batch-size": 8,
    "n-samples-per-prompt": 4,
    "num-rollout": 10,
    "colocate": True,
    "resource": {"actor": [1, 2], "rollout": [1, 2]},
}
SFT = {
    "loss-type": "sft",
    "use-dynamic-batch-size": True,
    "max-tokens-per-gpu": 4096,
    "colocate": DROP,
    "resource": {"actor": [1, 2], "sft": [1, 0]},
}
PPO = {
    "advantage-estimator": "ppo",
    "use-rollout-logprobs": True,
    "resource": {"actor": [1, 2], "critic": [1, 2], "rollout": [1, 4], "advantages": [1, 0]},
}
DYN = {"use-dynamic-batch-size": True, "max-tokens-per-gpu": 4096}
ASYNC = {"colocate": DROP, "fully-async": True}
GENRM = {
    "genrm-model-path": "/models/genrm",
    "resource": {"actor": [1, 2], "rollout": [1, 2], "genrm": [1, 2]},
}
OPD_SGLANG = {"use-opd": True, "opd-type": "sglang", "opd-teacher-url": "http://teacher:30010/generate"}
OPD_MANAGED = {
    "use-opd": True,
    "opd-type": "sglang",
    "teacher-hf-checkpoint": "/models/teacher",
    "resource": {"actor": [1, 4], "rollout": [1, 2], "teacher": [1, 2]},
}
TORCH = {"train-backend": "torch"}
OPD_MEGATRON = {"use-opd": True, "opd-type": "megatron", "opd-teacher-load": "/ckpt/teacher"}
EVAL = {"eval-prompt-data": ["aime", "/data/aime.jsonl"]}
PREDICT = {  # SFT predictions every 10 steps, on rollout engines of their own
    "sft-predict-interval": 10,
    "save": "/out",
    "save-interval": 10,
    "eval-size": 0.05,
    "resource": {"actor": [1, 2], "rollout": [1, 1], "sft": [1, 0]},
}
MAX = "__max_gpus_per_node"


def spec(**layers: Any) -> dict[str, Any]:
    return layers  # readability helper for the table


def run(overrides: dict[str, Any]) -> tuple[Any, list]:
    """normalize BASE + overrides; returns (result or None, issues)."""
    obj = dict(BASE)
    max_gpus = overrides.get(MAX)
    for key, value in overrides.items():
        if key == MAX:
            continue
        if value is DROP:
            obj.pop(key, None)
        else:
            obj[key] = value
    try:
        res = normalize(obj=obj, max_gpus_per_node=max_gpus)
    except SpecError as err:
        return None, err.issues
    return res, res.warnings


def merge(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in parts:
        out.update(p)
    return out


# (code, broken overrides, expectation, satisfied overrides)
# expectation: "error" | "warning" | ("derived", field, value)
CASES: list[tuple[str, dict, Any, dict]] = [
    ("rule.loss_type_sft_loss", merge(SFT, {"loss-type": "sft_loss"}), "warning", SFT),
    ("rule.loss_type_sft_loss", merge(SFT, {"loss-type": "sft_loss"}), ("derived", "loss_type", "sft"), SFT),
    ("rule.sft_disables_rl_terms", merge(SFT, {"use-kl-loss": True, "kl-loss-coef": 0.1}), "warning", SFT),
    ("rule.sft_disables_rl_terms", SFT, ("derived", "disable_compute_advantages_and_returns", True), {}),
    ("rule.sft_disables_rl_terms", merge(SFT, OPD_MEGATRON), ("derived", "use_opd", False), OPD_MEGATRON),
    ("rule.fully_async_colocate_is_hybrid", {"fully-async": True}, "warning", {"hybrid": True}),
    ("rule.fully_async_colocate_is_hybrid", {"fully-async": True}, ("derived", "hybrid", True), {}),
    (
        "rule.load_debug_rollout_data_implies_debug_train_only",
        {"load-debug-rollout-data": "/dbg/{rollout_id}.pt"},
        ("derived", "debug_train_only", True),
        {"debug-train-only": True, "load-debug-rollout-data": "/dbg/{rollout_id}.pt"},
    ),
    (
        "rule.debug_modes_exclusive",
        {"debug-rollout-only": True, "debug-train-only": True},
        "error",
        {"debug-train-only": True, "load-debug-rollout-data": "/dbg/{rollout_id}.pt"},
    ),
    (
        "rule.debug_train_only_needs_rollout_data",
        {"debug-train-only": True},
        "error",
        {"debug-train-only": True, "load-debug-rollout-data": "/dbg/{rollout_id}.pt"},
    ),
    (
        "rule.debug_train_only_needs_rollout_data",
        {"debug-train-only": True},
        "error",
        merge(SFT, {"debug-train-only": True}),
    ),
    (
        "rule.debug_modes_exclusive",
        {"debug-rollout-only": True, "load-debug-rollout-data": "/d"},
        "error",
        {"load-debug-rollout-data": "/d"},
    ),
    (
        "rule.debug_rollout_only_topology",
        {"debug-rollout-only": True},
        "warning",
        {"debug-rollout-only": True, "colocate": DROP},
    ),
    ("rule.debug_rollout_only_topology", {"debug-rollout-only": True}, ("derived", "colocate", False), {}),
    (
        "rule.legacy_layout_resource",
        {"resource": DROP, "colocate": True, "actor-num-gpus-per-node": 2, "rollout-num-gpus": 8},
        ("derived", "resource", {"actor": [1, 2], "rollout": [1, 2]}),
        {"actor-num-gpus-per-node": DROP, "rollout-num-gpus": DROP},
    ),
    ("rule.ppo_topology", {"advantage-estimator": "ppo", "use-rollout-logprobs": True}, "error", PPO),
    ("rule.ppo_topology", merge(PPO, {"colocate": DROP}), "error", PPO),
    ("rule.ppo_disables_kl", merge(PPO, {"kl-coef": 0.1}), "warning", PPO),
    ("rule.ppo_disables_kl", merge(PPO, {"kl-coef": 0.1}), ("derived", "kl_coef", 0.0), PPO),
    ("rule.critic_defaults", merge(PPO, {"lr": 2e-6}), ("derived", "critic_lr", 2e-6), {}),
    (
        "rule.critic_options_need_ppo",
        {"num-critic-only-steps": 2},
        "warning",
        merge(PPO, {"num-critic-only-steps": 2}),
    ),
    ("rule.offload_implies_both", {"offload": True, "offload-train": False}, "warning", {"offload": True}),
    (
        "rule.offload_implies_both",
        {"offload": True, "offload-train": False},
        ("derived", "offload_train", True),
        {"offload-train": False, "colocate": DROP},
    ),
    (
        "rule.offload_implies_both",
        {"offload": True, "colocate": DROP},
        ("derived", "offload_train", True),
        {"colocate": DROP},
    ),
    ("rule.colocate_implies_offload", {"offload-rollout": False}, "warning", {}),
    (
        "rule.colocate_implies_offload",
        {},
        ("derived", "offload_rollout", True),
        {"colocate": DROP, "offload-rollout": False, "offload-train": False},
    ),
    (
        "rule.ppo_offloads_train",
        merge(PPO, {"offload-train": False}),
        ("derived", "offload_train", True),
        {"offload-train": False},
    ),
    (
        "rule.offload_defaults",
        {"colocate": DROP},
        ("derived", "offload_train", False),
        {"colocate": DROP, "offload-train": False, "offload-rollout": False},
    ),
    (
        "rule.rollout_batch_size_required",
        {"rollout-batch-size": DROP},
        "error",
        {"rollout-batch-size": DROP, "global-batch-size": 32},
    ),
    (
        "rule.rollout_batch_size_required",
        {"rollout-batch-size": DROP, "global-batch-size": 30},
        "error",
        {"rollout-batch-size": DROP, "global-batch-size": 32},
    ),
    (
        "rule.rollout_batch_size_required",
        {"rollout-batch-size": DROP, "global-batch-size": 32},
        ("derived", "rollout_batch_size", 8),
        {},
    ),
    (
        "rule.num_steps_per_rollout_sets_global_batch_size",
        {"num-steps-per-rollout": 3},
        "error",
        {"num-steps-per-rollout": 2},
    ),
    (
        "rule.num_steps_per_rollout_sets_global_batch_size",
        {"num-steps-per-rollout": 2, "global-batch-size": 8},
        "error",
        {"num-steps-per-rollout": 2, "global-batch-size": 16},
    ),
    (
        "rule.num_steps_per_rollout_sets_global_batch_size",
        {"num-steps-per-rollout": 2},
        ("derived", "global_batch_size", 16),
        {"num-steps-per-rollout": 2, "global-batch-size": 16},
    ),
    ("rule.global_batch_size_divides_rollout", {"global-batch-size": 12}, "error", {"global-batch-size": 16}),
    (
        "rule.over_sampling_batch_size",
        {"over-sampling-batch-size": 4},
        "error",
        {"over-sampling-batch-size": 16, "partial-rollout": True},
    ),
    (
        "rule.over_sampling_batch_size",
        {"over-sampling-batch-size": 16},
        "warning",
        {"over-sampling-batch-size": 16, "partial-rollout": True},
    ),
    (
        "rule.over_sampling_batch_size",
        {},
        ("derived", "over_sampling_batch_size", 8),
        {"over-sampling-batch-size": 8},
    ),
    ("rule.num_rollout_or_num_epoch", {"num-rollout": DROP}, "error", {"num-rollout": DROP, "num-epoch": 2}),
    ("rule.num_rollout_or_num_epoch", {"num-epoch": 2}, "warning", {"num-rollout": DROP, "num-epoch": 2}),
    (
        "rule.num_epoch_needs_rollout_global_dataset",
        {"num-rollout": DROP, "num-epoch": 2, "disable-rollout-global-dataset": True},
        "error",
        {"num-rollout": DROP, "num-epoch": 2},
    ),
    ("rule.dynamic_batch_needs_max_tokens_per_gpu", {"use-dynamic-batch-size": True}, "error", DYN),
    (
        "rule.log_probs_max_tokens_per_gpu_default",
        {"max-tokens-per-gpu": 4096},
        ("derived", "log_probs_max_tokens_per_gpu", 4096),
        {"max-tokens-per-gpu": 4096, "log-probs-max-tokens-per-gpu": 2048},
    ),
    (
        "rule.dynamic_batch_token_budget",
        merge(DYN, {"max-tokens-per-gpu": 1024, "rollout-max-context-len": 4096}),
        "error",
        merge(DYN, {"rollout-max-context-len": 4096}),
    ),
    (
        "rule.bshd_without_dynamic_batch",
        merge(DYN, {"qkv-format": "bshd", "micro-batch-size": 1}),
        "error",
        {"qkv-format": "bshd", "micro-batch-size": 2},
    ),
    (
        "rule.bshd_needs_micro_batch_size",
        {"qkv-format": "bshd"},
        "warning",
        {"qkv-format": "bshd", "micro-batch-size": 1},
    ),
    (
        "rule.bshd_needs_megatron",
        {"qkv-format": "bshd", "micro-batch-size": 1, "train-backend": "torch"},
        "error",
        {"qkv-format": "bshd", "micro-batch-size": 1},
    ),
    ("rule.micro_batch_size_ignored_with_dynamic_batch", merge(DYN, {"micro-batch-size": 4}), "warning", DYN),
    (
        "rule.balance_data_no_effect_fully_async",
        merge(ASYNC, DYN, {"global-batch-size": 32, "balance-data": True}),
        "warning",
        merge(ASYNC, DYN, {"global-batch-size": 32}),
    ),
    ("rule.save_interval_needs_save", {"save-interval": 5}, "error", {"save-interval": 5, "save": "/out"}),
    (
        "rule.rotate_ckpt_requirements",
        {"rotate-ckpt": True, "save": "/out"},
        "error",
        {"rotate-ckpt": True, "save": "/out", "save-interval": 5, "async-save": True},
    ),
    (
        "rule.max_actor_ckpt_to_keep_needs_save",
        {"max-actor-ckpt-to-keep": 3},
        "warning",
        {"max-actor-ckpt-to-keep": 3, "save": "/out", "save-interval": 5},
    ),
    ("rule.hf_checkpoint_required", {"hf-checkpoint": DROP}, "error", {}),
    (
        "rule.initial_weights",
        {"ref-load": DROP},
        "warning",
        {"ref-load": DROP, "megatron-to-hf-mode": "bridge"},
    ),
    (
        "rule.kl_coef_and_kl_loss_coef",
        {"kl-coef": 0.1, "use-kl-loss": True, "kl-loss-coef": 0.1},
        "error",
        {"use-kl-loss": True, "kl-loss-coef": 0.1},
    ),
    (
        "rule.kl_loss_coef_without_use_kl_loss",
        {"kl-loss-coef": 0.1},
        "warning",
        {"use-kl-loss": True, "kl-loss-coef": 0.1},
    ),
    (
        "rule.kl_loss_coef_without_use_kl_loss",
        {"use-kl-loss": True},
        "warning",
        {"use-kl-loss": True, "kl-loss-coef": 0.01},
    ),
    (
        "rule.kl_needs_reference_model",
        {"ref-load": DROP, "use-kl-loss": True, "kl-loss-coef": 0.1},
        "error",
        {"use-kl-loss": True, "kl-loss-coef": 0.1},
    ),
    ("rule.kl_needs_reference_model", {"ref-load": DROP, "kl-coef": 0.05}, "error", {"kl-coef": 0.05}),
    (
        "rule.ref_update_interval_needs_ref_load",
        {"ref-load": DROP, "ref-update-interval": 10},
        "warning",
        {"ref-update-interval": 10},
    ),
    (
        "rule.eps_clip_high_default",
        {"eps-clip": 0.1},
        ("derived", "eps_clip_high", 0.1),
        {"eps-clip-high": 0.28},
    ),
    (
        "rule.custom_loss_needs_function_path",
        {"loss-type": "custom_loss"},
        "error",
        {"loss-type": "custom_loss", "custom-loss-function-path": "pkg.loss"},
    ),
    (
        "rule.custom_loss_needs_function_path",
        {"custom-loss-function-path": "pkg.loss"},
        "warning",
        {"loss-type": "custom_loss", "custom-loss-function-path": "pkg.loss"},
    ),
    (
        "rule.reinforce_plus_plus_needs_normalize_advantages",
        {"advantage-estimator": "reinforce_plus_plus"},
        "error",
        {"advantage-estimator": "reinforce_plus_plus", "normalize-advantages": True},
    ),
    ("rule.kl_coef_ignored_by_grpo_family", {"kl-coef": 0.1}, "warning", {"use-kl-loss": True}),
    (
        "rule.kl_coef_ignored_by_grpo_family",
        {"advantage-estimator": "sapo", "kl-coef": 0.1},
        "warning",
        {"advantage-estimator": "rloo", "kl-coef": 0.1, "global-batch-size": 32},
    ),
    (
        "rule.rloo_one_step_per_rollout",
        {"advantage-estimator": "rloo", "global-batch-size": 16},
        "error",
        {"advantage-estimator": "rloo", "global-batch-size": 32},
    ),
    (
        "rule.rloo_one_step_per_rollout",
        {"advantage-estimator": "rloo", "num-steps-per-rollout": 2},
        "error",
        {"advantage-estimator": "rloo", "num-steps-per-rollout": 1},
    ),
    (
        "rule.rloo_one_step_per_rollout",
        {"advantage-estimator": "rloo", "n-samples-per-prompt": 1, "global-batch-size": 8},
        "error",
        {"advantage-estimator": "rloo", "n-samples-per-prompt": 2, "global-batch-size": 16},
    ),
    (
        "rule.rloo_without_normalize_advantages",
        {"advantage-estimator": "rloo", "normalize-advantages": True},
        "error",
        {"advantage-estimator": "rloo"},
    ),
    (
        "rule.group_baseline_needs_rewards_normalization",
        {"advantage-estimator": "rloo", "disable-rewards-normalization": True},
        "error",
        {"advantage-estimator": "rloo"},
    ),
    (
        # reinforce_plus_plus_baseline takes it, as Relax does (issue 17): only rloo refuses it
        "rule.group_baseline_needs_rewards_normalization",
        {"advantage-estimator": "rloo", "disable-rewards-normalization": True},
        "error",
        {
            "advantage-estimator": "reinforce_plus_plus_baseline",
            "normalize-advantages": True,
            "disable-rewards-normalization": True,
        },
    ),
    (
        "rule.fully_async_without_normalize_advantages",
        {"hybrid": True, "normalize-advantages": True},
        "error",
        {"hybrid": True},
    ),
    (
        "rule.fully_async_without_dynamic_global_batch_size",
        {"hybrid": True, "use-dynamic-global-batch-size": True},
        "error",
        {"use-dynamic-global-batch-size": True},
    ),
    (
        "rule.single_sample_disables_grpo_std",
        {"n-samples-per-prompt": 1},
        ("derived", "disable_grpo_std_normalization", True),
        {},
    ),
    (
        "rule.fully_async_true_on_policy",
        {"hybrid": True, "global-batch-size": 32},
        ("derived", "true_on_policy_mode", True),
        {"hybrid": True, "global-batch-size": 16},
    ),
    (
        "rule.fully_async_resource_roles",
        merge(ASYNC, {"global-batch-size": 16}),
        "error",
        merge(
            ASYNC,
            {"global-batch-size": 16, "resource": {"actor": [1, 2], "rollout": [1, 2], "actor_fwd": [1, 1]}},
        ),
    ),
    (
        "rule.fully_async_resource_roles",
        merge(ASYNC, {"global-batch-size": 32, "use-kl-loss": True, "kl-loss-coef": 0.1}),
        "error",
        merge(
            ASYNC,
            {
                "global-batch-size": 32,
                "use-kl-loss": True,
                "kl-loss-coef": 0.1,
                "resource": {"actor": [1, 2], "rollout": [1, 2], "reference": [1, 1]},
            },
        ),
    ),
    (
        "rule.get_mismatch_metrics_needs_tis_function",
        {"get-mismatch-metrics": True},
        "error",
        {"get-mismatch-metrics": True, "custom-tis-function-path": "pkg.tis"},
    ),
    (
        "rule.rollout_logprobs_and_tis_exclusive",
        {"use-rollout-logprobs": True, "use-tis": True},
        "error",
        {"use-tis": True},
    ),
    ("rule.tis_clip_range", {"tis-clip-low": 3.0}, "warning", {"tis-clip-low": 0.5}),
    (
        "rule.rollout_routing_replay_implies_routing_replay",
        {"use-rollout-routing-replay": True},
        ("derived", "use_routing_replay", True),
        {"use-routing-replay": True},
    ),
    (
        "rule.partial_rollout_and_rollout_routing_replay",
        {"partial-rollout": True, "use-rollout-routing-replay": True},
        "error",
        {"partial-rollout": True},
    ),
    (
        "rule.partial_rollout_options",
        {"mask-offpolicy-in-partial-rollout": True},
        "warning",
        {"mask-offpolicy-in-partial-rollout": True, "partial-rollout": True},
    ),
    (
        "rule.freeze_lists_exclusive",
        {"only-train-params-name-list": ["experts"], "freeze-params-name-list": ["embedding"]},
        "error",
        {"freeze-params-name-list": ["embedding", "output_layer"]},
    ),
    ("rule.use_opd_needs_opd_type", {"use-opd": True}, "error", OPD_SGLANG),
    ("rule.use_opd_needs_opd_type", {"opd-type": "sglang"}, "warning", OPD_SGLANG),
    (
        "rule.opd_coefficients_exclusive",
        merge(OPD_SGLANG, {"opd-loss-coef": 0.5}),
        "error",
        merge(OPD_SGLANG, {"opd-kl-coef": 0.0, "opd-loss-coef": 0.5}),
    ),
    (
        "rule.opd_coefficients_exclusive",
        merge(OPD_SGLANG, {"opd-kl-coef": 0.0}),
        "error",
        OPD_SGLANG,
    ),
    (
        "rule.opd_token_selection_needs_top_k",
        merge(OPD_SGLANG, {"opd-token-selection": "teacher_topk", "opd-kl-type": "forward_kl"}),
        "error",
        merge(
            OPD_SGLANG,
            {"opd-token-selection": "teacher_topk", "opd-kl-type": "forward_kl", "opd-log-prob-top-k": 20},
        ),
    ),
    (
        "rule.opd_kl_type_for_sampled_tokens",
        merge(OPD_SGLANG, {"opd-kl-type": "jsd"}),
        "error",
        merge(OPD_SGLANG, {"opd-kl-type": "low_var_kl"}),
    ),
    (
        "rule.opd_megatron_needs_teacher_load",
        {"use-opd": True, "opd-type": "megatron"},
        "error",
        OPD_MEGATRON,
    ),
    ("rule.opd_clips_positive", merge(OPD_MEGATRON, {"opd-per-token-clip": 0.0}), "error", OPD_MEGATRON),
    (
        "rule.opd_clips_positive",
        merge(OPD_MEGATRON, {"opd-kl-coef": 0.0, "opd-loss-coef": 1.0, "opd-is-clip": -1.0}),
        "error",
        merge(OPD_MEGATRON, {"opd-kl-coef": 0.0, "opd-loss-coef": 1.0, "opd-is-clip": 2.0}),
    ),
    (
        "rule.opd_is_clip_needs_loss_mode",
        merge(OPD_MEGATRON, {"opd-is-clip": 2.0}),
        "warning",
        merge(OPD_MEGATRON, {"opd-kl-coef": 0.0, "opd-loss-coef": 1.0, "opd-is-clip": 2.0}),
    ),
    (
        "rule.opd_teacher_inputs_need_sglang",
        merge(OPD_MEGATRON, {"opd-teacher-prompt-key": "teacher_prompt"}),
        "error",
        merge(OPD_SGLANG, {"opd-teacher-prompt-key": "teacher_prompt"}),
    ),
    ("rule.opd_sglang_teacher_source", {"use-opd": True, "opd-type": "sglang"}, "error", OPD_SGLANG),
    ("rule.opd_sglang_teacher_source", merge(OPD_SGLANG, {"opd-teacher-load": "/t"}), "error", OPD_SGLANG),
    (
        "rule.opd_sglang_teacher_source",
        merge(OPD_MANAGED, {"resource": {"actor": [1, 4], "rollout": [1, 4]}}),
        "error",
        OPD_MANAGED,
    ),
    (
        "rule.opd_teacher_routes",
        merge(OPD_MANAGED, {"teacher-hf-checkpoint": DROP, "opd-teacher-routes": "[]"}),
        "error",
        merge(OPD_MANAGED, {"teacher-hf-checkpoint": DROP, "opd-teacher-routes": '{"gsm8k": "/models/t"}'}),
    ),
    (
        "rule.opd_teacher_routes",
        merge(OPD_MANAGED, {"opd-teacher-routes": '{"gsm8k": "/models/t"}'}),
        "error",
        merge(OPD_MANAGED, {"teacher-hf-checkpoint": DROP, "opd-teacher-routes": '{"gsm8k": "/models/t"}'}),
    ),
    (
        "rule.opd_teacher_routes",
        merge(
            OPD_SGLANG,
            {"opd-teacher-routes": '{"gsm8k": "/models/t"}', "opd-teacher-url": DROP},
        ),
        "error",
        merge(OPD_MANAGED, {"teacher-hf-checkpoint": DROP, "opd-teacher-routes": '{"gsm8k": "/models/t"}'}),
    ),
    ("rule.opd_teacher_load_needs_use_opd", {"opd-teacher-load": "/ckpt/teacher"}, "warning", OPD_MEGATRON),
    ("rule.fully_async_without_opd_megatron", merge(OPD_MEGATRON, {"hybrid": True}), "error", OPD_MEGATRON),
    (
        "rule.fully_async_without_opd_megatron",
        {"hybrid": True, "opd-type": "megatron"},
        "error",
        {"hybrid": True},
    ),
    (
        "rule.max_staleness_colocate",
        {"max-staleness": 1},
        "warning",
        merge(SFT, {"sft-max-in-flight-steps": 2, "colocate": True}),
    ),
    ("rule.max_staleness_colocate", {"max-staleness": 1}, "warning", {"hybrid": True, "max-staleness": 1}),
    (
        "rule.rollout_max_prompt_len_default",
        {"rollout-max-context-len": 4096, "rollout-max-prompt-len": 4096},
        "error",
        {"rollout-max-context-len": 4096, "rollout-max-prompt-len": 1024},
    ),
    (
        "rule.rollout_max_prompt_len_default",
        {"rollout-max-context-len": 4096},
        ("derived", "rollout_max_prompt_len", 4095),
        {"rollout-max-context-len": 4096, "rollout-max-prompt-len": 1024},
    ),
    (
        "rule.prompt_len_within_context",
        {"rollout-max-context-len": 4096, "rollout-max-prompt-len": 1024, "rollout-max-response-len": 4000},
        "warning",
        {"rollout-max-context-len": 4096, "rollout-max-prompt-len": 1024, "rollout-max-response-len": 3072},
    ),
    (
        "rule.context_within_position_embeddings",
        {"rollout-max-context-len": 8192, "max-position-embeddings": 4096},
        "warning",
        {"rollout-max-context-len": 4096, "max-position-embeddings": 4096},
    ),
    ("rule.eval_prompt_data_pairs", {"eval-prompt-data": ["a", "/a.jsonl", "b"]}, "error", EVAL),
    ("rule.eval_prompt_data_pairs", {"eval-prompt-data": ["/data/aime.jsonl"]}, "warning", EVAL),
    (
        "rule.eval_prompt_data_pairs",
        {"eval-prompt-data": ["/data/aime.jsonl"]},
        ("derived", "eval_prompt_data", ["aime", "/data/aime.jsonl"]),
        EVAL,
    ),
    (
        "rule.eval_config_overrides_eval_prompt_data",
        merge(EVAL, {"eval-config": "/eval.yaml"}),
        "warning",
        {"eval-config": "/eval.yaml"},
    ),
    (
        "rule.sft_eval_without_eval_config",
        merge(SFT, {"eval-config": "/eval.yaml"}),
        "error",
        merge(SFT, {"eval-prompt-data": ["val", "/v.jsonl"]}),
    ),
    ("rule.eval_interval_needs_eval_data", {"eval-interval": 5}, "error", merge(EVAL, {"eval-interval": 5})),
    (
        "rule.eval_interval_needs_eval_data",
        merge(SFT, {"eval-interval": 5}),
        "error",
        merge(SFT, {"eval-interval": 5, "eval-size": 0.05}),
    ),
    ("rule.eval_size_only_for_sft", {"eval-size": 0.05}, "error", merge(SFT, {"eval-size": 0.05})),
    (
        "rule.eval_size_exclusive_with_eval_prompt_data",
        merge(SFT, EVAL, {"eval-size": 0.05, "eval-interval": 5}),
        "error",
        merge(SFT, {"eval-size": 0.05, "eval-interval": 5}),
    ),
    (
        "rule.eval_size_exclusive_with_eval_prompt_data",
        merge(SFT, EVAL, {"eval-size": 0.05}),
        "warning",
        merge(SFT, {"eval-size": 0.05}),
    ),
    (
        "rule.eval_size_fraction_or_count",
        merge(SFT, {"eval-size": 2.5}),
        "warning",
        merge(SFT, {"eval-size": 200.0}),
    ),
    (
        "rule.sft_predict_interval_requirements",
        merge(SFT, {"sft-predict-interval": 10}),
        "error",
        merge(
            SFT,
            {
                "sft-predict-interval": 10,
                "save": "/out",
                "save-interval": 10,
                "eval-size": 0.05,
                "resource": {"actor": [1, 2], "rollout": [1, 1], "sft": [1, 0]},
            },
        ),
    ),
    (
        "rule.sft_predict_interval_requirements",
        {"sft-predict-interval": 10, "save": "/out"},
        "error",
        merge(
            SFT,
            {
                "sft-predict-interval": 10,
                "save": "/out",
                "save-interval": 10,
                "eval-prompt-data": ["val", "/v.jsonl"],
                "resource": {"actor": [1, 2], "rollout": [1, 1], "sft": [1, 0]},
            },
        ),
    ),
    (
        "rule.sft_predict_interval_without_debug_train_only",
        merge(SFT, PREDICT, {"debug-train-only": True}),
        "error",
        merge(SFT, PREDICT),
    ),
    (
        "rule.sft_predict_interval_without_debug_train_only",
        merge(SFT, PREDICT, {"load-debug-rollout-data": "/dbg/{rollout_id}.pt"}),
        "error",
        merge(SFT, {"debug-train-only": True}),
    ),
    (
        "rule.eval_function_path_default",
        {},
        ("derived", "eval_function_path", "relax.engine.rollout.sglang_rollout.generate_rollout"),
        {"eval-function-path": "pkg.eval"},
    ),
    (
        "rule.eval_input_key_default",
        {"input-key": "question"},
        ("derived", "eval_input_key", "question"),
        {"eval-input-key": "q"},
    ),
    (
        "rule.eval_max_context_len_default",
        {"rollout-max-context-len": 4096},
        ("derived", "eval_max_context_len", 4096),
        {},
    ),
    ("rule.eval_reward_key_default", {"reward-key": "acc"}, ("derived", "eval_reward_key", "acc"), {}),
    (
        "rule.sft_needs_prompt_data",
        merge(SFT, {"prompt-data": DROP}),
        "error",
        merge(SFT, {"prompt-data": DROP, "custom-dataset-class-path": "pkg.Dataset"}),
    ),
    ("rule.sft_needs_dynamic_batch_size", merge(SFT, {"use-dynamic-batch-size": False}), "error", SFT),
    ("rule.sft_balances_data", SFT, ("derived", "balance_data", True), merge(SFT, {"balance-data": True})),
    (
        "rule.sft_oversize_custom_needs_function_path",
        merge(SFT, {"sft-oversize-strategy": "custom"}),
        "error",
        merge(SFT, {"sft-oversize-strategy": "custom", "sft-oversize-custom-function-path": "pkg.truncate"}),
    ),
    (
        "rule.sft_oversize_custom_needs_function_path",
        merge(SFT, {"sft-oversize-custom-function-path": "pkg.truncate"}),
        "warning",
        SFT,
    ),
    (
        "rule.sft_max_in_flight_steps",
        {"sft-max-in-flight-steps": 2},
        "error",
        merge(SFT, {"sft-max-in-flight-steps": 3}),
    ),
    (
        "rule.sft_max_in_flight_steps",
        merge(SFT, {"sft-max-in-flight-steps": 3, "max-staleness": 0}),
        "warning",
        merge(SFT, {"sft-max-in-flight-steps": 3, "max-staleness": 2}),
    ),
    (
        "rule.sft_max_in_flight_steps",
        merge(SFT, {"sft-max-in-flight-steps": 3}),
        ("derived", "max_staleness", 2),
        SFT,
    ),
    (
        "rule.sft_async_prepack_requirements",
        merge(SFT, {"sft-async-prepack": True}),
        "error",
        merge(SFT, {"sft-async-prepack": True, "per-rank-fetch": True, "sft-max-in-flight-steps": 2}),
    ),
    (
        "rule.sft_options_need_sft",
        {"sft-oversize-strategy": "skip"},
        "warning",
        merge(SFT, {"sft-oversize-strategy": "skip"}),
    ),
    (
        "rule.prompt_data_required",
        {"prompt-data": DROP},
        "error",
        {"prompt-data": DROP, "data-source-path": "pkg.MySource"},
    ),
    (
        "rule.conversation_key_map_needs_no_label_key",
        {"conversation-key-map": {"from": "role"}, "label-key": "label"},
        "warning",
        {"conversation-key-map": {"from": "role"}},
    ),
    (
        "rule.prefetch_needs_streaming_dataset",
        {"prefetch-num-workers": 4},
        "warning",
        {"prefetch-num-workers": 4, "use-streaming-dataset": True},
    ),
    ("rule.rm_type_unset", {"rm-type": DROP}, "warning", {"rm-type": DROP, "rm-type-fallback": "zero"}),
    ("rule.rm_type_unset", {"rm-type": DROP}, "warning", {"rm-type": DROP, "rm-type-infer": True}),
    ("rule.rm_type_unset", {"rm-type": DROP}, "warning", {"rm-type": DROP, "custom-rm-path": "pkg.rm"}),
    (
        "rule.rm_type_unset",
        {"rm-type": DROP, "debug-rollout-only": True},
        "warning",
        {"rm-type": DROP, "load-debug-rollout-data": "/dbg/{rollout_id}.pt"},
    ),
    ("rule.rm_type_unset", {"rm-type": DROP}, "warning", merge(SFT, {"rm-type": DROP})),
    (
        "rule.remote_rm_needs_rm_url",
        {"rm-type": "remote_rm"},
        "error",
        {"rm-type": "remote_rm", "rm-url": "http://rm:8000/score"},
    ),
    (
        "rule.genrm_sampling_config_keys",
        merge(GENRM, {"genrm-sampling-config": {"temp": 0.1}}),
        "warning",
        merge(
            GENRM,
            {
                "genrm-sampling-config": {
                    "temperature": 0.1,
                    "chat_template_kwargs": {"enable_thinking": False},
                }
            },
        ),
    ),
    ("rule.genrm_options_need_model", {"genrm-num-gpus": 2}, "warning", GENRM),
    (
        "rule.genrm_options_need_model",
        GENRM,
        ("derived", "genrm_engine_config", {}),
        merge(GENRM, {"genrm-engine-config": {"dp_size": 1}, "genrm-sampling-config": {"top_p": 1.0}}),
    ),
    (
        "rule.rollout_external_needs_addrs",
        {"rollout-external": True},
        "error",
        {"rollout-external": True, "rollout-external-engine-addrs": ["10.0.0.1:30000"]},
    ),
    (
        "rule.rollout_external_needs_addrs",
        {"rollout-external-engine-addrs": ["10.0.0.1:30000"]},
        "warning",
        {"rollout-external": True, "rollout-external-engine-addrs": ["10.0.0.1:30000"]},
    ),
    (
        "rule.sticky_routing_needs_slime_router",
        {"slime-router-sticky": True},
        "warning",
        {"slime-router-sticky": True, "use-slime-router": True},
    ),
    (
        "rule.slime_router_options",
        {"slime-router-timeout": 30.0},
        "warning",
        {"slime-router-timeout": 30.0, "use-slime-router": True},
    ),
    (
        "rule.slime_router_options",
        {"use-slime-router": True, "slime-router-sticky-idle-secs": 60.0},
        "warning",
        {"use-slime-router": True, "slime-router-sticky": True, "slime-router-sticky-idle-secs": 60.0},
    ),
    (
        "rule.max_global_restart_needs_health_check",
        {"max-global-restart": 5},
        "warning",
        {"max-global-restart": 5, "use-health-check": True},
    ),
    (
        "rule.max_global_restart_needs_health_check",
        {"max-global-restart": 5},
        "warning",
        {"max-global-restart": 5, "use-fault-tolerance": True},  # the platform's driver-loss restarts
    ),
    (
        "rule.dump_details_sets_debug_paths",
        {"dump-details": "/dump"},
        ("derived", "save_debug_rollout_data", "/dump/rollout_data/{rollout_id}.pt"),
        {},
    ),
    (
        "rule.dump_details_sets_debug_paths",
        {"dump-details": "/dump", "save-debug-rollout-data": "/x"},
        "warning",
        {"dump-details": "/dump"},
    ),
    ("rule.custom_config_applied_at_launch", {"custom-config-path": "/cfg.yaml"}, "warning", {}),
    (
        "rule.notify_urls_http",
        {"notify-urls": "https://ci.example.com/hook,mailto://me@example.com"},
        "error",
        {"notify-urls": "https://ci.example.com/hook, http://10.0.0.5:8080/done"},
    ),
    ("rule.notify_urls_http", {"notify-urls": "slack://tokenA/tokenB"}, "error", {}),
    ("rule.notify_urls_http", {"notify-urls": "https://u:p@ci.example.com/hook"}, "error", {}),
    (
        "rule.notify_urls_http",
        {"notify-urls": ",".join(f"https://ci.example.com/{i}" for i in range(11))},
        "error",
        {"notify-urls": ",".join(f"https://ci.example.com/{i}" for i in range(10))},
    ),
    (
        "rule.sglang_profile_steps",
        {"sglang-profile": True, "sglang-profile-step-start": 5, "sglang-profile-step-end": 2},
        "error",
        {"sglang-profile": True, "sglang-profile-step-start": 2, "sglang-profile-step-end": 4},
    ),
    (
        "rule.sglang_profile_steps",
        {"sglang-profile-steps": [1, 3]},
        "warning",
        {"sglang-profile": True, "sglang-profile-steps": [1, 3]},
    ),
    (
        "rule.profile_step_range",
        {"use-pytorch-profiler": True, "profile-step-start": 12, "profile-step-end": 10},
        "error",
        {"use-pytorch-profiler": True, "profile-step-start": 12, "profile-step-end": 12},
    ),
    (
        "rule.profile_step_range",
        {"profile-with-stack": True},
        "warning",
        {"profile-with-stack": True, "use-pytorch-profiler": True},
    ),
    (
        "rule.memory_snapshot_needs_history",
        {"memory-snapshot-num-steps": 3},
        "warning",
        {"memory-snapshot-num-steps": 3, "record-memory-history": True},
    ),
    ("rule.relax_resets_megatron_defaults", {}, ("derived", "distributed_timeout_minutes", 30), TORCH),
    (
        "rule.megatron_backend_defaults",
        {},
        ("derived", "use_distributed_optimizer", True),
        {"use-distributed-optimizer": True, "dist-ckpt-save-pre-mcore-014": True},
    ),
    ("rule.fp16_and_bf16_exclusive", {"fp16": True, "bf16": True}, "warning", {"bf16": True}),
    (
        "rule.fp16_and_bf16_exclusive",
        {"fp16": True, "bf16": True},
        ("derived", "bf16", False),
        {"fp16": True},
    ),
    ("rule.fp16_and_bf16_exclusive", {}, ("derived", "bf16", True), {"bf16": True}),
    (
        "rule.bf16_grads_in_fp32",
        {},
        ("derived", "accumulate_allreduce_grads_in_fp32", True),
        {"accumulate-allreduce-grads-in-fp32": True},
    ),
    (
        "rule.bf16_grads_in_fp32",
        {"accumulate-allreduce-grads-in-fp32": True, "grad-reduce-in-bf16": True},
        ("derived", "accumulate_allreduce_grads_in_fp32", False),
        {"grad-reduce-in-bf16": True},
    ),
    (
        "rule.fp16_compat_fallbacks",
        {"fp16": True},
        "warning",
        {"fp16": True, "no-store-param-remainders": True},
    ),
    (
        "rule.fp16_compat_fallbacks",
        {"fp16": True},
        ("derived", "store_param_remainders", False),
        merge(TORCH, {"fp16": True}),
    ),
    (
        "rule.fp16_dynamic_loss_scale_valid",
        {"fp16": True, "initial-loss-scale": 1.0, "min-loss-scale": 4.0},
        "error",
        {"fp16": True, "initial-loss-scale": 4.0, "min-loss-scale": 1.0},
    ),
    (
        "rule.fp16_dynamic_loss_scale_valid",
        {"fp16": True, "initial-loss-scale": 0.0},
        "error",
        {"fp16": True, "initial-loss-scale": 65536.0},
    ),
    (
        "rule.loss_scale_options_need_dynamic_fp16",
        {"initial-loss-scale": 1024.0},
        "warning",
        {"fp16": True, "initial-loss-scale": 1024.0},
    ),
    (
        "rule.loss_scale_options_need_dynamic_fp16",
        {"fp16": True, "loss-scale": 128.0, "min-loss-scale": 2.0},
        "warning",
        {"fp16": True, "loss-scale": 128.0},
    ),
    ("rule.megatron_sequence_length_placeholders", {}, ("derived", "seq_length", 4096), {"seq-length": 4096}),
    (
        "rule.megatron_sequence_length_placeholders",
        {"seq-length": 8192, "max-position-embeddings": 32768},
        ("derived", "max_position_embeddings", 8192),
        {"seq-length": 8192, "max-position-embeddings": 8192},
    ),
    ("rule.megatron_rope_type", {}, ("derived", "rope_type", "rope"), TORCH),
    (
        "rule.megatron_rope_type",
        {"multi-latent-attention": True},
        ("derived", "rope_type", "yarn"),
        {"multi-latent-attention": True, "rope-type": "yarn"},
    ),
    (
        "rule.megatron_padded_vocab_size",
        {"vocab-size": 151643, "tensor-model-parallel-size": 2},
        ("derived", "padded_vocab_size", 151808),
        {"vocab-size": 151643, "padded-vocab-size": 151936},
    ),
    (
        "rule.megatron_tokenizer_from_hf_checkpoint",
        {},
        ("derived", "tokenizer_model", "/models/qwen"),
        {"tokenizer-type": "HuggingFaceTokenizer", "tokenizer-model": "/models/tok"},
    ),
    (
        "rule.megatron_expert_tensor_parallel_default",
        {"tensor-model-parallel-size": 2},
        ("derived", "expert_tensor_parallel_size", 2),
        {"tensor-model-parallel-size": 2, "expert-tensor-parallel-size": 1},
    ),
    (
        "rule.megatron_recompute_activations",
        {"recompute-activations": True},
        ("derived", "recompute_granularity", "selective"),
        {"recompute-granularity": "selective"},
    ),
    (
        "rule.megatron_recompute_activations",
        {"recompute-activations": True, "recompute-granularity": "full"},
        "warning",
        {"recompute-activations": True},
    ),
    (
        "rule.megatron_rotary_position_embeddings",
        {"use-rotary-position-embeddings": True},
        ("derived", "position_embedding_type", "rope"),
        {"position-embedding-type": "rope"},
    ),
    (
        "rule.moe_token_dispatcher_alltoall",
        {},
        ("derived", "moe_token_dispatcher_type", "alltoall"),
        {"moe-token-dispatcher-type": "alltoall"},
    ),
    (
        "rule.moe_token_dispatcher_alltoall",
        {"moe-token-dispatcher-type": "allgather"},
        "warning",
        {"moe-token-dispatcher-type": "flex"},
    ),
    (
        "rule.overlap_param_gather_needs_overlap_grad_reduce",
        {"overlap-param-gather": True},
        "error",
        {"overlap-param-gather": True, "overlap-grad-reduce": True},
    ),
    (
        "rule.optimizer_overlap_compatibility",
        {"overlap-grad-reduce": True, "num-experts": 8},
        "warning",
        {"use-distributed-optimizer": True, "num-experts": 8},
    ),
    (
        "rule.optimizer_overlap_compatibility",
        {"overlap-grad-reduce": True, "multimodal-keys": {"image": "images"}, "context-parallel-size": 2},
        "warning",
        {"overlap-grad-reduce": True, "multimodal-keys": {"image": "images"}},
    ),
    (
        "rule.cpu_optimizer_overlap_needs_offload",
        {"overlap-cpu-optimizer-d2h-h2d": True},
        "warning",
        {
            "overlap-cpu-optimizer-d2h-h2d": True,
            "optimizer-cpu-offload": True,
            "use-precision-aware-optimizer": True,
        },
    ),
    (
        "rule.sequence_parallel_needs_tp",
        {"sequence-parallel": True},
        "warning",
        {"sequence-parallel": True, "tensor-model-parallel-size": 2},
    ),
    (
        "rule.sequence_parallel_needs_tp",
        {"sequence-parallel": True},
        ("derived", "sequence_parallel", False),
        {"sequence-parallel": True, "tensor-model-parallel-size": 2},
    ),
    (
        "rule.recompute_options",
        {"recompute-granularity": "full", "recompute-method": "uniform"},
        "error",
        {"recompute-granularity": "full", "recompute-method": "uniform", "recompute-num-layers": 1},
    ),
    (
        "rule.recompute_options",
        {"recompute-granularity": "selective", "recompute-num-layers": 2},
        "error",
        {"recompute-granularity": "selective"},
    ),
    (
        "rule.recompute_options",
        {"recompute-activations": True, "recompute-method": "block"},
        "error",
        {"recompute-activations": True},
    ),
    ("rule.recompute_options", {"recompute-method": "uniform"}, "warning", {}),
    (
        "rule.attention_heads_shape",
        {"num-attention-heads": 5, "tensor-model-parallel-size": 2},
        "error",
        {"num-attention-heads": 4, "tensor-model-parallel-size": 2},
    ),
    (
        "rule.attention_heads_shape",
        {"group-query-attention": True, "num-query-groups": 3, "tensor-model-parallel-size": 2},
        "error",
        {"group-query-attention": True, "num-query-groups": 2, "tensor-model-parallel-size": 2},
    ),
    (
        "rule.attention_heads_shape",
        {"group-query-attention": True},
        "warning",
        {"group-query-attention": True, "num-query-groups": 2},
    ),
    ("rule.attention_heads_shape", {"num-query-groups": 4}, "warning", {}),
    (
        "rule.experts_divisible_by_expert_parallel",
        {"num-experts": 3, "expert-model-parallel-size": 2},
        "error",
        {"num-experts": 4, "expert-model-parallel-size": 2},
    ),
    (
        "rule.experts_divisible_by_expert_parallel",
        {"expert-model-parallel-size": 2},
        "error",
        {"num-experts": 4, "expert-model-parallel-size": 2},
    ),
    (
        "rule.megatron_uneven_pipeline_needs_pp",
        {"decoder-first-pipeline-num-layers": 2},
        "error",
        {
            "decoder-first-pipeline-num-layers": 2,
            "pipeline-model-parallel-size": 2,
            "num-layers": 4,
        },
    ),
    (
        "rule.context_parallel_needs_per_token_loss",
        {"context-parallel-size": 2},
        "error",
        {"context-parallel-size": 2, "calculate-per-token-loss": True},
    ),
    (
        "rule.megatron_save_needs_save_interval",
        {"save": "/out"},
        "error",
        merge(TORCH, {"save": "/out"}),
    ),
    ("rule.megatron_min_lr_within_lr", {"lr": 1e-6, "min-lr": 1e-5}, "error", {"lr": 1e-5, "min-lr": 1e-6}),
    (
        "rule.optimizer_cpu_offload_needs_precision_aware_optimizer",
        {"optimizer-cpu-offload": True},
        "error",
        {"optimizer-cpu-offload": True, "use-precision-aware-optimizer": True},
    ),
    (
        "rule.enable_mtp_training_needs_mtp_num_layers",
        {"enable-mtp-training": True},
        "error",
        {"enable-mtp-training": True, "mtp-num-layers": 1},
    ),
    (
        "rule.sft_chunked_logits_compatibility",
        merge(SFT, {"sft-chunked-logits": True}),
        "error",
        merge(SFT, {"sft-chunked-logits": True, "untie-embeddings-and-output-weights": True}),
    ),
    (
        "rule.sft_chunked_logits_compatibility",
        merge(
            SFT,
            {
                "sft-chunked-logits": True,
                "untie-embeddings-and-output-weights": True,
                "enable-mtp-training": True,
            },
        ),
        "error",
        merge(SFT, {"sft-chunked-logits": True, "untie-embeddings-and-output-weights": True}),
    ),
    (
        "rule.agentic_rollout",
        {"use-agentic-rollout": True, "agent-cwd": "/work"},
        "error",
        {"use-agentic-rollout": True, "agent-command": "python agent.py", "agent-cwd": "/work"},
    ),
    (
        "rule.agentic_rollout",
        {
            "use-agentic-rollout": True,
            "agent-command": "python agent.py",
            "agent-cwd": "/work",
            "agent-env": ["RELAX_TOKEN=1"],
        },
        "error",
        {
            "use-agentic-rollout": True,
            "agent-command": "python agent.py",
            "agent-cwd": "/work",
            "agent-env": ["TOKEN=1"],
        },
    ),
    (
        "rule.agentic_rollout",
        {"use-agentic-rollout": True, "agent-command": "python agent.py", "agent-cwd": "/work"},
        ("derived", "rollout_function_path", "relax.agentic.rollout.generate_rollout"),
        {},
    ),
    ("rule.pool_node_size", {MAX: 4, "num-gpus-per-node": 8}, "error", {MAX: 8, "num-gpus-per-node": 8}),
    ("rule.pool_node_size", {MAX: 4}, ("derived", "num_gpus_per_node", 4), {MAX: 8}),
    (
        "rule.pool_node_size",
        {
            MAX: 4,
            "num-gpus-per-node": 4,
            "rollout-num-gpus-per-engine": 6,
            "resource": {"actor": [1, 12], "rollout": [1, 12]},
        },
        "error",
        {
            MAX: 4,
            "num-gpus-per-node": 4,
            "rollout-num-gpus-per-engine": 4,
            "resource": {"actor": [1, 12], "rollout": [1, 12]},
        },
    ),
    (
        "rule.resource_roles",
        {"resource": {"actor": [1, 2], "rollout": [1, 2], "refrence": [1, 1]}},
        "warning",
        {},
    ),
    ("rule.resource_roles", {"resource": {"actor": [0, 2], "rollout": [1, 2]}}, "error", {}),
    (
        "rule.resource_roles",
        {"resource": {"actor": [1, 2], "rollout": [1, 2], "reference": [2, 3]}},
        "error",
        {"resource": {"actor": [1, 2], "rollout": [1, 2], "reference": [1, 1]}},
    ),
    (
        "rule.resource_needs_actor_and_rollout",
        {"resource": {"rollout": [1, 2]}, "colocate": DROP},
        "error",
        {"colocate": DROP},
    ),
    (
        "rule.resource_needs_actor_and_rollout",
        {"resource": {"actor": [1, 2]}, "colocate": DROP},
        "error",
        {"resource": {"actor": [1, 2]}},
    ),
    ("rule.resource_needs_actor_and_rollout", {"resource": DROP}, "warning", {}),
    (
        "rule.actor_gpus_divisible_by_model_parallel",
        {"tensor-model-parallel-size": 4},
        "error",
        {"tensor-model-parallel-size": 2},
    ),
    (
        "rule.actor_gpus_divisible_by_model_parallel",
        merge(
            PPO,
            {
                "resource": {"actor": [1, 2], "critic": [1, 1], "rollout": [1, 3], "advantages": [1, 0]},
                "tensor-model-parallel-size": 2,
            },
        ),
        "error",
        merge(PPO, {"tensor-model-parallel-size": 2}),
    ),
    (
        "rule.expert_parallel_fits_actor",
        {"num-experts": 8, "expert-model-parallel-size": 4},
        "error",
        {"num-experts": 8, "expert-model-parallel-size": 2},
    ),
    (
        "rule.actor_whole_nodes",
        {"resource": {"actor": [1, 12], "rollout": [1, 12]}},
        "error",
        {"resource": {"actor": [1, 16], "rollout": [1, 16]}},
    ),
    (
        "rule.tensor_parallel_within_node",
        {"num-gpus-per-node": 1, "tensor-model-parallel-size": 2},
        "warning",
        {"tensor-model-parallel-size": 2},
    ),
    (
        "rule.rollout_engines_fit",
        {"rollout-num-gpus-per-engine": 3},
        "error",
        {"rollout-num-gpus-per-engine": 2},
    ),
    (
        "rule.rollout_engines_fit",
        {
            "num-gpus-per-node": 4,
            "rollout-num-gpus-per-engine": 6,
            "resource": {"actor": [1, 12], "rollout": [1, 12]},
        },
        "error",
        {
            "num-gpus-per-node": 4,
            "rollout-num-gpus-per-engine": 4,
            "resource": {"actor": [1, 12], "rollout": [1, 12]},
        },
    ),
    ("rule.colocate_rollout_spans_actor", {"resource": {"actor": [1, 2], "rollout": [1, 1]}}, "warning", {}),
    (
        "rule.genrm_layout",
        merge(GENRM, {"resource": {"actor": [1, 2], "rollout": [1, 2], "genrm": [1, 1]}}),
        "error",
        merge(GENRM, {"resource": {"actor": [1, 2], "rollout": [1, 1], "genrm": [1, 1]}}),
    ),
    (
        "rule.genrm_layout",
        merge(GENRM, {"genrm-num-gpus-per-engine": 3}),
        "error",
        merge(GENRM, {"genrm-num-gpus-per-engine": 2}),
    ),
    (
        "rule.opd_managed_teacher_colocate_layout",
        merge(OPD_MANAGED, {"resource": {"actor": [1, 4], "rollout": [1, 4], "teacher": [1, 2]}}),
        "error",
        OPD_MANAGED,
    ),
    (
        "rule.global_batch_size_divisible_by_micro_batches",
        {"global-batch-size": 32, "micro-batch-size": 3},
        "error",
        {"global-batch-size": 32, "micro-batch-size": 2},
    ),
]


def _ids(case: tuple) -> str:
    expect = case[2] if isinstance(case[2], str) else f"derived-{case[2][1]}"
    return f"{case[0]}[{expect}]"


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_rule_broken(case: tuple) -> None:
    code, broken, expect, _ = case
    res, issues = run(broken)
    if isinstance(expect, tuple):
        _, field, value = expect
        assert res is not None, [str(i) for i in issues]
        assert res.derived.get(field) == value, res.derived
        assert getattr(res.spec, field) == value
        return
    matching = [i for i in issues if i.code == code]
    assert matching, f"{code} not reported; got {[str(i) for i in issues]}"
    assert all(i.severity == expect for i in matching), [str(i) for i in matching]
    for issue in matching:
        assert issue.message and issue.hint
        assert issue.field is None or issue.field in issue.fields
    if expect == "error":
        assert res is None


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_rule_satisfied(case: tuple) -> None:
    code, _, expect, satisfied = case
    res, issues = run(satisfied)
    assert res is not None, f"satisfied case fails: {[str(i) for i in issues if i.is_error]}"
    assert code not in {i.code for i in issues}, [str(i) for i in issues if i.code == code]
    if isinstance(expect, tuple):
        _, field, value = expect
        assert res.derived.get(field, object()) != value or field not in res.derived


def test_every_registered_rule_has_cases() -> None:
    covered = {c[0] for c in CASES}
    missing = [r.code for r in INPUT_RULES + RULES if r.code not in covered]
    assert not missing, f"rules without a broken/satisfied case: {missing}"


def test_rule_registry_is_ordered_and_unique() -> None:
    codes = [r.code for r in INPUT_RULES + RULES]
    assert len(codes) == len(set(codes))
    assert all(c.startswith("rule.") for c in codes)
    assert all(r.summary and r.fields for r in INPUT_RULES + RULES)


def test_base_spec_is_valid_and_quiet() -> None:
    res, issues = run({})
    assert res is not None
    assert not issues, [str(i) for i in issues]


def test_errors_are_all_collected() -> None:
    _, issues = run(
        {
            "save-interval": 5,
            "kl-coef": 0.1,
            "use-kl-loss": True,
            "kl-loss-coef": 0.1,
            "context-parallel-size": 2,
        }
    )
    codes = {i.code for i in issues if i.is_error}
    assert {
        "rule.save_interval_needs_save",
        "rule.kl_coef_and_kl_loss_coef",
        "rule.context_parallel_needs_per_token_loss",
    } <= codes


def test_rule_issue_names_all_fields() -> None:
    _, issues = run({"kl-coef": 0.1, "use-kl-loss": True, "kl-loss-coef": 0.1})
    issue = next(i for i in issues if i.code == "rule.kl_coef_and_kl_loss_coef")
    assert issue.field == "kl-coef" and issue.fields == ["kl-coef", "kl-loss-coef"]
    assert "0.1" in issue.message


def test_reinforce_plus_plus_baseline_runs_with_kl_coef_and_raw_rewards_as_in_relax() -> None:
    """Issue 17: Relax applies --kl-coef to reinforce_plus_plus_baseline's advantages and runs it with
    --disable-rewards-normalization; the spec accepts both (the KL needs the reference model of --ref-load)."""
    rpp = {"advantage-estimator": "reinforce_plus_plus_baseline", "normalize-advantages": True}
    for extra in (
        {"kl-coef": 0.1},
        {"disable-rewards-normalization": True},
        {"kl-coef": 0.05, "kl-loss-type": "k2"},
    ):
        res, issues = run({**rpp, **extra})
        assert res is not None and not [i for i in issues if i.is_error], [str(i) for i in issues]
        assert not {i.code for i in issues} & {"rule.reinforce_plus_plus_baseline_without_kl_coef"}
    assert "rule.reinforce_plus_plus_baseline_without_kl_coef" in RETIRED_RULES
    _, issues = run({**rpp, "kl-coef": 0.1, "ref-load": DROP})
    assert "rule.kl_needs_reference_model" in {i.code for i in issues}


def test_every_deviation_has_a_reason() -> None:
    listed = deviations()
    assert listed, "the deviations from Relax's code are listed"
    codes = [code for code, _, _ in listed]
    assert len(codes) == len(set(codes))
    registered = {r.code for r in INPUT_RULES + RULES}
    for code, flags, reason in listed:
        assert code.startswith("rule."), code
        assert flags and all(isinstance(f, str) and not f.startswith("-") for f in flags), code
        assert isinstance(reason, str) and len(reason.split()) >= 8, f"{code}: {reason!r}"
        assert code in registered or code in RETIRED_RULES, code
    for r in INPUT_RULES + RULES:
        assert r.deviation is None or r.deviation.strip(), r.code


def test_a_deviation_without_a_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="reason"):
        rule("rule.example_without_reason", "lr", summary="an example", deviation=" ")(lambda ctx: None)


def test_retired_codes_are_not_registered() -> None:
    registered = {r.code for r in INPUT_RULES + RULES}
    assert not set(RETIRED_RULES) & registered
    assert all(reason.strip() for reason in RETIRED_RULES.values())


def test_torch_backend_is_not_a_warning_on_every_job() -> None:
    res, issues = run(TORCH)
    assert res is not None and not issues, [str(i) for i in issues]


def test_no_hint_points_to_the_megatron_backend() -> None:
    """The platform runs the torch backend only: no rule's hint sends a user to --train-backend megatron
    (or to a Megatron-run OPD teacher)."""
    cases = [broken for _, broken, _, _ in CASES] + [satisfied for _, _, _, satisfied in CASES]
    for overrides in cases:
        _, issues = run(merge(overrides, TORCH) if "train-backend" not in overrides else overrides)
        for issue in issues:
            assert "--train-backend megatron" not in issue.hint, str(issue)
            assert "--opd-type megatron" not in issue.hint, str(issue)


def test_megatron_backend_derivations_are_shown_and_stable() -> None:
    res, issues = run({})
    assert res is not None and not issues, [str(i) for i in issues]
    derived = res.derived
    assert derived["use_distributed_optimizer"] is True and derived["bf16"] is True
    assert derived["moe_token_dispatcher_type"] == "alltoall"
    assert derived["distributed_timeout_minutes"] == 30
    assert derived["seq_length"] == derived["max_position_embeddings"] == 4096
    assert derived["tokenizer_type"] == "HuggingFaceTokenizer"
    again = normalize(argv=res.spec.to_argv())
    assert again.spec == res.spec
    assert "--use-distributed-optimizer" in res.spec.to_argv()


def test_torch_backend_gets_no_megatron_derivations() -> None:
    res, _ = run(TORCH)
    assert res is not None
    for name in (
        "use_distributed_optimizer",
        "bf16",
        "moe_token_dispatcher_type",
        "seq_length",
        "tokenizer_model",
    ):
        assert name not in res.derived, name
