"""Checkpoints: saving, rotating and keeping them, the HF checkpoint and the initial weights."""

from __future__ import annotations

from jobspec.rules.context import RuleContext, cli_flags, rule


@rule("rule.save_interval_needs_save", "save-interval", "save", summary="--save-interval needs --save.")
def save_interval_needs_save(ctx: RuleContext) -> None:
    if ctx.save_interval is not None and ctx.save is None:
        ctx.error(f"--save-interval {ctx.save_interval} is set but --save is not", "set --save DIR")


@rule(
    "rule.rotate_ckpt_requirements",
    "rotate-ckpt",
    "save",
    "save-interval",
    "async-save",
    summary="--rotate-ckpt needs --save, --save-interval and --async-save.",
)
def rotate_ckpt_requirements(ctx: RuleContext) -> None:
    if not ctx.rotate_ckpt:
        return
    missing = [n for n in ("save", "save_interval") if ctx.values[n] is None]
    if not ctx.async_save:
        missing.append("async_save")
    if missing:
        ctx.error(f"--rotate-ckpt needs {cli_flags(*missing)}", f"add {cli_flags(*missing)}")


@rule(
    "rule.max_actor_ckpt_to_keep_needs_save",
    "max-actor-ckpt-to-keep",
    "save",
    summary="--max-actor-ckpt-to-keep only matters with --save (warning).",
)
def max_actor_ckpt_to_keep_needs_save(ctx: RuleContext) -> None:
    if ctx.max_actor_ckpt_to_keep is not None and ctx.save is None:
        ctx.warn(
            "--max-actor-ckpt-to-keep is set but nothing is saved (--save is not set)",
            "set --save or remove it",
        )


@rule(
    "rule.hf_checkpoint_required",
    "hf-checkpoint",
    summary="--hf-checkpoint is required: it initialises SGLang and provides the tokenizer.",
    deviation="Relax's start-up checks do not require it; a job without it fails later, when Relax loads the "
    "tokenizer or starts SGLang. The platform refuses it at submission instead.",
)
def hf_checkpoint_required(ctx: RuleContext) -> None:
    if ctx.hf_checkpoint is None:
        ctx.error(
            "--hf-checkpoint is not set; Relax needs it for the tokenizer and to start SGLang",
            "set --hf-checkpoint to a Hugging Face model directory",
        )


@rule(
    "rule.initial_weights",
    "load",
    "ref-load",
    "hf-checkpoint",
    "megatron-to-hf-mode",
    summary="The megatron backend in raw mode starts from --load or --ref-load; without either it starts "
    "from random weights (warning).",
)
def initial_weights(ctx: RuleContext) -> None:
    if (
        ctx.train_backend == "megatron"
        and ctx.megatron_to_hf_mode == "raw"
        and not ctx.debug_rollout_only
        and ctx.load is None
        and ctx.ref_load is None
    ):
        ctx.warn(
            "neither --load nor --ref-load is set: in raw mode Megatron would start from random weights "
            "(--hf-checkpoint only provides the architecture and tokenizer)",
            "set --ref-load to a Megatron checkpoint, or use --megatron-to-hf-mode bridge to load --hf-checkpoint",
        )
