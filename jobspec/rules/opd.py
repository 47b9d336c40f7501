"""On-policy distillation (--use-opd): its type, coefficients, token selection and clips, and where its
teacher comes from (--opd-teacher-load on the megatron backend, an SGLang server, a managed teacher role)."""

from __future__ import annotations

import json

from jobspec.demand import managed_teacher, resource_roles
from jobspec.rules.context import RuleContext, cli_flags, rule
from jobspec.spec import FIELDS


def _opd_on(ctx: RuleContext) -> bool:
    """Relax's `validate_opd_args` runs: RL (not SFT) with --use-opd."""
    return ctx.use_opd and not ctx.is_sft


@rule("rule.use_opd_needs_opd_type", "use-opd", "opd-type", summary="--use-opd needs --opd-type.")
def use_opd_needs_opd_type(ctx: RuleContext) -> None:
    if _opd_on(ctx) and ctx.opd_type is None:
        ctx.error(
            "--use-opd needs --opd-type (sglang: teacher log-probs from an SGLang teacher; megatron: a teacher "
            "checkpoint loaded next to the policy)",
            "add --opd-type sglang",
        )
    elif not ctx.use_opd and ctx.opd_type is not None and not ctx.is_sft:
        ctx.warn(f"--opd-type {ctx.opd_type} has no effect without --use-opd", "add --use-opd")


@rule(
    "rule.opd_coefficients_exclusive",
    "opd-kl-coef",
    "opd-loss-coef",
    summary="On-policy distillation: exactly one of --opd-kl-coef (advantage mode) and --opd-loss-coef (loss "
    "mode) is non-zero.",
)
def opd_coefficients_exclusive(ctx: RuleContext) -> None:
    if not _opd_on(ctx):
        return
    kl, loss = ctx.opd_kl_coef or 0.0, ctx.opd_loss_coef or 0.0
    if (kl != 0) == (loss != 0):
        ctx.error(
            f"exactly one of --opd-kl-coef and --opd-loss-coef must be non-zero, got --opd-kl-coef {kl} and "
            f"--opd-loss-coef {loss}",
            "advantage mode: --opd-kl-coef X --opd-loss-coef 0; loss mode: --opd-kl-coef 0 --opd-loss-coef X",
        )


@rule(
    "rule.opd_token_selection_needs_top_k",
    "opd-token-selection",
    "opd-log-prob-top-k",
    summary="--opd-token-selection other than student_sampled needs --opd-log-prob-top-k > 0.",
)
def opd_token_selection_needs_top_k(ctx: RuleContext) -> None:
    if _opd_on(ctx) and ctx.opd_token_selection != "student_sampled" and ctx.opd_log_prob_top_k <= 0:
        ctx.error(
            f"--opd-token-selection {ctx.opd_token_selection} compares top-k token sets, but "
            f"--opd-log-prob-top-k is {ctx.opd_log_prob_top_k}",
            "set --opd-log-prob-top-k > 0 (e.g. 20), or use --opd-token-selection student_sampled",
        )


@rule(
    "rule.opd_kl_type_for_sampled_tokens",
    "opd-token-selection",
    "opd-kl-type",
    summary="--opd-token-selection student_sampled needs a reverse-KL estimator: --opd-kl-type reverse_kl or "
    "low_var_kl.",
)
def opd_kl_type_for_sampled_tokens(ctx: RuleContext) -> None:
    if (
        _opd_on(ctx)
        and ctx.opd_token_selection == "student_sampled"
        and ctx.opd_kl_type not in ("reverse_kl", "low_var_kl")
    ):
        ctx.error(
            f"--opd-kl-type {ctx.opd_kl_type} is not a reverse-KL estimator, which the student's sampled tokens "
            "need",
            "use --opd-kl-type reverse_kl or low_var_kl, or a top-k --opd-token-selection",
        )


@rule(
    "rule.opd_megatron_needs_teacher_load",
    "opd-type",
    "opd-teacher-load",
    summary="--opd-type megatron needs --opd-teacher-load.",
)
def opd_megatron_needs_teacher_load(ctx: RuleContext) -> None:
    if _opd_on(ctx) and ctx.opd_type == "megatron" and ctx.opd_teacher_load is None:
        ctx.error(
            "--opd-type megatron needs --opd-teacher-load (the teacher checkpoint)", "set --opd-teacher-load"
        )


@rule(
    "rule.opd_clips_positive",
    "opd-per-token-clip",
    "opd-is-clip",
    summary="--opd-per-token-clip and --opd-is-clip, when set, are upper bounds > 0.",
)
def opd_clips_positive(ctx: RuleContext) -> None:
    if not _opd_on(ctx):
        return
    for name in ("opd_per_token_clip", "opd_is_clip"):
        value = ctx.values[name]
        if value is not None and value <= 0:
            ctx.error(
                f"{cli_flags(name)} is {value}, but it is an upper bound on a positive quantity and must be > 0",
                f"set {cli_flags(name)} > 0 (e.g. 10), or leave it unset to disable the clip",
                fields=(FIELDS[name].flag,),
            )


@rule(
    "rule.opd_is_clip_needs_loss_mode",
    "opd-is-clip",
    "opd-loss-coef",
    summary="--opd-is-clip acts in OPD's loss mode only (--opd-loss-coef > 0); otherwise a warning (Relax logs "
    "it and ignores the clip).",
)
def opd_is_clip_needs_loss_mode(ctx: RuleContext) -> None:
    if _opd_on(ctx) and ctx.opd_is_clip is not None and not ctx.opd_loss_coef:
        ctx.warn(
            "--opd-is-clip weights the OPD loss term, but --opd-loss-coef is 0 (advantage mode): it has no effect",
            "remove --opd-is-clip, or use loss mode: --opd-kl-coef 0 --opd-loss-coef X",
        )


@rule(
    "rule.opd_teacher_inputs_need_sglang",
    "opd-teacher-prompt-key",
    "opd-teacher-image-key",
    "opd-type",
    summary="--opd-teacher-prompt-key and --opd-teacher-image-key (on-policy self-distillation's teacher-side "
    "inputs) need --opd-type sglang: a teacher held by the trainer scores the student's own tokens.",
)
def opd_teacher_inputs_need_sglang(ctx: RuleContext) -> None:
    if not _opd_on(ctx) or ctx.opd_type == "sglang":
        return
    for name in ("opd_teacher_prompt_key", "opd_teacher_image_key"):
        if ctx.values[name] is not None:
            ctx.error(
                f"{cli_flags(name)} gives the teacher its own inputs, which only an SGLang teacher reads (the "
                f"trainer's teacher forwards the student's tokens), but --opd-type is {ctx.opd_type}",
                f"remove {cli_flags(name)}, or use --opd-type sglang",
                fields=(FIELDS[name].flag, "opd-type"),
            )


@rule(
    "rule.opd_sglang_teacher_source",
    "opd-type",
    "opd-teacher-url",
    "teacher-hf-checkpoint",
    "opd-teacher-routes",
    "opd-teacher-load",
    summary="--opd-type sglang takes teacher log-probs from --opd-teacher-url or from a Relax-managed teacher "
    "(--teacher-hf-checkpoint or --opd-teacher-routes with a 'teacher' entry in --resource), and must not set "
    "--opd-teacher-load.",
)
def opd_sglang_teacher_source(ctx: RuleContext) -> None:
    if not (_opd_on(ctx) and ctx.opd_type == "sglang"):
        return
    if ctx.opd_teacher_load is not None:
        ctx.error(
            "--opd-teacher-load is set with --opd-type sglang (the teacher is an SGLang server, reached by URL)",
            "remove --opd-teacher-load",
            fields=("opd-type", "opd-teacher-load"),
        )
    if ctx.opd_teacher_url is not None or managed_teacher(ctx.values) or ctx.opd_teacher_routes is not None:
        return  # a URL, a managed teacher, or routes (checked by rule.opd_teacher_routes)
    if ctx.teacher_hf_checkpoint is not None:
        ctx.error(
            "--teacher-hf-checkpoint starts a Relax-managed teacher only with a 'teacher' entry in --resource",
            'add "teacher": [1, N] to --resource (the teacher\'s GPUs)',
            fields=("teacher-hf-checkpoint", "resource"),
        )
        return
    ctx.error(
        "--opd-type sglang needs a teacher: --opd-teacher-url (an SGLang /generate endpoint), or "
        "--teacher-hf-checkpoint with a 'teacher' entry in --resource for a Relax-managed one",
        "set --opd-teacher-url http://host:port/generate",
        fields=("opd-type", "opd-teacher-url", "teacher-hf-checkpoint"),
    )


@rule(
    "rule.opd_teacher_routes",
    "opd-teacher-routes",
    "teacher-hf-checkpoint",
    "resource",
    summary="--opd-teacher-routes (sglang multi-teacher OPD) is a non-empty JSON object of data_source -> HF "
    "checkpoint, excludes --teacher-hf-checkpoint, and needs a 'teacher' entry in --resource.",
)
def opd_teacher_routes(ctx: RuleContext) -> None:
    routes = ctx.opd_teacher_routes
    if not (_opd_on(ctx) and ctx.opd_type == "sglang") or routes is None:
        return
    try:
        parsed = json.loads(routes)
    except ValueError as exc:
        ctx.error(
            f"--opd-teacher-routes is not valid JSON: {exc}",
            'write a JSON object, e.g. \'{"openai/gsm8k": "/models/Qwen3-8B"}\'',
            fields=("opd-teacher-routes",),
        )
        return
    if not isinstance(parsed, dict) or not parsed:
        ctx.error(
            "--opd-teacher-routes must be a non-empty JSON object mapping data_source to a teacher checkpoint",
            'e.g. \'{"openai/gsm8k": "/models/Qwen3-8B"}\'',
            fields=("opd-teacher-routes",),
        )
        return
    if ctx.teacher_hf_checkpoint is not None:
        ctx.error(
            "--opd-teacher-routes (several teachers) and --teacher-hf-checkpoint (one teacher) are both set",
            "keep one of them",
            fields=("opd-teacher-routes", "teacher-hf-checkpoint"),
        )
    if "teacher" not in resource_roles(ctx.values):
        ctx.error(
            "--opd-teacher-routes needs a 'teacher' entry in --resource: the GPUs its teachers share",
            'add "teacher": [1, N] to --resource',
            fields=("opd-teacher-routes", "resource"),
        )


@rule(
    "rule.opd_teacher_load_needs_use_opd",
    "opd-teacher-load",
    "use-opd",
    summary="--opd-teacher-load without --use-opd has no effect (warning; Relax ignores it).",
)
def opd_teacher_load_needs_use_opd(ctx: RuleContext) -> None:
    if not ctx.use_opd and ctx.opd_teacher_load is not None and not ctx.is_sft:
        ctx.warn("--opd-teacher-load is set but --use-opd is not, so it has no effect", "add --use-opd")


@rule(
    "rule.fully_async_without_opd_megatron",
    "fully-async",
    "opd-type",
    summary="On-policy distillation with a megatron teacher (--opd-type megatron) is not supported with "
    "--fully-async.",
)
def fully_async_without_opd_megatron(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.fully_async and ctx.opd_type == "megatron":
        ctx.error(
            "--opd-type megatron is not supported in fully-async mode",
            "use --opd-type sglang, or remove --opd-type",
        )
