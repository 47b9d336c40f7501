"""Evaluation: eval data and config, its interval, the SFT eval size and predictions, and the eval
settings that default to the training ones."""

from __future__ import annotations

from jobspec.rules.context import RuleContext, defaults_to, rule


@rule(
    "rule.eval_prompt_data_pairs",
    "eval-prompt-data",
    summary="--eval-prompt-data is name/path pairs; a lone path is read as the dataset 'aime' (derived, warned).",
)
def eval_prompt_data_pairs(ctx: RuleContext) -> None:
    data = ctx.eval_prompt_data
    if not data:
        return
    if len(data) == 1:
        ctx.derive("eval_prompt_data", ["aime", data[0]])
        ctx.warn(
            f"--eval-prompt-data has a single path {data[0]!r}; Relax names it 'aime'",
            f"write --eval-prompt-data NAME {data[0]}",
        )
    elif len(data) % 2:
        ctx.error(
            f"--eval-prompt-data has {len(data)} items; it takes name/path pairs",
            "write --eval-prompt-data name1 path1 name2 path2",
        )


@rule(
    "rule.eval_config_overrides_eval_prompt_data",
    "eval-config",
    "eval-prompt-data",
    summary="--eval-config overrides --eval-prompt-data (warning when both are set).",
)
def eval_config_overrides_eval_prompt_data(ctx: RuleContext) -> None:
    if ctx.eval_config is not None and ctx.eval_prompt_data:
        ctx.warn("--eval-config overrides --eval-prompt-data", "remove --eval-prompt-data")


@rule(
    "rule.sft_eval_without_eval_config",
    "loss-type",
    "eval-config",
    summary="--loss-type sft evaluates on --eval-prompt-data or --eval-size; --eval-config is not supported.",
)
def sft_eval_without_eval_config(ctx: RuleContext) -> None:
    if ctx.is_sft and ctx.eval_config is not None:
        ctx.error(
            "--loss-type sft evaluates on --eval-prompt-data or --eval-size; --eval-config is not supported",
            "replace --eval-config with --eval-prompt-data NAME PATH (or --eval-size 0.05)",
            fields=("eval-config", "loss-type"),
        )


@rule(
    "rule.eval_interval_needs_eval_data",
    "eval-interval",
    "eval-prompt-data",
    "eval-config",
    "eval-size",
    summary="--eval-interval needs evaluation data: --eval-prompt-data or --eval-config (SFT: exactly one of "
    "--eval-prompt-data and --eval-size, unless a custom dataset class provides it).",
)
def eval_interval_needs_eval_data(ctx: RuleContext) -> None:
    if ctx.eval_interval is None:
        return
    if ctx.is_sft:
        has_data, has_size = bool(ctx.eval_prompt_data), ctx.eval_size is not None
        if has_data and has_size:
            return  # reported by rule.eval_size_exclusive_with_eval_prompt_data
        if not (has_data or has_size or ctx.eval_config is not None or ctx.custom_dataset_class_path):
            ctx.error(
                "--eval-interval under --loss-type sft needs --eval-prompt-data or --eval-size",
                "add --eval-size 0.05 (a holdout from --prompt-data) or --eval-prompt-data NAME PATH",
            )
    elif not ctx.eval_prompt_data and ctx.eval_config is None:
        ctx.error(
            "--eval-interval is set but no evaluation data is (--eval-prompt-data or --eval-config)",
            "add --eval-prompt-data NAME PATH",
        )


@rule(
    "rule.eval_size_only_for_sft",
    "eval-size",
    "loss-type",
    summary="--eval-size is only meaningful under --loss-type sft.",
)
def eval_size_only_for_sft(ctx: RuleContext) -> None:
    if ctx.eval_size is not None and not ctx.is_sft:
        ctx.error(
            f"--eval-size is only used with --loss-type sft (got --loss-type {ctx.loss_type})",
            "use --eval-prompt-data for RL evaluation",
        )


@rule(
    "rule.eval_size_exclusive_with_eval_prompt_data",
    "eval-size",
    "eval-prompt-data",
    summary="--eval-size and --eval-prompt-data are mutually exclusive: an error with --eval-interval (Relax's "
    "check), a warning otherwise.",
)
def eval_size_exclusive_with_eval_prompt_data(ctx: RuleContext) -> None:
    if ctx.eval_size is None or not ctx.eval_prompt_data:
        return
    if ctx.eval_interval is not None:
        ctx.error("--eval-size and --eval-prompt-data are both set", "keep one eval source")
    else:
        ctx.warn(
            "--eval-size and --eval-prompt-data are both set; they are alternative eval sources",
            "keep one eval source",
        )


@rule(
    "rule.eval_size_fraction_or_count",
    "eval-size",
    summary="--eval-size is a fraction (< 1) or a whole sample count (>= 1); a count with a fraction is a "
    "warning.",
)
def eval_size_fraction_or_count(ctx: RuleContext) -> None:
    size = ctx.eval_size
    if size is not None and size >= 1 and not float(size).is_integer():
        ctx.warn(
            f"--eval-size {size} is >= 1, so it is a sample count, but it is not a whole number",
            "use a fraction below 1 (e.g. 0.05) or a whole count (e.g. 500)",
        )


@rule(
    "rule.sft_predict_interval_requirements",
    "sft-predict-interval",
    "loss-type",
    "save",
    "eval-prompt-data",
    "eval-config",
    "eval-size",
    summary="--sft-predict-interval needs --loss-type sft, --save and an eval source.",
)
def sft_predict_interval_requirements(ctx: RuleContext) -> None:
    if ctx.sft_predict_interval is None:
        return
    if not ctx.is_sft:
        ctx.error(
            "--sft-predict-interval is only used with --loss-type sft",
            "remove it",
            fields=("sft-predict-interval", "loss-type"),
        )
    if ctx.save is None:
        ctx.error(
            "--sft-predict-interval writes <save>/predict/, but --save is not set",
            "set --save",
            fields=("sft-predict-interval", "save"),
        )
    if not ctx.eval_prompt_data and ctx.eval_config is None and ctx.eval_size is None:
        ctx.error(
            "--sft-predict-interval needs an eval source: --eval-prompt-data, --eval-config or --eval-size",
            "add --eval-size 0.05",
            fields=("sft-predict-interval", "eval-prompt-data", "eval-config", "eval-size"),
        )


@rule(
    "rule.sft_predict_interval_without_debug_train_only",
    "sft-predict-interval",
    "debug-train-only",
    "load-debug-rollout-data",
    summary="--sft-predict-interval generates with rollout engines, which --debug-train-only does not start.",
    deviation="Relax's start-up checks accept the pair, but with --debug-train-only (or "
    "--load-debug-rollout-data, which turns it on) Relax parses no SGLang arguments and starts no engines, so "
    "the first prediction pass has nothing to generate with. The platform refuses it at submission.",
)
def sft_predict_interval_without_debug_train_only(ctx: RuleContext) -> None:
    if ctx.is_sft and ctx.sft_predict_interval is not None and ctx.debug_train_only:
        why = " (--load-debug-rollout-data turns it on)" if ctx.load_debug_rollout_data is not None else ""
        ctx.error(
            f"--sft-predict-interval generates predictions with rollout engines, but --debug-train-only{why} "
            "starts none",
            "remove --sft-predict-interval, or --debug-train-only",
        )


eval_function_path_default = defaults_to(
    "rule.eval_function_path_default", "eval-function-path", "rollout-function-path"
)


eval_input_key_default = defaults_to("rule.eval_input_key_default", "eval-input-key", "input-key")


eval_max_context_len_default = defaults_to(
    "rule.eval_max_context_len_default", "eval-max-context-len", "rollout-max-context-len", only_if_set=True
)


eval_reward_key_default = defaults_to(
    "rule.eval_reward_key_default", "eval-reward-key", "reward-key", only_if_set=True
)
