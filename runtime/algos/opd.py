"""On-policy distillation (OPD): the per-token KL between the student's sampled tokens and a teacher, and its
two applications, registered by `opd-kl-type`.

OPD is orthogonal to the advantage estimator (as in Relax). Per response token the student log-prob `s` and
the teacher log-prob `t` of the token the student sampled give a per-token estimate of KL(student || teacher);
advantage mode (`opd-kl-coef`) subtracts `opd_kl_coef * kl` from the estimator's advantages, loss mode
(`opd-loss-coef`) adds `opd_loss_coef * token_mean(kl)` of the *current* student log-probs (with gradient) to
the policy loss. Agarwal et al. 2024 (arXiv:2306.13649); Lu & Thinking Machines 2025, "On-Policy
Distillation".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch

from runtime.algos.kl import KLEstimatorFn, kl_k1, kl_low_var
from runtime.algos.reducers import token_mean
from runtime.algos.surrogates import masked_log_ratio
from runtime.registry import Registry


class OPDKLType(StrEnum):
    """Per-token estimators on the student's sampled tokens (`opd-token-selection student_sampled`): both are
    reverse-KL estimators (Relax's forward_kl and jsd need top-k distributions; refused by capabilities)."""

    REVERSE_KL = "reverse_kl"  # k1: s - t
    LOW_VAR_KL = "low_var_kl"  # k3: exp(t - s) - 1 - (t - s), clamped as kl-loss-type low_var_kl


OPD_KL_ESTIMATORS: Registry[KLEstimatorFn] = Registry("opd-kl-type")
# the KL loss's own estimators (runtime.algos.kl), called as (student, teacher)
OPD_KL_ESTIMATORS.register(OPDKLType.REVERSE_KL)(kl_k1)
OPD_KL_ESTIMATORS.register(OPDKLType.LOW_VAR_KL)(kl_low_var)


@dataclass(frozen=True)
class OPDConfig:
    """The spec fields OPD reads (defaults are the spec defaults). jobspec makes exactly one of `kl_coef`
    (advantage mode) and `loss_coef` (loss mode) non-zero."""

    kl_type: str = OPDKLType.REVERSE_KL  # `opd-kl-type`
    kl_coef: float = 1.0  # `opd-kl-coef`: advantages -= kl_coef * kl
    loss_coef: float = 0.0  # `opd-loss-coef`: loss += loss_coef * token_mean(kl)
    log_prob_min_clamp: float | None = None  # `opd-log-prob-min-clamp`: s, t clamped from below first
    per_token_clip: float | None = None  # `opd-per-token-clip`: kl capped from above (both modes)
    is_clip: float | None = None  # `opd-is-clip`: loss mode's kl times min(exp(s_new - s_old), is_clip)
    only_reward: bool = False  # `opd-only-reward`: the estimator's advantages and returns are zeroed


def _raw_kl(
    student: torch.Tensor, teacher: torch.Tensor, loss_mask: torch.Tensor, config: OPDConfig
) -> torch.Tensor:
    s, t = student.float(), teacher.float()
    if config.log_prob_min_clamp is not None:
        s, t = s.clamp_min(config.log_prob_min_clamp), t.clamp_min(config.log_prob_min_clamp)
    # padded slots see s = t (a zero log-ratio): garbage there must not overflow low_var_kl's exp, in the
    # forward or in the gradient
    s = torch.where(loss_mask > 0, s, t)
    kl = OPD_KL_ESTIMATORS.get(config.kl_type)(s, t)
    return torch.where(loss_mask > 0, kl, torch.zeros_like(kl))


def opd_per_token_kl(
    student: torch.Tensor, teacher: torch.Tensor, loss_mask: torch.Tensor, config: OPDConfig
) -> torch.Tensor:
    """The per-token OPD KL of `opd-kl-type` after `opd-log-prob-min-clamp` and `opd-per-token-clip`;
    [B, T] student, teacher, mask -> [B, T], 0 off the mask. Keeps the student's graph."""
    kl = _raw_kl(student, teacher, loss_mask, config)
    if config.per_token_clip is not None:
        kl = kl.clamp(max=config.per_token_clip)
    return kl


def apply_opd_to_advantages(
    advantages: torch.Tensor,
    returns: torch.Tensor,
    *,
    student: torch.Tensor | None,
    teacher: torch.Tensor | None,
    loss_mask: torch.Tensor,
    config: OPDConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The advantages stage's OPD step, in Relax's order after the estimator (and before whitening):
    `opd-only-reward` zeroes the estimator's advantages and returns; advantage mode (`opd-kl-coef` != 0)
    then subtracts `opd_kl_coef * kl` (a constant) per trained token. student: pi_old's log-probs of the
    sampled tokens; all [B, T] -> (advantages, returns) [B, T]."""
    if config.only_reward:
        advantages, returns = torch.zeros_like(advantages), torch.zeros_like(returns)
    if config.kl_coef != 0:
        if student is None or teacher is None:
            raise ValueError(
                "use-opd needs the student's log_probs and teacher_log_probs in the advantage inputs"
            )
        kl = opd_per_token_kl(student, teacher, loss_mask, config).detach()
        advantages = advantages - config.kl_coef * kl
    return advantages, returns


def opd_loss(
    log_probs: torch.Tensor,
    teacher: torch.Tensor,
    old_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    config: OPDConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss mode: `opd_loss_coef * token_mean(kl * min(exp(s - s_old), opd-is-clip))` over the micro-batch's
    trained tokens (a token mean, as Relax reduces it), kl from the current log-probs (with gradient); the
    importance ratio is a constant. Returns (the weighted term [], metrics: opd_loss (unweighted), opd_kl,
    [opd_per_token_clipfrac], [opd_is_clipfrac])."""
    raw = _raw_kl(log_probs, teacher, loss_mask, config)
    metrics = {"opd_kl": token_mean(raw.detach(), loss_mask)}
    kl = raw
    if config.per_token_clip is not None:
        kl = raw.clamp(max=config.per_token_clip)
        metrics["opd_per_token_clipfrac"] = token_mean(
            (raw.detach() > config.per_token_clip).float(), loss_mask
        )
    if config.is_clip is not None:
        ratio = masked_log_ratio(log_probs.detach().float(), old_log_probs.float(), loss_mask).exp()
        kl = kl * ratio.clamp(max=config.is_clip)
        metrics["opd_is_clipfrac"] = token_mean((ratio > config.is_clip).float(), loss_mask)
    loss = token_mean(kl, loss_mask)
    metrics["opd_loss"] = loss.detach()
    return config.loss_coef * loss, metrics


def opd_metrics(
    student: torch.Tensor, teacher: torch.Tensor, loss_mask: torch.Tensor, config: OPDConfig
) -> dict[str, float]:
    """`opd/kl`: the token mean over trained tokens of the per-token KL (before `opd-per-token-clip`) between
    the rollout's student log-probs and the teacher's; `opd/teacher_log_prob`: the teacher's token mean."""
    kl = _raw_kl(student, teacher, loss_mask, config)
    return {
        "opd/kl": float(token_mean(kl, loss_mask)),
        "opd/teacher_log_prob": float(token_mean(teacher.float(), loss_mask)),
    }
