"""Per-token KL estimators between the policy and a reference, registered by `kl-loss-type`."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

import torch

from runtime.registry import Registry


class KLType(StrEnum):
    """Estimators of KL(pi || pi_ref) from the log-probs of sampled tokens.

    Schulman, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html); with d = log pi - log
    pi_ref and tokens sampled from pi.
    """

    K1 = "k1"  # d; unbiased, high variance, can be negative
    K2 = "k2"  # d^2 / 2; low variance, biased
    K3 = "k3"  # exp(-d) - 1 + d; unbiased, non-negative
    LOW_VAR_KL = "low_var_kl"  # k3 with d clamped to [-20, 20] and the result to [-10, 10] (numerical safety)


class KLEstimatorFn(Protocol):
    def __call__(self, log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor: ...


KL_ESTIMATORS: Registry[KLEstimatorFn] = Registry("kl-loss-type")

# low_var_kl's clamp; applied after the importance weight of `use-unbiased-kl`, as Relax does.
LOW_VAR_KL_BOUND = 10.0


@KL_ESTIMATORS.register(KLType.K1)
def kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k1 = log pi - log pi_ref; [B, T], [B, T] -> [B, T]."""
    return log_probs - ref_log_probs


@KL_ESTIMATORS.register(KLType.K2)
def kl_k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k2 = (log pi - log pi_ref)^2 / 2; [B, T], [B, T] -> [B, T]."""
    return 0.5 * (log_probs - ref_log_probs).pow(2)


@KL_ESTIMATORS.register(KLType.K3)
def kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3 = pi_ref/pi - 1 - log(pi_ref/pi); [B, T], [B, T] -> [B, T]."""
    log_ratio = ref_log_probs - log_probs
    return log_ratio.exp() - 1 - log_ratio


def _k3_of_clamped_log_ratio(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3 on the log-ratio clamped to [-20, 20], not yet clamped itself; [B, T], [B, T] -> [B, T].

    The log-ratio clamp only keeps exp() finite (e^20 ~ 4.9e8), so a far-off token's gradient is 0, not
    inf * 0 = NaN. k3 at |log-ratio| = 20 is already above 10, so the clamp changes no clamped result;
    under the `use-unbiased-kl` weight w only where w * k3 < 10 there, i.e. w < 2e-8.
    """
    log_ratio = (ref_log_probs - log_probs).clamp(-20, 20)
    return log_ratio.exp() - 1 - log_ratio


@KL_ESTIMATORS.register(KLType.LOW_VAR_KL)
def kl_low_var(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3 on a log-ratio clamped to [-20, 20], result clamped to [-10, 10]; [B, T], [B, T] -> [B, T]."""
    return _k3_of_clamped_log_ratio(log_probs, ref_log_probs).clamp(-LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)


def compute_approx_kl(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    kl_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate of `kl_type`; all tensors [B, T] -> [B, T].

    With `importance_ratio` (`use-unbiased-kl`: pi_theta / pi_old per token, gradient flowing through
    pi_theta) the estimate is re-weighted to be unbiased for samples drawn from pi_old rather than
    pi_theta (DeepSeek-AI 2025, "DeepSeek-V3.2" technical report, "Unbiased KL Estimate").

    low_var_kl is clamped to [-10, 10] once, *after* the weighting, as Relax's `compute_approx_kl`
    (relax/utils/training/ppo_utils.py) does: it weights the raw k3 and clamps the product. Clamping k3
    before the weighting as well would cap a large k3 at 10 and leave only the ratio's gradient, which
    points the other way (log pi = -3, log pi_ref = 0, w = 0.5: 8.04 with gradient -1.5 w.r.t. log pi;
    the double clamp gives 5.0 with gradient +5.0).
    """
    if importance_ratio is None:
        return KL_ESTIMATORS.get(kl_type)(log_probs, ref_log_probs)
    if str(kl_type) == KLType.LOW_VAR_KL:
        weighted = importance_ratio * _k3_of_clamped_log_ratio(log_probs, ref_log_probs)
        return weighted.clamp(-LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)
    return importance_ratio * KL_ESTIMATORS.get(kl_type)(log_probs, ref_log_probs)
