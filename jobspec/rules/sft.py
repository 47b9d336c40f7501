"""SFT (--loss-type sft): its data and dynamic batches, oversize samples, in-flight steps, async
prepacking and the options only SFT reads; also --max-staleness, MTP training and chunked logits."""

from __future__ import annotations

from jobspec.rules.context import RuleContext, implies, requires, rule, value_needs
from jobspec.spec import FIELDS


@rule(
    "rule.sft_needs_prompt_data",
    "loss-type",
    "prompt-data",
    "custom-dataset-class-path",
    summary="--loss-type sft needs --prompt-data (unless --custom-dataset-class-path provides data).",
)
def sft_needs_prompt_data(ctx: RuleContext) -> None:
    if ctx.is_sft and ctx.prompt_data is None and ctx.custom_dataset_class_path is None:
        ctx.error("--loss-type sft needs --prompt-data", "set --prompt-data PATH")


@rule(
    "rule.sft_needs_dynamic_batch_size",
    "loss-type",
    "use-dynamic-batch-size",
    summary="--loss-type sft needs --use-dynamic-batch-size (with --max-tokens-per-gpu).",
)
def sft_needs_dynamic_batch_size(ctx: RuleContext) -> None:
    if ctx.is_sft and not ctx.use_dynamic_batch_size:
        ctx.error(
            "--loss-type sft needs --use-dynamic-batch-size: SFT bounds per-GPU tokens and filters over-long "
            "samples through dynamic batching",
            "add --use-dynamic-batch-size --max-tokens-per-gpu N",
        )


sft_balances_data = implies(
    "rule.sft_balances_data",
    "loss-type",
    "balance-data",
    value="sft",
    summary="--loss-type sft turns on --balance-data (derived): its sampler hands DP ranks uneven counts.",
)


sft_oversize_custom_needs_function_path = value_needs(
    "rule.sft_oversize_custom_needs_function_path",
    "sft-oversize-strategy",
    "custom",
    "sft-oversize-custom-function-path",
    summary="--sft-oversize-strategy custom needs --sft-oversize-custom-function-path (a path without it is a warning).",
    hint="set --sft-oversize-custom-function-path my_pkg.truncate",
    ignored_hint="add --sft-oversize-strategy custom",
    sft_only=True,  # Relax reads these only under SFT (rule.sft_options_need_sft warns)
)


@rule(
    "rule.sft_max_in_flight_steps",
    "sft-max-in-flight-steps",
    "max-staleness",
    "loss-type",
    summary="--sft-max-in-flight-steps (SFT only) sets --max-staleness = steps - 1 (derived; it overrides a "
    "different explicit --max-staleness, with a warning).",
)
def sft_max_in_flight_steps(ctx: RuleContext) -> None:
    steps = ctx.sft_max_in_flight_steps
    if steps is None:
        return
    if not ctx.is_sft:
        ctx.error("--sft-max-in-flight-steps is only used with --loss-type sft", "use --max-staleness for RL")
        return
    if ctx.given("max_staleness") and ctx.max_staleness != steps - 1:
        ctx.warn(
            f"--sft-max-in-flight-steps {steps} sets --max-staleness {steps - 1}, overriding --max-staleness "
            f"{ctx.max_staleness}",
            "set only one of them",
        )
    if ctx.max_staleness != steps - 1:
        ctx.derive("max_staleness", steps - 1)


@rule(
    "rule.sft_async_prepack_requirements",
    "sft-async-prepack",
    "per-rank-fetch",
    "max-staleness",
    "pipeline-model-parallel-size",
    "context-parallel-size",
    "qkv-format",
    summary="--sft-async-prepack needs SFT, --per-rank-fetch, two in-flight steps, PP=1, CP=1, VPP=1 and thd.",
    deviation="--sft-async-prepack comes from the reference (its TransferQueue shard section); neither "
    "eb15c45's nor main's argument code defines it, so these are the reference's stated requirements, not "
    "checks of Relax's code.",
)
def sft_async_prepack_requirements(ctx: RuleContext) -> None:
    if not ctx.sft_async_prepack:
        return
    problems = []
    if not ctx.is_sft:
        problems.append("--loss-type sft")
    if not ctx.per_rank_fetch:
        problems.append("--per-rank-fetch")
    if ctx.max_staleness < 1:
        problems.append("--max-staleness >= 1 (or --sft-max-in-flight-steps >= 2)")
    if ctx.pipeline_model_parallel_size != 1:
        problems.append(f"--pipeline-model-parallel-size 1 (got {ctx.pipeline_model_parallel_size})")
    if ctx.context_parallel_size != 1:
        problems.append(f"--context-parallel-size 1 (got {ctx.context_parallel_size})")
    if ctx.num_layers_per_virtual_pipeline_stage is not None:
        problems.append("no virtual pipeline (--num-layers-per-virtual-pipeline-stage)")
    if ctx.qkv_format != "thd":
        problems.append("--qkv-format thd")
    if problems:
        ctx.error(
            "--sft-async-prepack needs " + "; ".join(problems),
            "fix the listed settings or drop --sft-async-prepack",
        )


@rule(
    "rule.sft_options_need_sft",
    "loss-type",
    "sft-oversize-strategy",
    "sft-prefetch-buffer-size",
    "task-type",
    summary="SFT-only options set without --loss-type sft have no effect (warning).",
)
def sft_options_need_sft(ctx: RuleContext) -> None:
    if ctx.is_sft:
        return
    names = (
        "sft_prefetch_buffer_size",
        "sft_prefetch_chunk_size",
        "sft_prefetch_num_workers",
        "sft_oversize_strategy",
        "sft_invalid_multimodal_strategy",
        "task_type",
        "custom_dataset_class_path",
    )
    ctx.warn_ignored(
        ctx.non_defaults(*names),
        "loss-type",
        why="only apply with --loss-type sft",
        hint="remove them or add --loss-type sft",
    )


@rule(
    "rule.max_staleness_colocate",
    "max-staleness",
    "colocate",
    summary="RL in synchronous colocate mode alternates rollout and training on the same GPUs: --max-staleness "
    "> 0 is accepted (as by Relax) but gives no stale rollouts (warning; SFT's in-flight steps are fine).",
)
def max_staleness_colocate(ctx: RuleContext) -> None:
    if ctx.is_sft or not ctx.colocate or ctx.hybrid or ctx.max_staleness == 0:
        return
    ctx.warn(
        f"--max-staleness {ctx.max_staleness} with --colocate: rollout and training take turns on the same "
        "GPUs, so rollouts do not run ahead of training",
        "use --hybrid (or --fully-async) for stale rollouts, or remove --max-staleness",
    )


enable_mtp_training_needs_mtp_num_layers = requires(
    "rule.enable_mtp_training_needs_mtp_num_layers",
    "enable-mtp-training",
    "mtp-num-layers",
    summary="--enable-mtp-training needs --mtp-num-layers.",
    hint="set --mtp-num-layers (e.g. 1)",
)


@rule(
    "rule.sft_chunked_logits_compatibility",
    "sft-chunked-logits",
    "untie-embeddings-and-output-weights",
    "enable-mtp-training",
    "overlap-moe-expert-parallel-comm",
    summary="--sft-chunked-logits needs untied embeddings (--untie-embeddings-and-output-weights) and cannot be "
    "combined with --enable-mtp-training or --overlap-moe-expert-parallel-comm.",
)
def sft_chunked_logits_compatibility(ctx: RuleContext) -> None:
    if not ctx.sft_chunked_logits:
        return
    if not ctx.untie_embeddings_and_output_weights:
        ctx.error(
            "--sft-chunked-logits needs an output layer of its own, but the embeddings are tied "
            "(--untie-embeddings-and-output-weights is not set)",
            "remove --sft-chunked-logits (its memory gain is small on tied-weight models)",
            fields=("sft-chunked-logits", "untie-embeddings-and-output-weights"),
        )
    for name in ("enable_mtp_training", "overlap_moe_expert_parallel_comm"):
        if ctx.values[name]:
            ctx.error(
                f"--sft-chunked-logits cannot be combined with --{FIELDS[name].flag}",
                "remove one of the two",
                fields=("sft-chunked-logits", FIELDS[name].flag),
            )
