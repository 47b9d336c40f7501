"""Policy, KL, entropy and SFT losses as pure tensor functions, plus the loss types that combine them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import torch

from runtime.registry import Registry


class KLType(StrEnum):
    """Estimators of KL(pi || pi_ref) from per-token log-probs (Schulman, "Approximating KL Divergence")."""

    K1 = "k1"  # log r, r = pi/pi_ref; unbiased, high variance, can be negative
    K2 = "k2"  # (log r)^2 / 2; low variance, biased
    K3 = "k3"  # (1/r - 1) + log r = exp(-log r) - 1 + log r; unbiased, non-negative
    LOW_VAR_KL = "low_var_kl"  # k3 clamped to [-10, 10] for numerical safety


class LossType(StrEnum):
    POLICY_LOSS = "policy_loss"  # PPO-clip policy gradient (GRPO, GSPO... differ by the advantages fed in)
    SFT = "sft"  # negative log-likelihood of the response tokens; "sft_loss" is its deprecated alias


KL_ESTIMATORS: Registry = Registry("kl-loss-type")


@KL_ESTIMATORS.register(KLType.K1)
def kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """[B, T], [B, T] -> [B, T]."""
    return log_probs - ref_log_probs


@KL_ESTIMATORS.register(KLType.K2)
def kl_k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """[B, T], [B, T] -> [B, T]."""
    return 0.5 * (log_probs - ref_log_probs).pow(2)


@KL_ESTIMATORS.register(KLType.K3)
def kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """[B, T], [B, T] -> [B, T]."""
    log_ratio = ref_log_probs - log_probs
    return log_ratio.exp() - 1 - log_ratio


@KL_ESTIMATORS.register(KLType.LOW_VAR_KL)
def kl_low_var(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """[B, T], [B, T] -> [B, T]."""
    log_ratio = (ref_log_probs - log_probs).clamp(-20, 20)
    return (log_ratio.exp() - 1 - log_ratio).clamp(-10, 10)


def compute_approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_type: str) -> torch.Tensor:
    return KL_ESTIMATORS.get(kl_type)(log_probs, ref_log_probs)


def compute_ppo_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017), per token; asymmetric clip as in DAPO (arXiv:2503.14476).

    All inputs [B, T]. Returns (loss [B, T], clipped [B, T] as 0/1 float) with
    loss = max(-A * r, -A * clip(r, 1 - eps_clip, 1 + eps_clip_high)), r = exp(log_probs - old_log_probs).
    With `eps_clip_c` (dual-clip, Ye et al. 2020) losses of negative-advantage tokens are capped at -A * c.
    """
    ratio = (log_probs - old_log_probs).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_mask = (clipped > unclipped).to(log_probs.dtype)
    if eps_clip_c is not None:
        capped = torch.minimum(loss, -advantages * eps_clip_c)
        loss = torch.where(advantages < 0, capped, loss)
    return loss, clip_mask


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: [..., V] -> [...]."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(tokens[:, t] | tokens[:, :t]) from next-token logits: logits [B, T, V], tokens [B, T] -> [B, T].

    logits[:, t] predicts token t + 1, so column 0 (no prediction) is 0. The logits are divided by the
    sampling temperature first, so the result matches what the rollout engine reports.
    """
    log_p = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = log_p.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the distribution each token was drawn from: logits [B, T, V] -> [B, T], column 0 is 0."""
    return torch.nn.functional.pad(entropy_from_logits(logits[:, :-1].float() / temperature), (1, 0))


def sample_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over samples of each sample's masked token mean: [B, T], [B, T] -> [] (empty samples count 0).

    Every sample weighs the same whatever its length (Relax's default reduction; `calculate-per-token-loss`
    is the token-weighted alternative, `token_mean`).
    """
    per_sample = (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
    return per_sample.mean()


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over every masked token of the batch: [B, T], [B, T] -> []."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@dataclass(frozen=True)
class LossConfig:
    """The spec fields the loss types read."""

    eps_clip: float = 0.2
    eps_clip_high: float = 0.2
    eps_clip_c: float | None = None
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = KLType.K1
    entropy_coef: float = 0.0
    per_token_loss: bool = False  # `calculate-per-token-loss`


@dataclass(frozen=True)
class LossInputs:
    """What a loss type sees for one micro-batch; every tensor is [B, T] aligned with the tokens.

    log_probs and entropy carry gradients; the rest are constants from the rollout/trainer.
    """

    log_probs: torch.Tensor
    entropy: torch.Tensor
    loss_mask: torch.Tensor
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None


class LossFn(Protocol):
    def __call__(
        self, inputs: LossInputs, config: LossConfig
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


LOSS_TYPES: Registry[LossFn] = Registry("loss-type")


@LOSS_TYPES.register(LossType.POLICY_LOSS)
def policy_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """pg_loss - entropy_coef * entropy (+ kl_loss_coef * kl when use-kl-loss); returns (loss [], metrics)."""
    if inputs.advantages is None or inputs.old_log_probs is None:
        raise ValueError("policy_loss needs advantages and old_log_probs")
    reduce = token_mean if config.per_token_loss else sample_mean
    mask = inputs.loss_mask
    pg, clipped = compute_ppo_policy_loss(
        inputs.log_probs,
        inputs.old_log_probs,
        inputs.advantages,
        eps_clip=config.eps_clip,
        eps_clip_high=config.eps_clip_high,
        eps_clip_c=config.eps_clip_c,
    )
    pg_loss = reduce(pg, mask)
    entropy = reduce(inputs.entropy, mask)
    loss = pg_loss - config.entropy_coef * entropy
    metrics = {
        "pg_loss": pg_loss,
        "entropy": entropy,
        "pg_clipfrac": reduce(clipped, mask),
        "ppo_kl": reduce(inputs.old_log_probs - inputs.log_probs, mask),
    }
    if config.use_kl_loss:
        if inputs.ref_log_probs is None:
            raise ValueError("use-kl-loss needs reference log-probs")
        kl_loss = reduce(compute_approx_kl(inputs.log_probs, inputs.ref_log_probs, config.kl_loss_type), mask)
        loss = loss + config.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss
    return loss, metrics


@LOSS_TYPES.register(LossType.SFT, "sft_loss")
def sft_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log-likelihood of the masked (response) tokens; returns (loss [], metrics)."""
    reduce = token_mean if config.per_token_loss else sample_mean
    loss = reduce(-inputs.log_probs, inputs.loss_mask)
    return loss, {"entropy": reduce(inputs.entropy, inputs.loss_mask)}
