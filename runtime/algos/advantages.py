"""Advantage estimators: pure tensor functions registered by `advantage-estimator` name, plus the stage
function that adds on-policy distillation and advantage whitening around them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import torch

from runtime.algos.kl import KLType, compute_approx_kl
from runtime.algos.opd import OPDConfig, apply_opd_to_advantages
from runtime.registry import Registry


class AdvantageEstimator(StrEnum):
    # group-relative: reward minus its prompt group's mean, over the group's std (Shao et al. 2024)
    GRPO = "grpo"
    GSPO = "gspo"  # GRPO's advantages; the loss uses the sequence-level ratio
    SAPO = "sapo"  # GRPO's advantages; the loss uses the soft gate
    CISPO = "cispo"  # GRPO's advantages; the loss uses the clipped stop-gradient IS weight
    RLOO = "rloo"  # reward minus the mean of the group's *other* samples; REINFORCE loss, on-policy only
    PPO = "ppo"  # GAE over critic values with KL-shaped token rewards; needs a critic
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"  # discounted KL-shaped token returns, batch-whitened
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"  # group-mean baseline, batch-whitened


# Estimators whose definition includes whitening over the batch's tokens (REINFORCE++, arXiv:2501.03262);
# the stage whitens them whether or not `normalize-advantages` is set (Relax requires it set for them).
WHITENED_ESTIMATORS = frozenset(
    {AdvantageEstimator.REINFORCE_PLUS_PLUS, AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE}
)
# RLOO keeps the reward's scale on purpose; whitening would put back the std division it removes.
UNWHITENED_ESTIMATORS = frozenset({AdvantageEstimator.RLOO})


@dataclass(frozen=True)
class AdvantageConfig:
    """The spec fields the advantages stage reads (defaults are the spec defaults)."""

    std_normalization: bool = True  # False = `disable-grpo-std-normalization` (Dr. GRPO, Liu et al. 2025)
    rewards_normalization: bool = True  # False = `disable-rewards-normalization`: raw rewards are advantages
    eps: float = 1e-6
    gamma: float = 1.0  # `gamma`: discount (PPO's GAE, REINFORCE++ returns)
    lambd: float = 1.0  # `lambd`: GAE lambda
    kl_coef: float = 0.0  # `kl-coef`: KL penalty in the reward (ppo, reinforce_plus_plus(_baseline), rloo)
    kl_type: str = KLType.K1  # `kl-loss-type`: the estimator of that per-token KL, as in Relax
    normalize_advantages: bool = False  # `normalize-advantages`: masked whitening over the batch's tokens
    opd: OPDConfig | None = None  # `use-opd` (on-policy distillation, runtime.algos.opd); None = off


@dataclass(frozen=True)
class AdvantageInputs:
    """What the estimators read; per-token tensors are [B, T] aligned with `RolloutBatch.tokens`.

    rewards            float [B]     raw scalar reward per sample
    group_index        long  [B]     samples of one prompt share it
    loss_mask          float [B, T]  1 on trained response tokens
    log_probs          float [B, T]  pi_old: the engine's with use-rollout-logprobs, else the trainer's
                                     (KL shaping with kl-coef; the student side of OPD)
    ref_log_probs      float [B, T]  reference model (KL shaping with kl-coef)
    values             float [B, T]  critic V(prefix before token t) at column t (ppo)
    response_mask      float [B, T]  every response token, trained or not (multi-turn tool output): the
                                     time steps of GAE and of REINFORCE++'s discounting, the tokens of
                                     PPO's KL penalty and the place of its terminal reward; None = ppo:
                                     loss_mask, reinforce_plus_plus: every column from the first to the
                                     last loss_mask token
    teacher_log_probs  float [B, T]  the OPD teacher's log-probs of the sampled tokens (use-opd)
    """

    rewards: torch.Tensor
    group_index: torch.Tensor
    loss_mask: torch.Tensor
    log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    response_mask: torch.Tensor | None = None
    teacher_log_probs: torch.Tensor | None = None


@dataclass(frozen=True)
class AdvantageOutputs:
    """advantages [B, T] and returns [B, T], zero outside `loss_mask`."""

    advantages: torch.Tensor
    returns: torch.Tensor


class AdvantageFn(Protocol):
    def __call__(self, inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantageOutputs: ...


ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")


# -- building blocks ---------------------------------------------------------------------------------------


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # `where` rather than `* mask`: garbage (even inf) in padded slots must not leak into the result
    return torch.where(mask > 0, values * mask, torch.zeros_like(values))


def group_normalize(
    rewards: torch.Tensor, group_index: torch.Tensor, *, std_normalization: bool, eps: float = 1e-6
) -> torch.Tensor:
    """(r - mean_g) / (std_g + eps) per group g of `group_index`; shapes [B] -> [B].

    std is the unbiased (n-1) sample std, as `torch.std` computes it; a group of one sample has no
    spread and gets advantage 0.
    """
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    num_groups = counts.numel()
    # float64 statistics: a group of equal float32 rewards (0.1 x 8) must centre to exactly ~0, or the
    # division by std + eps blows a 1e-8 rounding residue up to a visible advantage
    rewards = rewards.to(torch.float64)
    sums = torch.zeros(num_groups, dtype=torch.float64, device=rewards.device).index_add_(0, inverse, rewards)
    means = sums / counts
    centered = rewards - means[inverse]
    if not std_normalization:
        return centered.to(torch.float32)
    sq = torch.zeros(num_groups, dtype=torch.float64, device=rewards.device).index_add_(
        0, inverse, centered.pow(2)
    )
    denom = (counts - 1).clamp(min=1).to(torch.float64)
    std = torch.where(counts > 1, (sq / denom).sqrt(), torch.zeros_like(sq))
    return (centered / (std[inverse] + eps)).to(torch.float32)


def leave_one_out(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """r_i - mean_{j != i, same group} r_j = G/(G-1) (r_i - mean_g); [B] -> [B] (RLOO, arXiv:2402.14740).

    Raises on a group of one sample, which has no other sample to be its baseline.
    """
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    if bool((counts < 2).any()):
        raise ValueError("rloo needs at least 2 samples per prompt group (n-samples-per-prompt >= 2)")
    rewards = rewards.to(torch.float32)
    sums = torch.zeros(counts.numel(), device=rewards.device).index_add_(0, inverse, rewards)
    n = counts[inverse].to(torch.float32)
    return rewards - (sums[inverse] - rewards) / (n - 1)


def whiten(advantages: torch.Tensor, loss_mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """`normalize-advantages`: zero mean, unit variance over the masked tokens of the batch; [B, T] -> [B, T].

    The variance is Bessel-corrected (sum of squares / (N - 1)) once the batch has N >= 2 masked tokens,
    as Relax's `distributed_masked_whiten` (relax/utils/distributed_utils.py) computes it: [1, 2, 3, 4, 5]
    -> +-2 / sqrt(2.5) = +-1.2649 (not +-2 / sqrt(2) = +-1.4142).
    """
    count = loss_mask.sum()
    mean = _masked(advantages, loss_mask).sum() / count.clamp(min=1.0)
    squares = _masked((advantages - mean).pow(2), loss_mask).sum()
    var = squares / torch.where(count >= 2, count - 1, count).clamp(min=1.0)
    return _masked((advantages - mean) * torch.rsqrt(var + eps), loss_mask)


def response_span(loss_mask: torch.Tensor) -> torch.Tensor:
    """1 on every column from a row's first to its last loss_mask token, both included; [B, T] -> [B, T].

    The response tokens as far as the loss mask tells them apart: an untrained token between two trained
    ones (multi-turn tool output) is inside the response. An all-zero row stays zero.
    """
    on = loss_mask > 0
    from_first = on.cumsum(dim=1) > 0
    to_last = on.flip(1).cumsum(dim=1).flip(1) > 0
    return (from_first & to_last).to(torch.float32)


def reward_shaping_kl(
    inputs: AdvantageInputs, config: AdvantageConfig, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token KL(pi_old || pi_ref) of `kl-loss-type` on the tokens of `mask` (default `loss_mask`), for
    `kl-coef`; [B, T] (zeros when kl_coef is 0, so no reference model is needed then)."""
    mask = inputs.loss_mask if mask is None else mask
    if config.kl_coef == 0:
        return torch.zeros_like(mask, dtype=torch.float32)
    if inputs.log_probs is None or inputs.ref_log_probs is None:
        raise ValueError("kl-coef needs log_probs and ref_log_probs in the advantage inputs")
    kl = compute_approx_kl(inputs.log_probs.float(), inputs.ref_log_probs.float(), config.kl_type)
    return _masked(kl, mask)


def last_token_onehot(mask: torch.Tensor) -> torch.Tensor:
    """1 at the last position where `mask` is set, per row; [B, T] -> [B, T] (an all-zero row stays zero)."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.zeros_like(positions)).argmax(dim=1)
    onehot = torch.zeros_like(mask, dtype=torch.float32)
    onehot[torch.arange(mask.shape[0], device=mask.device), last] = 1.0
    return onehot * (mask.sum(dim=1, keepdim=True) > 0)


def kl_shaped_token_rewards(
    rewards: torch.Tensor,
    kl: torch.Tensor,
    kl_mask: torch.Tensor,
    *,
    kl_coef: float,
    terminal_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """r_t = -kl_coef * kl_t on the tokens of `kl_mask`, plus the scalar reward on the last token of
    `terminal_mask` (default `kl_mask`); rewards [B], kl [B, T], masks [B, T] -> [B, T] (Ouyang et al.
    2022, arXiv:2203.02155)."""
    terminal = last_token_onehot(kl_mask if terminal_mask is None else terminal_mask)
    return -kl_coef * _masked(kl, kl_mask) + terminal * rewards.to(torch.float32)[:, None]


def _reverse_scan(x: torch.Tensor, mask: torch.Tensor, decay: float) -> torch.Tensor:
    """y_t = x_t + decay * y_t' over the masked positions, t' the next masked position after t; [B, T].

    Unmasked positions are skipped (not time steps) and get 0.
    """
    out = torch.zeros_like(x)
    running = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    for t in range(x.shape[1] - 1, -1, -1):
        m = mask[:, t] > 0
        running = torch.where(m, x[:, t] + decay * running, running)
        out[:, t] = torch.where(m, running, torch.zeros_like(running))
    return out


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over the masked positions; [B, T], [B, T] -> [B, T] (0 off the mask)."""
    return _reverse_scan(_masked(token_rewards.float(), mask), mask, gamma)


def generalized_advantage_estimation(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lambd: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2015, arXiv:1506.02438) over the masked positions as consecutive time steps.

    delta_t = r_t + gamma V_{t+1} - V_t (V after the last step is 0), A_t = sum_k (gamma lambd)^k delta_{t+k},
    returns = A + V. token_rewards, values, mask [B, T] -> (advantages [B, T], returns [B, T]), 0 off the mask.
    """
    values = _masked(values.float(), mask)
    next_values = torch.zeros_like(values)
    following = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    for t in range(values.shape[1] - 1, -1, -1):
        next_values[:, t] = following
        following = torch.where(mask[:, t] > 0, values[:, t], following)
    deltas = _masked(token_rewards.float() + gamma * next_values - values, mask)
    advantages = _reverse_scan(deltas, mask, gamma * lambd)
    return advantages, _masked(advantages + values, mask)


# -- estimators --------------------------------------------------------------------------------------------


@ADVANTAGE_ESTIMATORS.register(
    AdvantageEstimator.GRPO, AdvantageEstimator.GSPO, AdvantageEstimator.SAPO, AdvantageEstimator.CISPO
)
def compute_grpo_advantages(inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantageOutputs:
    """GRPO (DeepSeekMath, arXiv:2402.03300): every response token gets its sample's group-normalized reward.

    rewards [B], group_index [B], loss_mask [B, T] -> advantages = returns [B, T]. Shared by gspo, sapo
    and cispo, whose difference is the loss. As in Relax, `kl-coef` does not enter these advantages (use
    `use-kl-loss` for a KL term with this family).
    """
    if config.rewards_normalization:
        scores = group_normalize(
            inputs.rewards, inputs.group_index, std_normalization=config.std_normalization, eps=config.eps
        )
    else:
        scores = inputs.rewards.to(torch.float32)
    advantages = _masked(scores[:, None].expand_as(inputs.loss_mask), inputs.loss_mask)
    return AdvantageOutputs(advantages=advantages, returns=advantages.clone())


@ADVANTAGE_ESTIMATORS.register(AdvantageEstimator.RLOO)
def compute_rloo_advantages(inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantageOutputs:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019): leave-one-out baseline per group.

    r'_i = r_i - kl_coef * sum_t kl_it (the sequence KL, when kl-coef is set); A_i = r'_i - mean_{j != i} r'_j,
    broadcast over the response: rewards [B], group_index [B], loss_mask [B, T] -> advantages = returns
    [B, T]. No std division: the advantage keeps the reward's scale.
    """
    if not config.rewards_normalization:
        raise ValueError(
            "rloo's leave-one-out baseline is its reward normalization: drop disable-rewards-normalization"
        )
    shaped = inputs.rewards.to(torch.float32) - config.kl_coef * reward_shaping_kl(inputs, config).sum(dim=-1)
    scores = leave_one_out(shaped, inputs.group_index)
    advantages = _masked(scores[:, None].expand_as(inputs.loss_mask), inputs.loss_mask)
    return AdvantageOutputs(advantages=advantages, returns=advantages.clone())


@ADVANTAGE_ESTIMATORS.register(AdvantageEstimator.PPO)
def compute_ppo_advantages(inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantageOutputs:
    """PPO's GAE (arXiv:1506.02438) with gamma / lambd over the response tokens, using the critic's values.

    Token rewards: -kl_coef * kl_t on *every* response token, trained or not, plus the raw scalar reward on
    the last response token, as Relax's `compute_advantages_and_returns` (relax/backends/megatron/loss.py)
    shapes them: its KL list covers the whole response and only the loss reads the loss mask. rewards [B],
    values [B, T], loss_mask [B, T] (response_mask [B, T] if some response tokens are not trained) ->
    advantages [B, T] and returns = advantages + values [B, T], zero outside loss_mask.
    """
    if inputs.values is None:
        raise ValueError("ppo needs the critic's values in the advantage inputs")
    steps = inputs.loss_mask if inputs.response_mask is None else inputs.response_mask
    token_rewards = kl_shaped_token_rewards(
        inputs.rewards, reward_shaping_kl(inputs, config, steps), steps, kl_coef=config.kl_coef
    )
    advantages, returns = generalized_advantage_estimation(
        token_rewards, inputs.values, steps, gamma=config.gamma, lambd=config.lambd
    )
    return AdvantageOutputs(
        advantages=_masked(advantages, inputs.loss_mask), returns=_masked(returns, inputs.loss_mask)
    )


@ADVANTAGE_ESTIMATORS.register(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_advantages(
    inputs: AdvantageInputs, config: AdvantageConfig
) -> AdvantageOutputs:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted returns of KL-shaped token rewards.

    r_t = -kl_coef * kl_t on trained tokens plus the raw reward on the last one; G_t = r_t + gamma G_{t+1}
    over every response token, an untrained one (tool output) a step with r_t = 0, as Relax's
    `get_reinforce_plus_plus_returns` (relax/utils/training/ppo_utils.py) discounts the whole response.
    The steps are response_mask, or without it `response_span(loss_mask)`. rewards [B], loss_mask [B, T]
    -> advantages = returns = G [B, T], *before* the batch whitening the algorithm includes
    (`compute_advantages_and_returns` applies it).
    """
    steps = response_span(inputs.loss_mask) if inputs.response_mask is None else inputs.response_mask
    token_rewards = kl_shaped_token_rewards(
        inputs.rewards, reward_shaping_kl(inputs, config), inputs.loss_mask, kl_coef=config.kl_coef
    )
    returns = _masked(discounted_returns(token_rewards, steps, config.gamma), inputs.loss_mask)
    return AdvantageOutputs(advantages=returns.clone(), returns=returns)


@ADVANTAGE_ESTIMATORS.register(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_advantages(
    inputs: AdvantageInputs, config: AdvantageConfig
) -> AdvantageOutputs:
    """REINFORCE++-baseline (arXiv:2501.03262): reward minus its group's mean, less the token's KL penalty.

    A_t = (r_i - mean_g) - kl_coef * kl_t, as Relax's `get_reinforce_plus_plus_baseline_advantages`
    (relax/utils/training/ppo_utils.py, reference commit and main 039ce87) computes it; with
    `disable-rewards-normalization` the group mean is not subtracted (Relax subtracts it in its reward
    post-processing, which that flag turns off). rewards [B], group_index [B], loss_mask [B, T] ->
    advantages = returns [B, T], *before* the batch whitening the algorithm includes. The paper puts the
    KL in the loss (use-kl-loss, k2); kl-coef is Relax's reward-side alternative.
    """
    if config.rewards_normalization:
        scores = group_normalize(inputs.rewards, inputs.group_index, std_normalization=False)
    else:
        scores = inputs.rewards.to(torch.float32)
    penalty = config.kl_coef * reward_shaping_kl(inputs, config)
    advantages = _masked(scores[:, None] - penalty, inputs.loss_mask)
    return AdvantageOutputs(advantages=advantages, returns=advantages.clone())


# -- the stage ---------------------------------------------------------------------------------------------


def compute_advantages(name: str, inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantageOutputs:
    """The registered estimator alone (no OPD term, no whitening); see `compute_advantages_and_returns`."""
    return ADVANTAGE_ESTIMATORS.get(name)(inputs, config)


def compute_advantages_and_returns(
    name: str, inputs: AdvantageInputs, config: AdvantageConfig
) -> AdvantageOutputs:
    """The advantages stage, in Relax's order: estimator -> OPD (use-opd: `opd-only-reward` zeroes the
    estimator's output, `- opd_kl_coef * kl` per token; `opd.apply_opd_to_advantages`) -> whitening.

    Whitening (masked, over the batch's tokens) applies with `normalize-advantages` and always for the
    REINFORCE++ estimators; rloo refuses `normalize-advantages`. Returns keep the estimator's values
    (critic targets for ppo; zero under `opd-only-reward`). All outputs [B, T], zero outside loss_mask.
    """
    estimate = ADVANTAGE_ESTIMATORS.get(name)  # a miss lists the valid names
    estimator = str(name)
    if config.normalize_advantages and estimator in UNWHITENED_ESTIMATORS:
        raise ValueError(f"{estimator} keeps the reward scale: normalize-advantages must be off")
    out = estimate(inputs, config)
    advantages, returns = out.advantages, out.returns
    if config.opd is not None:
        advantages, returns = apply_opd_to_advantages(
            advantages,
            returns,
            student=inputs.log_probs,
            teacher=inputs.teacher_log_probs,
            loss_mask=inputs.loss_mask,
            config=config.opd,
        )
    if config.normalize_advantages or estimator in WHITENED_ESTIMATORS:
        advantages = whiten(advantages, inputs.loss_mask)
    return AdvantageOutputs(advantages=advantages, returns=returns)
