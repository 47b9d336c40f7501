"""Profiling: SGLang profile steps, the profiled step range, memory snapshots."""

from __future__ import annotations

from jobspec.rules.context import RuleContext, options_need, rule


@rule(
    "rule.sglang_profile_steps",
    "sglang-profile",
    "sglang-profile-steps",
    "sglang-profile-step-start",
    "sglang-profile-step-end",
    summary="SGLang profile step ranges: start <= end, --sglang-profile-steps overrides them, and they need "
    "--sglang-profile.",
)
def sglang_profile_steps(ctx: RuleContext) -> None:
    start, end, steps = ctx.sglang_profile_step_start, ctx.sglang_profile_step_end, ctx.sglang_profile_steps
    if start is not None and end is not None and start > end:
        ctx.error(
            f"--sglang-profile-step-start {start} > --sglang-profile-step-end {end} (both inclusive)",
            "use start <= end",
            fields=("sglang-profile-step-start", "sglang-profile-step-end"),
        )
    if steps and (start is not None or end is not None):
        ctx.warn(
            "--sglang-profile-steps overrides --sglang-profile-step-start/--sglang-profile-step-end",
            "keep one way of choosing steps",
            fields=("sglang-profile-steps", "sglang-profile-step-start", "sglang-profile-step-end"),
        )
    if (start is None) != (end is None) and not steps:
        ctx.warn(
            "set both --sglang-profile-step-start and --sglang-profile-step-end for a range",
            "add the missing bound",
            fields=("sglang-profile-step-start", "sglang-profile-step-end"),
        )
    ctx.warn_unless(
        "sglang-profile",
        "sglang_profile_steps",
        "sglang_profile_step_start",
        "sglang_profile_step_end",
        "sglang_profile_output_dir",
        "sglang_profile_num_steps",
        "sglang_profile_activities",
        "sglang_profile_by_stage",
        "sglang_profile_with_stack",
        "sglang_profile_record_shapes",
    )


@rule(
    "rule.profile_step_range",
    "profile-step-start",
    "profile-step-end",
    summary="Training profiling: --profile-step-start <= --profile-step-end (inclusive); options need "
    "--use-pytorch-profiler (warning).",
)
def profile_step_range(ctx: RuleContext) -> None:
    if ctx.profile_step_start > ctx.profile_step_end:
        ctx.error(
            f"--profile-step-start {ctx.profile_step_start} > --profile-step-end {ctx.profile_step_end} "
            "(both inclusive)",
            "use start <= end",
        )
    ctx.warn_unless(
        "use-pytorch-profiler",
        "profile_step_start",
        "profile_step_end",
        "profile_target",
        "profile_with_stack",
        "profile_with_memory",
        "profile_with_flops",
    )


memory_snapshot_needs_history = options_need(
    "rule.memory_snapshot_needs_history",
    "record-memory-history",
    "memory_snapshot_num_steps",
    "memory_snapshot_dir",
    "memory_snapshot_path",
    summary="Memory snapshot options need --record-memory-history (warning).",
    flags=("record-memory-history", "memory-snapshot-num-steps", "memory-snapshot-dir"),
)
