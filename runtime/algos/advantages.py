"""Advantage estimators: pure tensor functions registered by `advantage-estimator` name."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import torch

from runtime.registry import Registry


class AdvantageEstimator(StrEnum):
    GRPO = "grpo"  # group-relative: reward minus its prompt group's mean, over the group's std (Shao et al. 2024)


@dataclass(frozen=True)
class AdvantageConfig:
    """The spec fields estimators read."""

    std_normalization: bool = True  # False = `disable-grpo-std-normalization` (Dr. GRPO, Liu et al. 2025)
    rewards_normalization: bool = True  # False = `disable-rewards-normalization`: raw rewards are advantages
    eps: float = 1e-6


@dataclass(frozen=True)
class AdvantageInputs:
    """rewards [B] float; group_index [B] long (samples of one prompt share it); loss_mask [B, T] float."""

    rewards: torch.Tensor
    group_index: torch.Tensor
    loss_mask: torch.Tensor


@dataclass(frozen=True)
class AdvantageOutputs:
    """advantages [B, T] and returns [B, T], zero outside `loss_mask`."""

    advantages: torch.Tensor
    returns: torch.Tensor


class AdvantageFn(Protocol):
    def __call__(self, inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantageOutputs: ...


ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")


def group_normalize(
    rewards: torch.Tensor, group_index: torch.Tensor, *, std_normalization: bool, eps: float = 1e-6
) -> torch.Tensor:
    """(r - mean_g) / (std_g + eps) per group g of `group_index`; shapes [B] -> [B].

    std is the unbiased (n-1) sample std, as `torch.std` computes it; a group of one sample has no
    spread and gets advantage 0.
    """
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    num_groups = counts.numel()
    rewards = rewards.to(torch.float32)
    sums = torch.zeros(num_groups).index_add_(0, inverse, rewards)
    means = sums / counts
    centered = rewards - means[inverse]
    if not std_normalization:
        return centered
    sq = torch.zeros(num_groups).index_add_(0, inverse, centered.pow(2))
    denom = (counts - 1).clamp(min=1).to(torch.float32)
    std = torch.where(counts > 1, (sq / denom).sqrt(), torch.zeros_like(sq))
    return centered / (std[inverse] + eps)


@ADVANTAGE_ESTIMATORS.register(AdvantageEstimator.GRPO)
def compute_grpo_advantages(inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantageOutputs:
    """GRPO (DeepSeekMath, arXiv:2402.03300): every response token gets its sample's group-normalized reward.

    rewards [B], group_index [B], loss_mask [B, T] -> advantages = returns [B, T].
    """
    if config.rewards_normalization:
        scores = group_normalize(
            inputs.rewards, inputs.group_index, std_normalization=config.std_normalization, eps=config.eps
        )
    else:
        scores = inputs.rewards.to(torch.float32)
    advantages = scores[:, None] * inputs.loss_mask
    return AdvantageOutputs(advantages=advantages, returns=advantages.clone())


def compute_advantages(name: str, inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantageOutputs:
    return ADVANTAGE_ESTIMATORS.get(name)(inputs, config)


def whiten(advantages: torch.Tensor, loss_mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """`normalize-advantages`: zero mean, unit variance over the masked tokens of the batch; [B, T] -> [B, T]."""
    count = loss_mask.sum().clamp(min=1.0)
    mean = (advantages * loss_mask).sum() / count
    var = ((advantages - mean).pow(2) * loss_mask).sum() / count
    return (advantages - mean) * torch.rsqrt(var + eps) * loss_mask
