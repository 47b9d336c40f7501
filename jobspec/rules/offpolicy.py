"""Off-policy correction (rollout log-probs, TIS), routing replay, partial rollout, the freeze lists."""

from __future__ import annotations

from jobspec.rules.context import RuleContext, exclusive, implies, options_need, rule


@rule(
    "rule.get_mismatch_metrics_needs_tis_function",
    "get-mismatch-metrics",
    "custom-tis-function-path",
    summary="--get-mismatch-metrics needs --custom-tis-function-path.",
)
def get_mismatch_metrics_needs_tis_function(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.get_mismatch_metrics and ctx.custom_tis_function_path is None:
        ctx.error("--get-mismatch-metrics needs --custom-tis-function-path", "set --custom-tis-function-path")


rollout_logprobs_and_tis_exclusive = exclusive(
    "rule.rollout_logprobs_and_tis_exclusive",
    "use-rollout-logprobs",
    "use-tis",
    message="--use-rollout-logprobs and --use-tis are both set (TIS corrects toward the actor's log-probs)",
    summary="--use-rollout-logprobs and --use-tis cannot both be set.",
    rl_only=True,
)


@rule(
    "rule.tis_clip_range",
    "tis-clip-low",
    "tis-clip",
    summary="--tis-clip-low above --tis-clip clips every importance ratio to one value (warning; Relax accepts it).",
)
def tis_clip_range(ctx: RuleContext) -> None:
    if ctx.tis_clip_low > ctx.tis_clip:
        ctx.warn(
            f"--tis-clip-low {ctx.tis_clip_low} > --tis-clip {ctx.tis_clip}: the clipping range is empty",
            "use tis_clip_low <= tis_clip",
        )


rollout_routing_replay_implies_routing_replay = implies(
    "rule.rollout_routing_replay_implies_routing_replay",
    "use-rollout-routing-replay",
    "use-routing-replay",
    summary="--use-rollout-routing-replay turns on --use-routing-replay (derived).",
)


partial_rollout_and_rollout_routing_replay = exclusive(
    "rule.partial_rollout_and_rollout_routing_replay",
    "partial-rollout",
    "use-rollout-routing-replay",
    message="--partial-rollout (partly off-policy samples) and --use-rollout-routing-replay (exact "
    "train/inference routing) cannot be combined",
    summary="--partial-rollout and --use-rollout-routing-replay are mutually exclusive.",
    rl_only=True,
)


partial_rollout_options = options_need(
    "rule.partial_rollout_options",
    "partial-rollout",
    "partial_rollout_max_aborted_count",
    "mask_offpolicy_in_partial_rollout",
    summary="Partial-rollout options need --partial-rollout (warning).",
    hint="add --partial-rollout or remove them",
    rule_fields=True,
)


freeze_lists_exclusive = exclusive(
    "rule.freeze_lists_exclusive",
    "only-train-params-name-list",
    "freeze-params-name-list",
    message="--only-train-params-name-list and --freeze-params-name-list are both set",
    summary="--only-train-params-name-list and --freeze-params-name-list are mutually exclusive.",
)
