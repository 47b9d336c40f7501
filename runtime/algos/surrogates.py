"""Per-token policy-gradient surrogates (PPO-clip, GSPO, SAPO, CISPO, REINFORCE), registered by name.

Every surrogate maps (log_probs, old_log_probs, advantages, loss_mask) [B, T] to a per-token loss [B, T]
(to be minimised and reduced by the caller), a 0/1 "clipped" indicator [B, T] for `pg_clipfrac`, and the
per-token `ppo_kl` [B, T] = old - new log-prob (GSPO: its sequence mean on every token). Only
`log_probs` carries gradients. Tokens outside `loss_mask` get finite values that the reducer drops.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import torch
from torch import Tensor

from runtime.registry import Registry, UnknownNameError


class PolicySurrogate(StrEnum):
    PPO_CLIP = "ppo_clip"  # GRPO, PPO, REINFORCE++(-baseline): clipped token ratio, optional dual clip
    GSPO = "gspo"  # sequence ratio exp(mean token log-ratio), clipped like PPO
    SAPO = "sapo"  # soft sigmoid gate on the token ratio instead of a hard clip
    CISPO = "cispo"  # clipped, stop-gradient IS weight times log-prob
    REINFORCE = "reinforce"  # -A * log pi, no ratio (RLOO; on-policy updates only)


@dataclass(frozen=True)
class SurrogateParams:
    """The spec fields the surrogates read."""

    eps_clip: float = 0.2  # `eps-clip`: ratio floor 1 - eps_clip
    eps_clip_high: float = 0.2  # `eps-clip-high` (defaults to eps-clip): ratio cap 1 + eps_clip_high
    eps_clip_c: float | None = None  # `eps-clip-c`: dual-clip bound (> 1) for negative advantages
    sapo_tau_pos: float = 1.0  # `sapo-tau-pos`: gate temperature where A > 0
    sapo_tau_neg: float = 1.05  # `sapo-tau-neg`: gate temperature where A <= 0


@dataclass(frozen=True)
class SurrogateTerms:
    """loss, clipped and ppo_kl, each [B, T]."""

    loss: torch.Tensor
    clipped: torch.Tensor
    ppo_kl: torch.Tensor


class SurrogateFn(Protocol):
    def __call__(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        params: SurrogateParams,
    ) -> SurrogateTerms: ...


POLICY_SURROGATES: Registry[SurrogateFn] = Registry("policy surrogate")

# `advantage-estimator` -> the surrogate its policy loss uses (Relax's ALGORITHM_SPECS pairing).
SURROGATE_OF_ESTIMATOR: dict[str, PolicySurrogate] = {
    "grpo": PolicySurrogate.PPO_CLIP,
    "gspo": PolicySurrogate.GSPO,
    "sapo": PolicySurrogate.SAPO,
    "cispo": PolicySurrogate.CISPO,
    "rloo": PolicySurrogate.REINFORCE,
    "ppo": PolicySurrogate.PPO_CLIP,
    "reinforce_plus_plus": PolicySurrogate.PPO_CLIP,
    "reinforce_plus_plus_baseline": PolicySurrogate.PPO_CLIP,
}


def surrogate_for_estimator(advantage_estimator: str) -> PolicySurrogate:
    """The surrogate of an `advantage-estimator` value; a miss lists the valid ones."""
    try:
        return SURROGATE_OF_ESTIMATOR[str(advantage_estimator)]
    except KeyError:
        valid = ", ".join(sorted(SURROGATE_OF_ESTIMATOR))
        raise UnknownNameError(
            f"no policy surrogate for advantage-estimator {advantage_estimator!r}; valid names: {valid}"
        ) from None


def masked_log_ratio(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """log pi - log pi_old on masked tokens, 0 elsewhere (so padding can never overflow exp); [B, T]."""
    return torch.where(mask > 0, log_probs - old_log_probs, torch.zeros_like(log_probs))


def ppo_clip_from_log_ratio(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate on a given log-ratio; [B, T] inputs -> (loss [B, T], clipped 0/1 [B, T]).

    loss = max(-A r, -A clip(r, 1 - eps_clip, 1 + eps_clip_high)), r = exp(log_ratio) (Schulman et al. 2017,
    arXiv:1707.06347; the asymmetric "clip-higher" bound is DAPO, arXiv:2503.14476). With `eps_clip_c`
    (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729) negative-advantage losses are capped at -A c.
    """
    if eps_clip_c is not None and eps_clip_c <= 1.0:
        raise ValueError(f"eps-clip-c (dual-clip bound) must be > 1, got {eps_clip_c}")
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_mask = (clipped > unclipped).to(ratio.dtype)
    if eps_clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * eps_clip_c), loss)
    return loss, clip_mask


@POLICY_SURROGATES.register(PolicySurrogate.PPO_CLIP)
def ppo_clip_surrogate(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor, params: SurrogateParams
) -> SurrogateTerms:
    """PPO-clip with token ratios r_t = pi(y_t) / pi_old(y_t) (arXiv:1707.06347); [B, T] -> terms [B, T]."""
    return _ppo_clip_terms(masked_log_ratio(log_probs, old_log_probs, loss_mask), advantages, params)


def _ppo_clip_terms(
    log_ratio: torch.Tensor, advantages: torch.Tensor, params: SurrogateParams
) -> SurrogateTerms:
    """`ppo_clip_from_log_ratio` with the surrogate's clip bounds; `ppo_kl` is -log_ratio. [B, T] -> terms."""
    loss, clipped = ppo_clip_from_log_ratio(
        log_ratio,
        advantages,
        eps_clip=params.eps_clip,
        eps_clip_high=params.eps_clip_high,
        eps_clip_c=params.eps_clip_c,
    )
    return SurrogateTerms(loss=loss, clipped=clipped, ppo_kl=-log_ratio.detach())


def sequence_mean_log_ratio(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """(1/|y|) sum_t (log pi - log pi_old) over each sample's masked tokens: [B, T] -> [B] (0 if empty)."""
    log_ratio = masked_log_ratio(log_probs, old_log_probs, loss_mask)
    return (log_ratio * loss_mask).sum(dim=-1) / loss_mask.sum(dim=-1).clamp(min=1.0)


@POLICY_SURROGATES.register(PolicySurrogate.GSPO)
def gspo_surrogate(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor, params: SurrogateParams
) -> SurrogateTerms:
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): PPO-clip on the sequence ratio s = exp(mean_t log r_t).

    Every token of a sample shares s (and its clip decision); gradients flow through s into all of the
    sample's tokens. [B, T] -> terms [B, T]; `ppo_kl` is the sequence's -mean log-ratio on each token.
    """
    seq_log_ratio = sequence_mean_log_ratio(log_probs, old_log_probs, loss_mask)[:, None].expand_as(log_probs)
    return _ppo_clip_terms(seq_log_ratio, advantages, params)


# SAPO's clipfrac proxy counts tokens whose gate has damped the gradient weight below this (Relax's
# monitoring convention; the gate has no hard clip to count).
SAPO_DAMPED_WEIGHT = 0.9


@POLICY_SURROGATES.register(PolicySurrogate.SAPO)
def sapo_surrogate(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor, params: SurrogateParams
) -> SurrogateTerms:
    """SAPO (Gao et al. 2025, arXiv:2511.20347): loss = -f(r) A with the soft gate f(r) = (4/tau) sigmoid(tau (r - 1)).

    r is the token ratio; tau = sapo-tau-pos where A > 0, sapo-tau-neg otherwise. The gradient is
    w(r) r grad log pi A with w = 4 p (1 - p), p = sigmoid(tau (r - 1)): w(1) = 1 (the on-policy
    gradient) and w decays smoothly as r leaves 1, faster for larger tau. `clipped` marks w < 0.9.
    [B, T] -> terms [B, T].
    """
    log_ratio = masked_log_ratio(log_probs, old_log_probs, loss_mask)
    ratio = log_ratio.exp()
    tau = torch.where(
        advantages > 0,
        torch.full_like(ratio, params.sapo_tau_pos),
        torch.full_like(ratio, params.sapo_tau_neg),
    )
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(4.0 / tau) * gate * advantages
    weight = 4.0 * gate * (1.0 - gate)
    clipped = (weight.detach() < SAPO_DAMPED_WEIGHT).to(ratio.dtype)
    return SurrogateTerms(loss=loss, clipped=clipped, ppo_kl=-log_ratio.detach())


@POLICY_SURROGATES.register(PolicySurrogate.CISPO)
def cispo_surrogate(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor, params: SurrogateParams
) -> SurrogateTerms:
    """CISPO (MiniMax-M1, arXiv:2506.13585): loss = -sg(w) sg(A) log pi with w the clipped IS weight.

    Unlike PPO no token loses its gradient; the weight only bounds its size. As in Relax the clip follows
    the advantage's sign: w = min(r, 1 + eps_clip_high) where A >= 0, max(r, 1 - eps_clip) where A < 0
    (the paper clips r to [1 - eps_low, 1 + eps_high] for every token and leaves eps_low unset in practice).
    `clipped` marks tokens whose weight was bounded. [B, T] -> terms [B, T].
    """
    log_ratio = masked_log_ratio(log_probs, old_log_probs, loss_mask).detach()
    ratio = log_ratio.exp()
    upper, lower = 1.0 + params.eps_clip_high, 1.0 - params.eps_clip
    positive = advantages >= 0
    weight = torch.where(positive, ratio.clamp(max=upper), ratio.clamp(min=lower))
    loss = -(weight * advantages).detach() * log_probs
    clipped = ((positive & (ratio > upper)) | (~positive & (ratio < lower))).to(ratio.dtype)
    return SurrogateTerms(loss=loss, clipped=clipped, ppo_kl=-log_ratio)


@POLICY_SURROGATES.register(PolicySurrogate.REINFORCE)
def reinforce_surrogate(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor, params: SurrogateParams
) -> SurrogateTerms:
    """REINFORCE, -sg(A) log pi per token (Williams 1992; RLOO, Ahmadian et al. 2024, arXiv:2402.14740).

    No importance ratio: correct only when every optimizer step trains on the rollout it just generated.
    Reduced per sample as a sum (`sum_of_sample_sum`), i.e. -A * log pi(y). [B, T] -> terms [B, T];
    `clipped` is always 0.
    """
    log_ratio = masked_log_ratio(log_probs, old_log_probs, loss_mask).detach()
    loss = -advantages.detach() * log_probs
    return SurrogateTerms(loss=loss, clipped=torch.zeros_like(loss), ppo_kl=-log_ratio)
