"""The megatron backend: Relax's own defaults (`_set_default_megatron_args` in
relax/backends/megatron/arguments.py, run for every job of that backend): the Megatron defaults Relax
resets, precision (fp16 or bf16, their fallbacks and loss scale), sequence-length placeholders, RoPE, the
padded vocabulary, the tokenizer."""

from __future__ import annotations

import math
from typing import Any

from jobspec.arguments import MEGATRON, RELAX_MAIN
from jobspec.generated.arguments import RELAX_MEGATRON_DEFAULTS
from jobspec.rules.context import RuleContext, rule
from jobspec.spec import FIELDS


@rule(
    "rule.relax_resets_megatron_defaults",
    "distributed-timeout-minutes",
    "lr",
    "micro-batch-size",
    "mtp-loss-scaling-factor",
    summary="Relax's parser resets some Megatron defaults (--distributed-timeout-minutes 30 instead of 10, "
    "--lr 1e-6, --micro-batch-size 1, ...); on the megatron backend the ones left unset are shown as derived.",
)
def relax_resets_megatron_defaults(ctx: RuleContext) -> None:
    if not ctx.megatron:
        return
    for name, value in RELAX_MEGATRON_DEFAULTS[RELAX_MAIN].items():
        if name in FIELDS and not ctx.given(name) and ctx.values[name] == value:
            if MEGATRON[name]["default"] != value:
                ctx.derive(name, value)


@rule(
    "rule.megatron_backend_defaults",
    "use-distributed-optimizer",
    "dist-ckpt-save-pre-mcore-014",
    summary="The megatron backend always uses Megatron's distributed optimizer and saves checkpoints in the "
    "pre-mcore-0.14 layout (derived, as Relax does).",
)
def megatron_backend_defaults(ctx: RuleContext) -> None:
    if ctx.megatron:
        ctx.turn_on("use_distributed_optimizer", "dist_ckpt_save_pre_mcore_014")


@rule(
    "rule.fp16_and_bf16_exclusive",
    "fp16",
    "bf16",
    summary="Relax trains in bf16 unless --fp16 (bf16 = not fp16; derived on the megatron backend); --bf16 "
    "given with --fp16 is turned off (warning).",
)
def fp16_and_bf16_exclusive(ctx: RuleContext) -> None:
    if ctx.fp16 and ctx.bf16:
        ctx.warn(
            "--fp16 and --bf16 are both set: Relax trains in fp16 and turns --bf16 off (bf16 = not fp16)",
            "keep one precision",
        )
        ctx.derive("bf16", False)
    elif ctx.megatron and not ctx.fp16 and not ctx.bf16:
        ctx.derive("bf16", True)


@rule(
    "rule.bf16_grads_in_fp32",
    "bf16",
    "accumulate-allreduce-grads-in-fp32",
    "grad-reduce-in-bf16",
    "main-grads-dtype",
    summary="Under bf16 Megatron accumulates and all-reduces gradients in fp32 unless --grad-reduce-in-bf16 "
    "(or --main-grads-dtype other than fp32): derived as Megatron's validate_args does.",
)
def bf16_grads_in_fp32(ctx: RuleContext) -> None:
    values = ctx.values
    if not ctx.megatron_validates or not values["bf16"]:
        return
    if values["grad_reduce_in_bf16"]:
        if values["accumulate_allreduce_grads_in_fp32"]:
            ctx.derive("accumulate_allreduce_grads_in_fp32", False)
    elif not values["accumulate_allreduce_grads_in_fp32"] and values["main_grads_dtype"] in ("fp32", None):
        ctx.derive("accumulate_allreduce_grads_in_fp32", True)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


#: Relax's FP16 compatibility values (`_resolve_optimizer_precision_args`), applied to options left unset.
FP16_FALLBACKS: dict[str, Any] = {
    "initial_loss_scale": 32768.0,
    "min_loss_scale": 1.0,
    "use_precision_aware_optimizer": True,
    "store_param_remainders": False,
}


@rule(
    "rule.fp16_compat_fallbacks",
    "fp16",
    "store-param-remainders",
    "initial-loss-scale",
    "min-loss-scale",
    "use-precision-aware-optimizer",
    summary="On the megatron backend with --fp16, Relax fills FP16 optimizer options left unset with "
    "compatibility values and warns (derived). With Megatron 3714d81's defaults only --store-param-remainders "
    "can be unset (off under FP16); the loss scales and --use-precision-aware-optimizer keep Megatron's "
    "defaults (2**32, 1.0, off), and a static --loss-scale skips the scales.",
)
def fp16_compat_fallbacks(ctx: RuleContext) -> None:
    if not ctx.megatron or not ctx.fp16:
        return
    applied = []
    for name, value in FP16_FALLBACKS.items():
        if ctx.loss_scale is not None and name in ("initial_loss_scale", "min_loss_scale"):
            continue
        if ctx.values[name] is None:
            ctx.derive(name, value)
            shown = f"--{FIELDS[name].flag}" if value is True else f"--no-{FIELDS[name].flag}"
            applied.append(shown if isinstance(value, bool) else f"--{FIELDS[name].flag} {_fmt(value)}")
    if applied:
        ctx.warn(
            "FP16 optimizer options were not set; Relax uses its compatibility fallbacks: "
            + ", ".join(applied),
            f"pass {', '.join(applied)} explicitly to silence this warning",
            fields=("fp16", *(FIELDS[n].flag for n in FP16_FALLBACKS if n in ctx.derived)),
        )


@rule(
    "rule.fp16_dynamic_loss_scale_valid",
    "initial-loss-scale",
    "min-loss-scale",
    summary="Dynamic FP16 loss scaling (--fp16 without --loss-scale): both scales finite and > 0, and "
    "--min-loss-scale <= --initial-loss-scale.",
)
def fp16_dynamic_loss_scale_valid(ctx: RuleContext) -> None:
    if not ctx.fp16 or ctx.loss_scale is not None:
        return
    init, low = ctx.initial_loss_scale, ctx.min_loss_scale
    bad = False
    for name, value in (("initial_loss_scale", init), ("min_loss_scale", low)):
        if not math.isfinite(value) or value <= 0:
            bad = True
            ctx.error(
                f"--{FIELDS[name].flag} {value} must be a finite number > 0 for dynamic loss scaling",
                "use a positive scale",
                fields=(FIELDS[name].flag,),
            )
    if not bad and low > init:
        ctx.error(
            f"--min-loss-scale {_fmt(low)} > --initial-loss-scale {_fmt(init)}",
            "use min_loss_scale <= initial_loss_scale",
        )


@rule(
    "rule.loss_scale_options_need_dynamic_fp16",
    "fp16",
    "loss-scale",
    "initial-loss-scale",
    "min-loss-scale",
    summary="Loss-scale options only apply with --fp16, and the dynamic scales not with a static --loss-scale "
    "(warning).",
)
def loss_scale_options_need_dynamic_fp16(ctx: RuleContext) -> None:
    names = ("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis")
    if not ctx.fp16:
        ctx.warn_ignored(ctx.non_defaults(*names), "fp16", hint="remove them or add --fp16")
    elif ctx.loss_scale is not None:
        ctx.warn_ignored(
            ctx.non_defaults("initial_loss_scale", "min_loss_scale"),
            "loss-scale",
            why="are not used with a static --loss-scale",
            hint="remove them",
        )


@rule(
    "rule.megatron_sequence_length_placeholders",
    "seq-length",
    "max-position-embeddings",
    summary="On the megatron backend an unset --seq-length is 4096 and --max-position-embeddings is set to "
    "--seq-length (Relax's placeholders: samples have variable length; derived).",
)
def megatron_sequence_length_placeholders(ctx: RuleContext) -> None:
    if not ctx.megatron:
        return
    if ctx.seq_length is None:
        ctx.derive("seq_length", 4096)
    if ctx.max_position_embeddings != ctx.seq_length:
        ctx.derive("max_position_embeddings", ctx.seq_length)


@rule(
    "rule.megatron_rope_type",
    "rope-type",
    "multi-latent-attention",
    summary="On the megatron backend an unset --rope-type is yarn with --multi-latent-attention, else rope "
    "(derived).",
)
def megatron_rope_type(ctx: RuleContext) -> None:
    if ctx.megatron and ctx.rope_type is None:
        ctx.derive("rope_type", "yarn" if ctx.multi_latent_attention else "rope")


@rule(
    "rule.megatron_padded_vocab_size",
    "vocab-size",
    "padded-vocab-size",
    "make-vocab-size-divisible-by",
    "tensor-model-parallel-size",
    summary="On the megatron backend --vocab-size without --padded-vocab-size is padded up to a multiple of "
    "make_vocab_size_divisible_by x TP (derived, as Megatron pads it).",
)
def megatron_padded_vocab_size(ctx: RuleContext) -> None:
    if not ctx.megatron or not ctx.vocab_size or ctx.padded_vocab_size:
        return
    multiple = ctx.make_vocab_size_divisible_by * ctx.tensor_model_parallel_size
    if multiple > 0:
        ctx.derive("padded_vocab_size", -(-ctx.vocab_size // multiple) * multiple)


@rule(
    "rule.megatron_tokenizer_from_hf_checkpoint",
    "tokenizer-model",
    "tokenizer-type",
    "hf-checkpoint",
    summary="On the megatron backend, with neither --tokenizer-model nor --tokenizer-type, the tokenizer is "
    "--hf-checkpoint's (HuggingFaceTokenizer; derived).",
)
def megatron_tokenizer_from_hf_checkpoint(ctx: RuleContext) -> None:
    if not ctx.megatron or ctx.tokenizer_model or ctx.tokenizer_type or ctx.hf_checkpoint is None:
        return
    ctx.derive("tokenizer_model", ctx.hf_checkpoint)
    ctx.derive("tokenizer_type", "HuggingFaceTokenizer")
