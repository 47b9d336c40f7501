"""Parameter groups for the RL algorithm: advantages, losses, PPO, KL, SAPO, critic, off-policy, freezing."""

from __future__ import annotations

from typing import Literal

from jobspec.fields import ParamGroup, param

__all__ = [
    "AdvantageParams",
    "LossParams",
    "PpoParams",
    "KlParams",
    "SapoParams",
    "CriticParams",
    "OffPolicyParams",
    "RoutingReplayParams",
    "TrainingOptionsParams",
    "FreezingParams",
]

AdvantageEstimator = Literal[
    "grpo", "gspo", "sapo", "cispo", "rloo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"
]


class AdvantageParams(ParamGroup):
    group = "advantage"
    title = "Algorithm: advantage estimation"

    advantage_estimator: AdvantageEstimator = param(
        "grpo",
        "Advantage estimator (Relax's ALGORITHM_SPECS registry). On-policy distillation is independent of "
        "it: enable it with --use-opd.",
    )
    normalize_advantages: bool = param(False, "Normalize advantages.")
    disable_grpo_std_normalization: bool = param(
        False,
        "Disable GRPO's standard-deviation normalization (Dr.GRPO). Relax turns it off by itself when "
        "--n-samples-per-prompt is 1.",
    )
    disable_rewards_normalization: bool = param(False, "Disable reward normalization.")
    disable_compute_advantages_and_returns: bool = param(
        False,
        "Skip computing advantages and returns (for SFT or custom losses; set automatically under "
        "--loss-type sft).",
    )


class LossParams(ParamGroup):
    group = "loss"
    title = "Algorithm: loss"

    loss_type: Literal["policy_loss", "sft", "custom_loss"] = param(
        "policy_loss",
        "Loss type. policy_loss runs RL training (PPO/GRPO...); sft runs supervised fine-tuning; "
        "custom_loss needs --custom-loss-function-path. 'sft_loss' is a deprecated alias of 'sft'.",
        value_aliases={"sft_loss": "sft", "sft-loss": "sft"},
    )
    custom_loss_function_path: str | None = param(None, "Custom loss function.", function_path=True)
    eps_clip: float = param(0.2, "PPO clip range (lower bound).", ge=0)
    eps_clip_high: float | None = param(None, "PPO clip upper bound.", ge=0, unset="eps_clip")
    eps_clip_c: float | None = param(
        None, "Lower bound of dual-clip PPO (must be > 1).", gt=1, unset="dual clip off"
    )
    value_clip: float = param(0.2, "Value function (critic) clip range.", ge=0)
    entropy_coef: float = param(0.0, "Entropy loss coefficient.", ge=0)


class PpoParams(ParamGroup):
    group = "ppo"
    title = "Algorithm: PPO"
    description = (
        "PPO runs in synchronous colocate mode and needs 'critic' and 'advantages' entries in --resource. "
        "Synchronous PPO resets a non-zero --kl-coef to 0 and turns --use-kl-loss off."
    )

    gamma: float = param(1.0, "GAE discount factor (PPO).", ge=0, le=1)
    lambd: float = param(1.0, "GAE lambda (PPO).", ge=0, le=1)


class KlParams(ParamGroup):
    group = "kl"
    title = "Algorithm: KL divergence"

    kl_coef: float = param(
        0.0,
        "KL penalty coefficient used for reward shaping (applied to the reward before advantages). "
        "Synchronous PPO resets a non-zero value to 0. Cannot be non-zero together with --kl-loss-coef.",
        ge=0,
    )
    use_kl_loss: bool = param(
        False, "Add a loss-level KL term for GRPO-like algorithms (synchronous PPO turns it off)."
    )
    kl_loss_coef: float = param(
        0.0,
        "KL coefficient added to the final policy loss. Cannot be non-zero together with --kl-coef.",
        ge=0,
    )
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = param("k1", "KL estimator used by the KL loss.")
    use_unbiased_kl: bool = param(False, "Use the unbiased KL estimate.")
    ref_update_interval: int | None = param(
        None,
        "Update the reference model every N rollout steps; unset keeps it fixed.",
        ge=1,
    )


class SapoParams(ParamGroup):
    group = "sapo"
    title = "Algorithm: SAPO"

    sapo_tau_pos: float = param(1.0, "SAPO temperature for positive advantages.", gt=0)
    sapo_tau_neg: float = param(1.05, "SAPO temperature for negative advantages.", gt=0)


class CriticParams(ParamGroup):
    group = "critic"
    title = "Algorithm: critic"

    num_critic_only_steps: int = param(0, "Steps that train only the critic.", ge=0)
    critic_train_only: bool = param(False, "Train only the critic model.")
    critic_load: str | None = param(None, "Critic checkpoint to load.", path_kind="input", unset="load")
    critic_save: str | None = param(None, "Critic checkpoint output directory.", path_kind="output")
    critic_lr: float | None = param(None, "Critic learning rate.", ge=0, unset="lr")
    critic_lr_warmup_iters: int = param(0, "Linear warm-up iterations of the critic.", ge=0)


class OffPolicyParams(ParamGroup):
    group = "off_policy"
    title = "Algorithm: off-policy correction"

    use_rollout_logprobs: bool = param(
        False,
        "Use the rollout engine's log-probs for the importance ratio (and as PPO's old-policy log-probs); "
        "otherwise the actor's recomputed log-probs are used. Required by the PPO colocate topology.",
    )
    use_tis: bool = param(False, "Enable truncated importance sampling (TIS) for off-policy correction.")
    tis_clip: float = param(2.0, "Upper clip of the importance sampling ratio.", ge=0)
    tis_clip_low: float = param(0.0, "Lower clip of the importance sampling ratio.", ge=0)
    custom_tis_function_path: str | None = param(None, "Custom TIS/RS function.", function_path=True)
    custom_pg_loss_reducer_function_path: str | None = param(
        None,
        "Custom reducer for pg_loss; the other metrics keep the default sum_of_sample_mean.",
        function_path=True,
    )


class RoutingReplayParams(ParamGroup):
    group = "routing_replay"
    title = "Algorithm: routing replay and OPSM"

    use_routing_replay: bool = param(False, "Enable routing replay (MoE).")
    use_rollout_routing_replay: bool = param(
        False, "Enable rollout routing replay; turns on --use-routing-replay."
    )
    use_opsm: bool = param(False, "Enable off-policy sequence masking (OPSM).")
    opsm_delta: float = param(1e-4, "OPSM threshold.", ge=0)


class TrainingOptionsParams(ParamGroup):
    group = "training_options"
    title = "Algorithm: other training options"

    reset_optimizer_states: bool = param(False, "Reset the optimizer state after every rollout.")
    use_rollout_entropy: bool = param(
        False, "Also compute entropy when computing log-probs (for special loss masks)."
    )
    get_mismatch_metrics: bool = param(
        False, "Compute training/inference mismatch metrics. Needs --custom-tis-function-path."
    )


class FreezingParams(ParamGroup):
    group = "freezing"
    title = "Parameter freezing and selective training"

    only_train_params_name_list: list[str] | None = param(
        None,
        "Regexes of parameter names to train; everything else is frozen. Exclusive with "
        "--freeze-params-name-list. Example: --only-train-params-name-list experts.",
        nargs="*",
    )
    freeze_params_name_list: list[str] | None = param(
        None,
        "Regexes of parameter names to freeze; everything else stays trainable. Example: "
        "--freeze-params-name-list embedding output_layer.",
        nargs="*",
    )
