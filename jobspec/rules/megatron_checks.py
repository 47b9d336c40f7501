"""The megatron backend: Megatron-LM's `validate_args` (3714d81) and Relax's additions to it. Relax
skips them with --debug-rollout-only; the torch backend refuses these parameters by name."""

from __future__ import annotations

from jobspec.rules.context import RuleContext, cli_flags, flags_of, requires, rule


@rule(
    "rule.megatron_expert_tensor_parallel_default",
    "expert-tensor-parallel-size",
    "tensor-model-parallel-size",
    summary="An unset --expert-tensor-parallel-size is --tensor-model-parallel-size (derived, Megatron).",
)
def megatron_expert_tensor_parallel_default(ctx: RuleContext) -> None:
    if ctx.megatron_validates and ctx.expert_tensor_parallel_size is None:
        ctx.derive("expert_tensor_parallel_size", ctx.tensor_model_parallel_size)


@rule(
    "rule.megatron_recompute_activations",
    "recompute-activations",
    "recompute-granularity",
    summary="--recompute-activations means --recompute-granularity selective (derived, Megatron; a different "
    "granularity is overridden with a warning).",
)
def megatron_recompute_activations(ctx: RuleContext) -> None:
    if not ctx.megatron_validates or not ctx.recompute_activations:
        return
    if ctx.recompute_granularity == "full":
        ctx.warn(
            "--recompute-activations sets --recompute-granularity selective, overriding full",
            "remove --recompute-activations to recompute full layers",
            fields=("recompute-activations", "recompute-granularity"),
        )
    if ctx.recompute_granularity != "selective":
        ctx.derive("recompute_granularity", "selective")


@rule(
    "rule.megatron_rotary_position_embeddings",
    "use-rotary-position-embeddings",
    "position-embedding-type",
    summary="--use-rotary-position-embeddings means --position-embedding-type rope (derived, Megatron).",
)
def megatron_rotary_position_embeddings(ctx: RuleContext) -> None:
    if (
        ctx.megatron_validates
        and ctx.use_rotary_position_embeddings
        and ctx.position_embedding_type != "rope"
    ):
        ctx.derive("position_embedding_type", "rope")


@rule(
    "rule.moe_token_dispatcher_alltoall",
    "moe-token-dispatcher-type",
    summary="Relax trains on variable-length sequences, which the allgather MoE dispatcher does not support: "
    "allgather (Megatron's default) becomes alltoall (derived; a warning when allgather was given).",
)
def moe_token_dispatcher_alltoall(ctx: RuleContext) -> None:
    if not ctx.megatron_validates or ctx.moe_token_dispatcher_type != "allgather":
        return
    if ctx.given("moe_token_dispatcher_type"):
        ctx.warn(
            "--moe-token-dispatcher-type allgather does not support variable sequence lengths; Relax uses alltoall",
            "write --moe-token-dispatcher-type alltoall (or flex)",
        )
    ctx.derive("moe_token_dispatcher_type", "alltoall")


@rule(
    "rule.sequence_parallel_needs_tp",
    "sequence-parallel",
    "tensor-model-parallel-size",
    summary="--sequence-parallel needs --tensor-model-parallel-size > 1; Megatron turns it off otherwise "
    "(derived, with a warning).",
)
def sequence_parallel_needs_tp(ctx: RuleContext) -> None:
    if ctx.sequence_parallel and ctx.tensor_model_parallel_size == 1:
        ctx.warn(
            "--sequence-parallel has no effect with --tensor-model-parallel-size 1 (Megatron disables it)",
            "remove --sequence-parallel or raise TP",
        )
        if ctx.megatron_validates:
            ctx.derive("sequence_parallel", False)


@rule(
    "rule.recompute_options",
    "recompute-granularity",
    "recompute-method",
    "recompute-num-layers",
    summary="Megatron's recompute settings: full needs --recompute-method and --recompute-num-layers, "
    "selective takes neither; without a granularity they are ignored (warning).",
)
def recompute_options(ctx: RuleContext) -> None:
    granularity = ctx.recompute_granularity
    options = ("recompute_method", "recompute_num_layers")
    used = [n for n in options if ctx.values[n] is not None]
    if granularity is None:
        if used:
            ctx.warn(
                f"{cli_flags(*used)} have no effect without --recompute-granularity",
                "add --recompute-granularity full",
                fields=("recompute-granularity", *flags_of(*used)),
            )
    elif granularity == "full":
        missing = [n for n in options if n not in used]
        if missing:
            ctx.error(
                f"--recompute-granularity full needs {cli_flags(*missing)}",
                "e.g. --recompute-method uniform --recompute-num-layers 1",
                fields=("recompute-granularity", *flags_of(*missing)),
            )
    elif used:
        why = " (--recompute-activations selects it)" if ctx.recompute_activations else ""
        ctx.error(
            f"--recompute-granularity selective{why} takes no {cli_flags(*used)}",
            f"remove {cli_flags(*used)}, or use --recompute-granularity full",
            fields=("recompute-granularity", *flags_of(*used)),
        )


@rule(
    "rule.attention_heads_shape",
    "num-attention-heads",
    "num-query-groups",
    "group-query-attention",
    "tensor-model-parallel-size",
    summary="Model shape vs TP: heads (and, with --group-query-attention, query groups) divisible by TP; "
    "--num-query-groups only applies with --group-query-attention (warnings).",
)
def attention_heads_shape(ctx: RuleContext) -> None:
    tp = ctx.tensor_model_parallel_size
    if ctx.num_attention_heads is not None and ctx.num_attention_heads % tp:
        ctx.error(
            f"--num-attention-heads {ctx.num_attention_heads} is not divisible by "
            f"--tensor-model-parallel-size {tp}",
            "choose a TP size that divides the head count",
            fields=("num-attention-heads", "tensor-model-parallel-size"),
        )
    if not ctx.group_query_attention:
        if ctx.given("num_query_groups") and ctx.non_default("num_query_groups"):
            ctx.warn(
                f"--num-query-groups {ctx.num_query_groups} is ignored without --group-query-attention",
                "add --group-query-attention",
                fields=("num-query-groups", "group-query-attention"),
            )
        return
    if not ctx.given("num_query_groups"):
        ctx.warn(
            "--group-query-attention without --num-query-groups uses Megatron's default of 1 group "
            "(multi-query attention)",
            "set --num-query-groups to the model's number of key/value heads",
            fields=("group-query-attention", "num-query-groups"),
        )
    if ctx.num_query_groups % tp:
        ctx.error(
            f"--num-query-groups {ctx.num_query_groups} is not divisible by --tensor-model-parallel-size {tp}",
            "choose a TP size that divides the query groups",
            fields=("num-query-groups", "tensor-model-parallel-size"),
        )


@rule(
    "rule.experts_divisible_by_expert_parallel",
    "num-experts",
    "expert-model-parallel-size",
    summary="--expert-model-parallel-size > 1 needs --num-experts, divisible by it (Megatron).",
)
def experts_divisible_by_expert_parallel(ctx: RuleContext) -> None:
    ep = ctx.expert_model_parallel_size
    if ctx.num_experts is not None and ctx.num_experts % ep:
        ctx.error(
            f"--num-experts {ctx.num_experts} is not divisible by --expert-model-parallel-size {ep}",
            "choose an EP size that divides the expert count",
        )
    elif not ctx.num_experts and ep > 1:
        ctx.error(
            f"--expert-model-parallel-size {ep} needs --num-experts (expert parallelism splits a MoE model's "
            "experts)",
            "set --num-experts, or use --expert-model-parallel-size 1 for a dense model",
        )


@rule(
    "rule.megatron_uneven_pipeline_needs_pp",
    "decoder-first-pipeline-num-layers",
    "decoder-last-pipeline-num-layers",
    "pipeline-model-parallel-size",
    summary="--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1 (Relax).",
)
def megatron_uneven_pipeline_needs_pp(ctx: RuleContext) -> None:
    if not ctx.megatron_validates or ctx.pipeline_model_parallel_size != 1:
        return
    used = [
        n
        for n in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
        if ctx.values[n] is not None
    ]
    if used:
        ctx.error(
            f"{cli_flags(*used)} shape the first/last pipeline stage, but --pipeline-model-parallel-size is 1",
            f"remove {cli_flags(*used)}, or raise --pipeline-model-parallel-size",
            fields=(*flags_of(*used), "pipeline-model-parallel-size"),
        )


@rule(
    "rule.context_parallel_needs_per_token_loss",
    "context-parallel-size",
    "calculate-per-token-loss",
    summary="--context-parallel-size > 1 needs --calculate-per-token-loss (Relax, for Megatron-Bridge).",
)
def context_parallel_needs_per_token_loss(ctx: RuleContext) -> None:
    if ctx.megatron_validates and ctx.context_parallel_size > 1 and not ctx.calculate_per_token_loss:
        ctx.error(
            f"--context-parallel-size {ctx.context_parallel_size} needs --calculate-per-token-loss",
            "add --calculate-per-token-loss",
        )


@rule(
    "rule.megatron_save_needs_save_interval",
    "save",
    "save-interval",
    summary="On the megatron backend --save needs --save-interval (Megatron's check).",
)
def megatron_save_needs_save_interval(ctx: RuleContext) -> None:
    if ctx.megatron_validates and ctx.save is not None and ctx.save_interval is None:
        ctx.error(
            "--save is set without --save-interval, which Megatron requires with it",
            "add --save-interval N (rollouts between checkpoints)",
        )


@rule(
    "rule.megatron_min_lr_within_lr",
    "min-lr",
    "lr",
    summary="--min-lr must not exceed --lr (Megatron).",
)
def megatron_min_lr_within_lr(ctx: RuleContext) -> None:
    if ctx.megatron_validates and ctx.lr is not None and ctx.min_lr > ctx.lr:
        ctx.error(f"--min-lr {ctx.min_lr} > --lr {ctx.lr}", "use min_lr <= lr")


@rule(
    "rule.optimizer_cpu_offload_needs_precision_aware_optimizer",
    "optimizer-cpu-offload",
    "use-precision-aware-optimizer",
    summary="--optimizer-cpu-offload needs --use-precision-aware-optimizer (Megatron).",
)
def optimizer_cpu_offload_needs_precision_aware_optimizer(ctx: RuleContext) -> None:
    if ctx.megatron_validates and ctx.optimizer_cpu_offload and not ctx.use_precision_aware_optimizer:
        ctx.error(
            "--optimizer-cpu-offload needs --use-precision-aware-optimizer (its hybrid optimizer reuses that path)",
            "add --use-precision-aware-optimizer",
        )


overlap_param_gather_needs_overlap_grad_reduce = requires(
    "rule.overlap_param_gather_needs_overlap_grad_reduce",
    "overlap-param-gather",
    "overlap-grad-reduce",
    summary="--overlap-param-gather needs --overlap-grad-reduce (Megatron); the distributed optimizer it also "
    "needs is always on under Relax.",
)


@rule(
    "rule.optimizer_overlap_compatibility",
    "overlap-grad-reduce",
    "overlap-param-gather",
    "num-experts",
    "expert-model-parallel-size",
    "multimodal-keys",
    "context-parallel-size",
    summary="The reference's compatibility table marks --overlap-grad-reduce / --overlap-param-gather as "
    "unsupported for MoE models and for vision-language models with CP > 1; Relax's code accepts them "
    "(warning).",
)
def optimizer_overlap_compatibility(ctx: RuleContext) -> None:
    used = [n for n in ("overlap_grad_reduce", "overlap_param_gather") if ctx.values[n]]
    if not used:
        return
    moe = ctx.num_experts is not None or ctx.expert_model_parallel_size > 1
    if moe:
        ctx.warn(
            f"{cli_flags(*used)} are marked unsupported for MoE models in the reference's compatibility table",
            "remove them if training stalls or diverges; --use-distributed-optimizer is fine",
            fields=(*flags_of(*used), "num-experts", "expert-model-parallel-size"),
        )
    if ctx.multimodal_keys and ctx.context_parallel_size > 1:
        ctx.warn(
            f"{cli_flags(*used)} are marked unsupported for vision-language models with --context-parallel-size "
            f"{ctx.context_parallel_size} > 1 in the reference's compatibility table",
            "remove them, or use CP = 1",
            fields=(*flags_of(*used), "multimodal-keys", "context-parallel-size"),
        )


cpu_optimizer_overlap_needs_offload = requires(
    "rule.cpu_optimizer_overlap_needs_offload",
    "overlap-cpu-optimizer-d2h-h2d",
    "optimizer-cpu-offload",
    summary="--overlap-cpu-optimizer-d2h-h2d only applies with --optimizer-cpu-offload (warning).",
    message="--overlap-cpu-optimizer-d2h-h2d only applies with --optimizer-cpu-offload",
    warn=True,
)
