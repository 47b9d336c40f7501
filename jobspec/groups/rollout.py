"""Parameter groups for rollout: sampling, filtering, partial rollout, weight sync, engines, hooks."""

from __future__ import annotations

from typing import Any

from jobspec.fields import ByteSize, ParamGroup, param

__all__ = [
    "RolloutParams",
    "DynamicFilteringParams",
    "PartialRolloutParams",
    "WeightUpdateParams",
    "ExternalEngineParams",
    "SglangParams",
    "CustomFunctionParams",
]


class RolloutParams(ParamGroup):
    group = "rollout"
    title = "Rollout: sampling"

    num_rollout: int | None = param(None, "Total number of rollout rounds. Set this or --num-epoch.", ge=1)
    num_epoch: int | None = param(
        None,
        "Training epochs; num_rollout is computed from the dataset size. Ignored when --num-rollout is "
        "also set.",
        ge=1,
    )
    rollout_batch_size: int | None = param(
        None,
        "Prompts sampled per rollout round (required). Total samples = rollout-batch-size * "
        "n-samples-per-prompt.",
        ge=1,
        unset="required; Relax derives it as global_batch_size // n_samples_per_prompt when only "
        "--global-batch-size is given",
    )
    n_samples_per_prompt: int = param(1, "Responses generated per prompt.", ge=1)
    rollout_temperature: float = param(1.0, "Sampling temperature of the inference engine.", ge=0)
    rollout_top_p: float = param(1.0, "Top-p of the inference engine.", gt=0, le=1)
    rollout_top_k: int = param(-1, "Top-k of the inference engine; -1 disables it.", ge=-1)
    rollout_max_response_len: int | None = param(None, "Maximum response length (SGLang's max_tokens).", ge=1)
    rollout_max_prompt_len: int | None = param(
        None,
        "Maximum prompt length; longer prompts are filtered out when the dataset is loaded.",
        ge=1,
        unset="rollout_max_context_len - 1 when --rollout-max-context-len is set",
    )
    rollout_max_context_len: int | None = param(
        None,
        "Maximum context length of the inference engine. Should not exceed max_position_embeddings in "
        "the Hugging Face config.json.",
        ge=2,
    )
    rollout_stop: list[str] | None = param(None, "Stop words for rollout: one or more strings.", min_length=1)
    rollout_stop_token_ids: list[int] | None = param(None, "Stop token ids for rollout.", min_length=1)
    rollout_skip_special_tokens: bool = param(False, "Skip special tokens in responses.")


class DynamicFilteringParams(ParamGroup):
    group = "dynamic_filtering"
    title = "Rollout: over-sampling and dynamic filtering"

    over_sampling_batch_size: int | None = param(
        None,
        "Granularity of sampling batches. Must be >= --rollout-batch-size.",
        ge=1,
        unset="rollout_batch_size",
    )
    dynamic_sampling_filter_path: str | None = param(
        None,
        "Dynamic sampling filter function (DAPO-style, e.g. drop groups that are all correct or all wrong). "
        "Example: relax.engine.filters.dynamic_sampling_filters.check_reward_nonzero_std.",
        function_path=True,
    )
    buffer_filter_path: str | None = param(
        None,
        "Buffer filter function: list[list[Sample]] -> list[list[Sample]].",
        function_path=True,
    )


class PartialRolloutParams(ParamGroup):
    group = "partial_rollout"
    title = "Rollout: partial rollout"

    partial_rollout: bool = param(
        False,
        "Enable partial rollout: unfinished samples go back to the data buffer (useful for long responses).",
    )
    partial_rollout_max_aborted_count: int | None = param(
        None,
        "How often a sample may be aborted; once reached it is no longer interrupted and completes.",
        ge=1,
    )
    mask_offpolicy_in_partial_rollout: bool = param(
        False,
        "Mask earlier (off-policy) generations in partial rollout, so only on-policy tokens are trained on.",
    )


class WeightUpdateParams(ParamGroup):
    group = "weight_update"
    title = "Rollout: weight update"

    update_weight_buffer_size: ByteSize = param(
        512 * 1024**2,
        "Buffer size in bytes for weight updates (updates go in chunks; useful for MoE). Default 512 MiB. "
        'Specs may write sizes such as "512MB" or "1GiB".',
        size=True,
        ge=1,
    )
    update_weights_interval: int = param(1, "Weight update interval (rollout steps).", ge=1)
    keep_old_actor: bool = param(False, "Keep the rollout model during training.")


class ExternalEngineParams(ParamGroup):
    group = "external_engine"
    title = "Rollout: external inference engines"

    rollout_external: bool = param(
        False, "Use external SGLang instances instead of launching them inside the framework."
    )
    rollout_external_engine_addrs: list[str] | None = param(
        None, "Addresses (host:port) of the external engines.", min_length=1
    )


class SglangParams(ParamGroup):
    group = "sglang"
    title = "SGLang engine"
    description = (
        "Any other SGLang server argument passes through with the prefix --sglang- (for example "
        "--sglang-mem-fraction-static 0.7). Such arguments are collected, without the prefix, in the "
        "`sglang` mapping."
    )

    sglang: dict[str, Any] = param(
        {},
        "SGLang server arguments passed through as --sglang-<name> (stored without the prefix, with "
        "underscores). Values are untyped: a bare flag is true, several values form a list, numbers are "
        "parsed as numbers. Example: --sglang-mem-fraction-static 0.7.",
        kind="passthrough",
        flag="sglang-*",
    )
    sglang_profile: bool = param(
        False,
        "Enable torch profiling of the SGLang engines; triggered during rollout, saving a trace per step.",
    )
    sglang_profile_steps: list[int] | None = param(
        None,
        "Absolute rollout step ids (0-based) to profile SGLang at. Takes precedence over "
        "--sglang-profile-step-start/end. Example: --sglang-profile-steps 3 10 50.",
        min_length=1,
    )
    sglang_profile_step_start: int | None = param(
        None,
        "First rollout step (inclusive, 0-based) of a contiguous profiling range; ignored when "
        "--sglang-profile-steps is set.",
        ge=0,
    )
    sglang_profile_step_end: int | None = param(
        None,
        "Last rollout step (inclusive, 0-based) of a contiguous profiling range; ignored when "
        "--sglang-profile-steps is set. start=2, end=4 captures steps 2, 3 and 4.",
        ge=0,
    )
    sglang_profile_output_dir: str | None = param(
        None,
        "Output directory for SGLang profile traces.",
        path_kind="output",
        unset="traces/<tb_experiment_name>/sglang_trace",
    )
    sglang_profile_num_steps: int = param(
        3,
        "SGLang forward steps to profile per rollout; -1 profiles the whole rollout step until stop_profile.",
        ge=-1,
    )
    sglang_profile_activities: list[str] = param(
        ["CPU", "GPU"], "Activities to profile (e.g. CPU GPU).", min_length=1
    )
    sglang_profile_by_stage: bool = param(False, "Profile prefill and decode separately.")
    sglang_profile_with_stack: bool = param(False, "Record call stacks in the SGLang trace.")
    sglang_profile_record_shapes: bool = param(False, "Record tensor shapes in the SGLang trace.")


class CustomFunctionParams(ParamGroup):
    group = "custom_functions"
    title = "Rollout: custom functions"

    rollout_function_path: str = param(
        "relax.engine.rollout.sglang_rollout.generate_rollout",
        "Rollout generation function.",
        function_path=True,
    )
    custom_generate_function_path: str | None = param(
        None,
        "Custom generate function replacing the one inside the default rollout (multi-turn dialogue, "
        "function calling, ...).",
        function_path=True,
    )
    rollout_data_postprocess_path: str | None = param(
        None,
        "Post-processing function called once all rollout data (log-probs included) is available; can "
        "update the loss mask.",
        function_path=True,
    )
    custom_rollout_log_function_path: str | None = param(
        None, "Custom rollout logging function.", function_path=True
    )
    custom_eval_rollout_log_function_path: str | None = param(
        None, "Custom evaluation-rollout logging function.", function_path=True
    )
