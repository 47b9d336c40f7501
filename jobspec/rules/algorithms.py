"""The RL algorithm: PPO and its critic, the KL terms and the reference model, the advantage estimators
and losses (custom, REINFORCE++, the GRPO family, RLOO) and what fully async training asks of them."""

from __future__ import annotations

from jobspec.demand import resource_roles
from jobspec.rules.context import (
    RuleContext,
    cli_flags,
    defaults_to,
    exclusive,
    flags_of,
    implies,
    rule,
    value_needs,
)

# =============================================================================================
# PPO (before KL and offload rules, which read what it changes)


@rule(
    "rule.ppo_topology",
    "advantage-estimator",
    "colocate",
    "fully-async",
    "resource",
    summary="PPO runs in synchronous colocate mode with 'critic' and 'advantages' entries in --resource.",
    deviation="Relax main (039ce87) refuses --advantage-estimator ppo outright and eb15c45's code does not "
    "check its topology; the platform runs the reference's PPO (synchronous, colocated, with a critic role) "
    "on its torch backend, in that topology only.",
)
def ppo_topology(ctx: RuleContext) -> None:
    if not ctx.is_ppo or ctx.is_sft:
        return
    if ctx.fully_async:
        ctx.error(
            "--advantage-estimator ppo supports only the synchronous pipeline, but --fully-async is set",
            "remove --fully-async (and --hybrid) for PPO",
            fields=("advantage-estimator", "fully-async"),
        )
    if not ctx.colocate:
        ctx.error(
            "--advantage-estimator ppo currently runs only in colocate mode, but --colocate is not set",
            "add --colocate",
            fields=("advantage-estimator", "colocate"),
        )
    roles = resource_roles(ctx.values)
    missing = [r for r in ("critic", "advantages") if r not in roles]
    if missing:
        ctx.error(
            f"--advantage-estimator ppo needs {', '.join(repr(m) for m in missing)} in --resource "
            f"(got roles: {', '.join(sorted(roles)) or 'none'})",
            'e.g. --resource \'{"actor": [1, 4], "critic": [1, 4], "rollout": [1, 8], "advantages": [1, 0]}\'',
            fields=("advantage-estimator", "resource"),
        )


@rule(
    "rule.ppo_disables_kl",
    "advantage-estimator",
    "kl-coef",
    "use-kl-loss",
    summary="Synchronous PPO resets a non-zero --kl-coef to 0 and turns --use-kl-loss off (derived, warned).",
    deviation="Relax's code does not reset them (main refuses PPO); the reference's synchronous PPO trains "
    "without KL terms, and the resolved argv says so.",
)
def ppo_disables_kl(ctx: RuleContext) -> None:
    if not ctx.is_ppo or ctx.fully_async:
        return
    if ctx.kl_coef != 0:
        ctx.warn(
            f"synchronous PPO resets --kl-coef {ctx.kl_coef} to 0",
            "remove --kl-coef",
            fields=("advantage-estimator", "kl-coef"),
        )
        ctx.derive("kl_coef", 0.0)
    if ctx.use_kl_loss:
        ctx.warn(
            "synchronous PPO turns --use-kl-loss off",
            "remove --use-kl-loss",
            fields=("advantage-estimator", "use-kl-loss"),
        )
        ctx.derive("use_kl_loss", False)


@rule(
    "rule.critic_defaults",
    "critic-load",
    "load",
    "critic-lr",
    "lr",
    summary="With a critic (PPO), --critic-load defaults to --load and --critic-lr to --lr (derived).",
)
def critic_defaults(ctx: RuleContext) -> None:
    if not ctx.is_ppo:
        return
    if ctx.critic_load is None and ctx.load is not None:
        ctx.derive("critic_load", ctx.load)
    if ctx.critic_lr is None:
        ctx.derive("critic_lr", ctx.lr)


@rule(
    "rule.critic_options_need_ppo",
    "num-critic-only-steps",
    "critic-train-only",
    "advantage-estimator",
    summary="--num-critic-only-steps > 0 and --critic-train-only only apply with a critic (--advantage-estimator "
    "ppo); without one Relax ignores them (warning).",
)
def critic_options_need_ppo(ctx: RuleContext) -> None:
    if ctx.is_ppo:
        return
    used = [n for n in ("num_critic_only_steps", "critic_train_only") if ctx.non_default(n)]
    if used:
        ctx.warn(
            f"{cli_flags(*used)} train a critic, but --advantage-estimator {ctx.advantage_estimator} has none: "
            "Relax ignores them",
            "use --advantage-estimator ppo or remove them",
            fields=(*flags_of(*used), "advantage-estimator"),
        )


# =============================================================================================
# KL and reference model


@rule(
    "rule.kl_coef_and_kl_loss_coef",
    "kl-coef",
    "kl-loss-coef",
    summary="--kl-coef and --kl-loss-coef cannot both be non-zero.",
)
def kl_coef_and_kl_loss_coef(ctx: RuleContext) -> None:
    if ctx.kl_coef != 0 and ctx.kl_loss_coef != 0:
        ctx.error(
            f"--kl-coef {ctx.kl_coef} (reward shaping) and --kl-loss-coef {ctx.kl_loss_coef} (loss term) are both "
            "non-zero",
            "keep one KL term: set the other to 0",
        )


@rule(
    "rule.kl_loss_coef_without_use_kl_loss",
    "kl-loss-coef",
    "use-kl-loss",
    summary="--kl-loss-coef has no effect without --use-kl-loss, and --use-kl-loss with coefficient 0 adds "
    "nothing (warnings).",
)
def kl_loss_coef_without_use_kl_loss(ctx: RuleContext) -> None:
    if ctx.kl_loss_coef != 0 and not ctx.use_kl_loss:
        ctx.warn(
            f"--kl-loss-coef {ctx.kl_loss_coef} has no effect without --use-kl-loss", "add --use-kl-loss"
        )
    elif ctx.use_kl_loss and ctx.kl_loss_coef == 0:
        ctx.warn(
            "--use-kl-loss with --kl-loss-coef 0 adds no KL term, but Relax still loads the reference model",
            "set --kl-loss-coef > 0 or remove --use-kl-loss",
        )


@rule(
    "rule.kl_needs_reference_model",
    "use-kl-loss",
    "kl-coef",
    "ref-load",
    summary="A KL term (--use-kl-loss, or --kl-coef != 0) needs a reference model: --ref-load "
    "(Relax's start-up check; --hf-checkpoint and --load do not stand in for it).",
)
def kl_needs_reference_model(ctx: RuleContext) -> None:
    if ctx.is_sft or ctx.ref_load is not None:
        return
    if ctx.use_kl_loss or ctx.kl_coef != 0:
        which = "--use-kl-loss" if ctx.use_kl_loss else f"--kl-coef {ctx.kl_coef}"
        ctx.error(
            f"{which} needs a reference model, but --ref-load is not set",
            "set --ref-load to the reference (initial) Megatron checkpoint, or drop the KL term",
        )


@rule(
    "rule.ref_update_interval_needs_ref_load",
    "ref-update-interval",
    "ref-load",
    summary="--ref-update-interval updates a reference model: without --ref-load it has nothing to update "
    "(warning; Relax ignores it).",
)
def ref_update_interval_needs_ref_load(ctx: RuleContext) -> None:
    if ctx.ref_update_interval is not None and ctx.ref_load is None:
        ctx.warn(
            "--ref-update-interval is set but there is no reference model (--ref-load), so it has no effect",
            "set --ref-load, or remove --ref-update-interval",
        )


eps_clip_high_default = defaults_to("rule.eps_clip_high_default", "eps-clip-high", "eps-clip")


# =============================================================================================
# Algorithm and loss


custom_loss_needs_function_path = value_needs(
    "rule.custom_loss_needs_function_path",
    "loss-type",
    "custom_loss",
    "custom-loss-function-path",
    summary="--loss-type custom_loss needs --custom-loss-function-path (a path without it is a warning).",
    hint="set --custom-loss-function-path my_pkg.losses.my_loss",
    ignored_hint="add --loss-type custom_loss or remove the path",
    deviation="Relax's start-up checks do not look for the path; the job would fail when it first computes "
    "the loss. The platform refuses it at submission.",
)


@rule(
    "rule.reinforce_plus_plus_needs_normalize_advantages",
    "advantage-estimator",
    "normalize-advantages",
    summary="reinforce_plus_plus and reinforce_plus_plus_baseline need --normalize-advantages.",
)
def reinforce_plus_plus_needs_normalize_advantages(ctx: RuleContext) -> None:
    if ctx.is_sft:
        return
    if ctx.advantage_estimator.startswith("reinforce_plus_plus") and not ctx.normalize_advantages:
        ctx.error(
            f"--advantage-estimator {ctx.advantage_estimator} needs --normalize-advantages",
            "add --normalize-advantages",
        )


GRPO_FAMILY = ("grpo", "gspo", "sapo", "cispo")
_RLOO = (
    "rloo is a Relax Platform estimator: the zh reference lists it in Relax's registry, but neither eb15c45 "
    "nor main defines it; this is what the platform's implementation needs."
)


@rule(
    "rule.kl_coef_ignored_by_grpo_family",
    "kl-coef",
    "advantage-estimator",
    summary="--kl-coef is reward shaping that grpo, gspo, sapo and cispo do not apply (as in Relax): a "
    "warning suggesting --use-kl-loss.",
)
def kl_coef_ignored_by_grpo_family(ctx: RuleContext) -> None:
    if not ctx.is_sft and ctx.kl_coef != 0 and ctx.advantage_estimator in GRPO_FAMILY:
        ctx.warn(
            f"--kl-coef {ctx.kl_coef} has no effect with --advantage-estimator {ctx.advantage_estimator}: "
            "its advantages take no reward-side KL (Relax computes the KL, but does not apply it)",
            "use --use-kl-loss with --kl-loss-coef for a KL term, or remove --kl-coef",
            fields=("kl-coef", "advantage-estimator"),
        )


@rule(
    "rule.rloo_one_step_per_rollout",
    "advantage-estimator",
    "global-batch-size",
    "rollout-batch-size",
    "n-samples-per-prompt",
    summary="rloo's REINFORCE loss has no importance ratio: each rollout must train in one optimizer step "
    "(global_batch_size == rollout_batch_size * n_samples_per_prompt), and needs groups of >= 2 samples.",
    deviation=_RLOO,
)
def rloo_one_step_per_rollout(ctx: RuleContext) -> None:
    if ctx.is_sft or ctx.advantage_estimator != "rloo" or ctx.rollout_batch_size is None:
        return
    samples = ctx.rollout_batch_size * ctx.n_samples_per_prompt
    if ctx.global_batch_size is not None and ctx.global_batch_size != samples:
        ctx.error(
            f"--advantage-estimator rloo trains without an importance ratio, so every optimizer step must use "
            f"samples of the current policy; --global-batch-size {ctx.global_batch_size} splits the "
            f"{samples} samples of a rollout into {samples // max(ctx.global_batch_size, 1)} steps",
            f"set --global-batch-size {samples} (one step per rollout), or use grpo, which clips the ratio",
            fields=("advantage-estimator", "global-batch-size"),
        )
    if ctx.n_samples_per_prompt < 2:
        ctx.error(
            "--advantage-estimator rloo's baseline is the mean of the other samples of the prompt: it needs "
            f"--n-samples-per-prompt >= 2 (got {ctx.n_samples_per_prompt})",
            "set --n-samples-per-prompt 2 or more",
            fields=("advantage-estimator", "n-samples-per-prompt"),
        )


rloo_without_normalize_advantages = exclusive(
    "rule.rloo_without_normalize_advantages",
    "advantage-estimator",
    "normalize-advantages",
    a_is="rloo",
    message="--advantage-estimator rloo keeps the reward's scale, but --normalize-advantages whitens it "
    "(putting back the std division the leave-one-out baseline avoids)",
    summary="rloo keeps the reward's scale: --normalize-advantages cannot be set with it.",
    hint="remove --normalize-advantages",
    rl_only=True,
    deviation=_RLOO,
)


group_baseline_needs_rewards_normalization = exclusive(
    "rule.group_baseline_needs_rewards_normalization",
    "advantage-estimator",
    "disable-rewards-normalization",
    a_is="rloo",
    message="--advantage-estimator rloo's leave-one-out baseline is its reward normalization, but "
    "--disable-rewards-normalization turns it off",
    summary="rloo subtracts a leave-one-out group baseline, which is its reward normalization: "
    "--disable-rewards-normalization cannot be set with it (reinforce_plus_plus_baseline takes it, as in "
    "Relax: its advantages are then the raw rewards).",
    hint="remove --disable-rewards-normalization",
    rl_only=True,
    deviation=_RLOO,
)


fully_async_without_normalize_advantages = exclusive(
    "rule.fully_async_without_normalize_advantages",
    "fully-async",
    "normalize-advantages",
    message="--normalize-advantages is not supported in fully-async mode",
    summary="--normalize-advantages is not supported with --fully-async.",
    hint="remove --normalize-advantages",
    rl_only=True,
)


fully_async_without_dynamic_global_batch_size = exclusive(
    "rule.fully_async_without_dynamic_global_batch_size",
    "fully-async",
    "use-dynamic-global-batch-size",
    message="--use-dynamic-global-batch-size is only supported in colocate mode, but --fully-async is set",
    summary="--use-dynamic-global-batch-size is only supported in colocate mode, not with --fully-async.",
    hint="remove --use-dynamic-global-batch-size",
    rl_only=True,
)


single_sample_disables_grpo_std = implies(
    "rule.single_sample_disables_grpo_std",
    "n-samples-per-prompt",
    "disable-grpo-std-normalization",
    value=1,
    summary="With --n-samples-per-prompt 1 there is no group std: GRPO std normalization is turned off (derived).",
)


@rule(
    "rule.fully_async_true_on_policy",
    "fully-async",
    "true-on-policy-mode",
    "global-batch-size",
    summary="In fully-async mode, rollout_batch_size * n_samples_per_prompt == global_batch_size turns on "
    "--true-on-policy-mode (derived).",
)
def fully_async_true_on_policy(ctx: RuleContext) -> None:
    if ctx.is_sft or not ctx.fully_async or ctx.true_on_policy_mode or ctx.rollout_batch_size is None:
        return
    if ctx.global_batch_size == ctx.rollout_batch_size * ctx.n_samples_per_prompt:
        ctx.derive("true_on_policy_mode", True)


@rule(
    "rule.fully_async_resource_roles",
    "fully-async",
    "resource",
    "use-kl-loss",
    "kl-coef",
    "true-on-policy-mode",
    summary="Fully-async (not hybrid) needs a 'reference' role for KL terms and an 'actor_fwd' role unless "
    "true-on-policy mode is on.",
)
def fully_async_resource_roles(ctx: RuleContext) -> None:
    if ctx.is_sft or not ctx.fully_async or ctx.hybrid or ctx.resource is None:
        return
    roles = resource_roles(ctx.values)
    if (ctx.use_kl_loss or ctx.kl_coef != 0) and "reference" not in roles:
        ctx.error(
            f"fully-async KL needs a 'reference' entry in --resource (roles: {', '.join(sorted(roles))})",
            'add "reference": [1, N] to --resource',
            fields=("resource", "use-kl-loss", "kl-coef", "fully-async"),
        )
    if not ctx.true_on_policy_mode and "actor_fwd" not in roles:
        ctx.error(
            "fully-async without true-on-policy mode needs an 'actor_fwd' entry in --resource "
            f"(roles: {', '.join(sorted(roles))}); true-on-policy mode is automatic only when "
            "rollout_batch_size * n_samples_per_prompt == global_batch_size",
            'add "actor_fwd": [1, N] to --resource, or --true-on-policy-mode',
            fields=("resource", "true-on-policy-mode", "fully-async"),
        )
