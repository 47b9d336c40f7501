"""Batch sizes and token budgets (rollout and global batch, steps per rollout, over-sampling, rollouts or
epochs, dynamic batch sizes, the bshd layout), then prompt and context lengths."""

from __future__ import annotations

from jobspec.rules.context import RuleContext, defaults_to, exclusive, requires, rule

# =============================================================================================
# Batch sizes

_WHOLE_STEPS = (
    "The platform splits every rollout into whole optimizer steps of --global-batch-size samples, so the "
    "rollout's samples must be a multiple of it (slime, which Relax derives from, checks this at start-up; "
    "Relax's code does not, and a remainder would not be a whole step)."
)


@rule(
    "rule.rollout_batch_size_required",
    "rollout-batch-size",
    "global-batch-size",
    "n-samples-per-prompt",
    summary="--rollout-batch-size is required; Relax derives it as global_batch_size // n_samples_per_prompt "
    "when only --global-batch-size is given.",
    deviation="When --global-batch-size is not a multiple of --n-samples-per-prompt, Relax floors the "
    "division; the platform refuses it. " + _WHOLE_STEPS,
)
def rollout_batch_size_required(ctx: RuleContext) -> None:
    if ctx.rollout_batch_size is not None:
        return
    if ctx.global_batch_size is None:
        ctx.error(
            "--rollout-batch-size is required (prompts per rollout round)",
            "set --rollout-batch-size, e.g. --rollout-batch-size 32",
            fields=("rollout-batch-size",),
        )
        return
    if ctx.global_batch_size % ctx.n_samples_per_prompt:
        ctx.error(
            f"--rollout-batch-size is not set and --global-batch-size {ctx.global_batch_size} is not a multiple "
            f"of --n-samples-per-prompt {ctx.n_samples_per_prompt}, so it cannot be derived",
            "set --rollout-batch-size",
        )
        return
    ctx.derive("rollout_batch_size", ctx.global_batch_size // ctx.n_samples_per_prompt)


@rule(
    "rule.num_steps_per_rollout_sets_global_batch_size",
    "num-steps-per-rollout",
    "global-batch-size",
    "rollout-batch-size",
    "n-samples-per-prompt",
    summary="--num-steps-per-rollout derives global_batch_size = rollout_batch_size * n_samples_per_prompt / "
    "num_steps_per_rollout; it must divide, and a different explicit --global-batch-size is an error.",
    deviation="When --num-steps-per-rollout does not divide the rollout's samples, Relax floors the "
    "division; the platform refuses it. " + _WHOLE_STEPS,
)
def num_steps_per_rollout_sets_global_batch_size(ctx: RuleContext) -> None:
    steps = ctx.num_steps_per_rollout
    if steps is None or ctx.rollout_batch_size is None:
        return
    samples = ctx.rollout_batch_size * ctx.n_samples_per_prompt
    if samples % steps:
        ctx.error(
            f"rollout_batch_size * n_samples_per_prompt = {ctx.rollout_batch_size} * {ctx.n_samples_per_prompt} "
            f"= {samples} samples cannot be split into --num-steps-per-rollout {steps} equal steps",
            f"choose --num-steps-per-rollout dividing {samples}",
        )
        return
    gbs = samples // steps
    if ctx.global_batch_size is not None and ctx.global_batch_size != gbs:
        ctx.error(
            f"--global-batch-size {ctx.global_batch_size} contradicts --num-steps-per-rollout {steps}, which "
            f"implies {samples} / {steps} = {gbs}",
            "set only one of --global-batch-size and --num-steps-per-rollout",
        )
        return
    if ctx.global_batch_size is None:
        ctx.derive("global_batch_size", gbs)


@rule(
    "rule.global_batch_size_divides_rollout",
    "global-batch-size",
    "rollout-batch-size",
    "n-samples-per-prompt",
    summary="--global-batch-size must divide rollout_batch_size * n_samples_per_prompt.",
    deviation="Relax's code does not check it. " + _WHOLE_STEPS,
)
def global_batch_size_divides_rollout(ctx: RuleContext) -> None:
    gbs, rbs = ctx.global_batch_size, ctx.rollout_batch_size
    if gbs is None or rbs is None or "global_batch_size" in ctx.derived:
        return
    samples = rbs * ctx.n_samples_per_prompt
    if samples % gbs:
        ctx.error(
            f"--global-batch-size {gbs} does not divide rollout_batch_size * n_samples_per_prompt = "
            f"{rbs} * {ctx.n_samples_per_prompt} = {samples}",
            f"use a --global-batch-size that divides {samples} (or set --num-steps-per-rollout)",
        )


@rule(
    "rule.over_sampling_batch_size",
    "over-sampling-batch-size",
    "rollout-batch-size",
    summary="--over-sampling-batch-size defaults to --rollout-batch-size and must be >= it.",
)
def over_sampling_batch_size(ctx: RuleContext) -> None:
    if ctx.rollout_batch_size is None:
        return
    if ctx.over_sampling_batch_size is None:
        ctx.derive("over_sampling_batch_size", ctx.rollout_batch_size)
        return
    if ctx.over_sampling_batch_size < ctx.rollout_batch_size:
        ctx.error(
            f"--over-sampling-batch-size {ctx.over_sampling_batch_size} is smaller than --rollout-batch-size "
            f"{ctx.rollout_batch_size}",
            f"set --over-sampling-batch-size >= {ctx.rollout_batch_size} or leave it unset",
        )
    elif ctx.over_sampling_batch_size > ctx.rollout_batch_size and not (
        ctx.fully_async or ctx.partial_rollout
    ):
        ctx.warn(
            f"--over-sampling-batch-size {ctx.over_sampling_batch_size} > --rollout-batch-size "
            f"{ctx.rollout_batch_size} without --fully-async or --partial-rollout: surplus groups are "
            "discarded each step, not carried over",
            "add --partial-rollout, or set both sizes equal",
            fields=("over-sampling-batch-size", "rollout-batch-size", "partial-rollout", "fully-async"),
        )


@rule(
    "rule.num_rollout_or_num_epoch",
    "num-rollout",
    "num-epoch",
    summary="Set --num-rollout or --num-epoch; with both, --num-rollout wins (warning).",
)
def num_rollout_or_num_epoch(ctx: RuleContext) -> None:
    if ctx.num_rollout is None and ctx.num_epoch is None:
        ctx.error("neither --num-rollout nor --num-epoch is set", "set --num-rollout (or --num-epoch)")
    elif ctx.num_rollout is not None and ctx.num_epoch is not None:
        ctx.warn(
            f"--num-rollout {ctx.num_rollout} and --num-epoch {ctx.num_epoch} are both set; --num-epoch is ignored",
            "remove --num-epoch",
        )


@rule(
    "rule.num_epoch_needs_rollout_global_dataset",
    "num-epoch",
    "disable-rollout-global-dataset",
    summary="RL with --num-epoch counts epochs of the global dataset: --disable-rollout-global-dataset cannot "
    "be set with it.",
)
def num_epoch_needs_rollout_global_dataset(ctx: RuleContext) -> None:
    if ctx.num_epoch is not None and not ctx.is_sft and not ctx.rollout_global_dataset:
        ctx.error(
            "--num-epoch counts passes over the global dataset, but --disable-rollout-global-dataset turns it off",
            "remove --disable-rollout-global-dataset, or use --num-rollout",
        )


# --max-tokens-per-gpu is None or >= 1 here: "not set" and "false" are one
dynamic_batch_needs_max_tokens_per_gpu = requires(
    "rule.dynamic_batch_needs_max_tokens_per_gpu",
    "use-dynamic-batch-size",
    "max-tokens-per-gpu",
    summary="--use-dynamic-batch-size needs --max-tokens-per-gpu.",
    message="--use-dynamic-batch-size is set without --max-tokens-per-gpu",
    hint="set --max-tokens-per-gpu (about max_response_len / context_parallel_size)",
)


log_probs_max_tokens_per_gpu_default = defaults_to(
    "rule.log_probs_max_tokens_per_gpu_default",
    "log-probs-max-tokens-per-gpu",
    "max-tokens-per-gpu",
    only_if_set=True,
)


@rule(
    "rule.dynamic_batch_token_budget",
    "max-tokens-per-gpu",
    "context-parallel-size",
    "rollout-max-context-len",
    summary="With dynamic batching, max_tokens_per_gpu * context_parallel_size must hold rollout_max_context_len.",
)
def dynamic_batch_token_budget(ctx: RuleContext) -> None:
    if (
        not ctx.use_dynamic_batch_size
        or ctx.max_tokens_per_gpu is None
        or ctx.rollout_max_context_len is None
    ):
        return
    budget = ctx.max_tokens_per_gpu * ctx.context_parallel_size
    if budget < ctx.rollout_max_context_len:
        ctx.error(
            f"max_tokens_per_gpu * context_parallel_size = {ctx.max_tokens_per_gpu} * {ctx.context_parallel_size} "
            f"= {budget} < rollout_max_context_len {ctx.rollout_max_context_len}: one long sample would form an "
            "oversized micro-batch and run out of memory",
            "raise --max-tokens-per-gpu (or --context-parallel-size), or lower --rollout-max-context-len",
        )


bshd_without_dynamic_batch = exclusive(
    "rule.bshd_without_dynamic_batch",
    "qkv-format",
    "use-dynamic-batch-size",
    a_is="bshd",
    message="--qkv-format bshd does not support --use-dynamic-batch-size",
    summary="--qkv-format bshd does not support --use-dynamic-batch-size.",
    hint="remove --use-dynamic-batch-size and set --micro-batch-size, or use --qkv-format thd",
)


@rule(
    "rule.bshd_needs_micro_batch_size",
    "qkv-format",
    "micro-batch-size",
    summary="--qkv-format bshd batches statically by --micro-batch-size: set it explicitly (warning).",
)
def bshd_needs_micro_batch_size(ctx: RuleContext) -> None:
    if ctx.qkv_format == "bshd" and not ctx.given("micro_batch_size"):
        ctx.warn(
            "--qkv-format bshd batches by --micro-batch-size, which is not set (default 1)",
            "set --micro-batch-size explicitly",
        )


@rule(
    "rule.bshd_needs_megatron",
    "qkv-format",
    "train-backend",
    summary="--qkv-format bshd is only supported by the megatron backend.",
)
def bshd_needs_megatron(ctx: RuleContext) -> None:
    if ctx.qkv_format == "bshd" and ctx.train_backend != "megatron":
        ctx.error(
            f"--qkv-format bshd needs --train-backend megatron, got {ctx.train_backend}",
            "remove --qkv-format bshd",
        )


@rule(
    "rule.micro_batch_size_ignored_with_dynamic_batch",
    "micro-batch-size",
    "use-dynamic-batch-size",
    summary="--micro-batch-size is ignored with --use-dynamic-batch-size (warning).",
)
def micro_batch_size_ignored_with_dynamic_batch(ctx: RuleContext) -> None:
    if ctx.use_dynamic_batch_size and ctx.given("micro_batch_size") and ctx.micro_batch_size != 1:
        ctx.warn(
            f"--micro-batch-size {ctx.micro_batch_size} is ignored with --use-dynamic-batch-size",
            "remove --micro-batch-size",
        )


@rule(
    "rule.balance_data_no_effect_fully_async",
    "balance-data",
    "fully-async",
    "use-dynamic-batch-size",
    summary="--balance-data changes nothing in fully-async mode with dynamic batching (warning).",
)
def balance_data_no_effect_fully_async(ctx: RuleContext) -> None:
    if ctx.balance_data and ctx.fully_async and ctx.use_dynamic_batch_size and ctx.given("balance_data"):
        ctx.warn(
            "--balance-data has no extra effect: fully-async dynamic batching already balances tokens across DP ranks",
            "remove --balance-data",
        )


# =============================================================================================
# Prompt / context lengths


@rule(
    "rule.rollout_max_prompt_len_default",
    "rollout-max-prompt-len",
    "rollout-max-context-len",
    summary="--rollout-max-prompt-len defaults to rollout_max_context_len - 1 and must not exceed it "
    "(at least one generated token).",
)
def rollout_max_prompt_len_default(ctx: RuleContext) -> None:
    ctx_len = ctx.rollout_max_context_len
    if ctx_len is None:
        return
    if ctx.rollout_max_prompt_len is None:
        ctx.derive("rollout_max_prompt_len", ctx_len - 1)
    elif ctx.rollout_max_prompt_len > ctx_len - 1:
        ctx.error(
            f"--rollout-max-prompt-len {ctx.rollout_max_prompt_len} must be < --rollout-max-context-len {ctx_len} "
            "so that at least one token is generated",
            f"set --rollout-max-prompt-len <= {ctx_len - 1}",
        )


@rule(
    "rule.prompt_len_within_context",
    "rollout-max-prompt-len",
    "rollout-max-response-len",
    "rollout-max-context-len",
    summary="When all three are set explicitly, rollout_max_prompt_len + rollout_max_response_len should fit in "
    "rollout_max_context_len (warning: long responses stop at the context length).",
)
def prompt_len_within_context(ctx: RuleContext) -> None:
    if not all(
        ctx.given(n) and ctx.values[n] is not None
        for n in ("rollout_max_prompt_len", "rollout_max_response_len", "rollout_max_context_len")
    ):
        return
    total = ctx.rollout_max_prompt_len + ctx.rollout_max_response_len
    if total > ctx.rollout_max_context_len:
        ctx.warn(
            f"rollout_max_prompt_len + rollout_max_response_len = {ctx.rollout_max_prompt_len} + "
            f"{ctx.rollout_max_response_len} = {total} > rollout_max_context_len {ctx.rollout_max_context_len}: "
            "a long prompt leaves less than --rollout-max-response-len for the response",
            "lower the prompt or response length, or raise --rollout-max-context-len",
        )


@rule(
    "rule.context_within_position_embeddings",
    "rollout-max-context-len",
    "max-position-embeddings",
    "seq-length",
    summary="--rollout-max-context-len should not exceed the model's max position embeddings (warning).",
)
def context_within_position_embeddings(ctx: RuleContext) -> None:
    limit = ctx.max_position_embeddings or ctx.seq_length
    if ctx.rollout_max_context_len is not None and limit is not None and ctx.rollout_max_context_len > limit:
        ctx.warn(
            f"--rollout-max-context-len {ctx.rollout_max_context_len} exceeds the model's "
            f"{'max position embeddings' if ctx.max_position_embeddings else 'sequence length'} {limit}",
            "keep it within max_position_embeddings of the model's config.json",
        )
