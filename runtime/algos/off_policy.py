"""Off-policy corrections: which old log-probs the ratio uses, TIS/IcePop weights, OPSM masks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from runtime.registry import Registry


def select_old_log_probs(
    old_log_probs: torch.Tensor | None,
    rollout_log_probs: torch.Tensor | None,
    *,
    use_rollout_logprobs: bool,
) -> torch.Tensor:
    """The pi_old of the importance ratio: the engine's log-probs with `use-rollout-logprobs`, else the
    trainer's recomputed ones; [B, T] -> [B, T]. Raises naming the missing tensor."""
    chosen, name = (
        (rollout_log_probs, "rollout_log_probs (use-rollout-logprobs)")
        if use_rollout_logprobs
        else (old_log_probs, "old_log_probs (the trainer's recomputed log-probs)")
    )
    if chosen is None:
        raise ValueError(f"the policy loss needs {name}, which the batch does not carry")
    return chosen


@dataclass(frozen=True)
class TISResult:
    """What a TIS/RS function returns.

    pg_loss    [B, T]  the re-weighted per-token policy loss
    loss_mask  [B, T]  the mask the pg reducer divides by (a rejection-sampling function may zero tokens)
    metrics    name -> [B, T] per-token values; the caller reduces them over the *original* loss mask
    """

    pg_loss: torch.Tensor
    loss_mask: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


class TISFunction(StrEnum):
    VANILLA = "vanilla_tis"  # weights clamped to [tis-clip-low, tis-clip] (the default of --use-tis)
    ICEPOP = "icepop"  # weights outside [tis-clip-low, tis-clip] set to 0 instead of clamped


# Entries fulfil `runtime.algos.hooks.TISFn` (keyword-only arguments, returns a `TISResult`).
TIS_FUNCTIONS: Registry[Callable[..., TISResult]] = Registry("TIS function")


def _mismatch_metrics(ratio: torch.Tensor, log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "tis": ratio,
        "tis_abs": (ratio - 1).abs(),
        "mismatch_kl": -log_ratio,  # k1 estimate of KL(pi_rollout || pi_train) on rollout samples
        "mismatch_k3_kl": ratio - log_ratio - 1,
    }


def _train_rollout_log_ratio(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    # 0 off the mask so padding never overflows exp
    return torch.where(loss_mask > 0, train_log_probs - rollout_log_probs, torch.zeros_like(train_log_probs))


Weighting = Callable[[torch.Tensor, float, float], tuple[torch.Tensor, torch.Tensor]]


def _truncated_is(weigh: Weighting) -> Callable[..., TISResult]:
    """The TIS function (`runtime.algos.hooks.TISFn`) of a weighting, named and documented as it is:
    `weigh(ratio, clip_low, clip_high)` -> (weight, clipped), both [B, T], from the ratio pi_train / pi_rollout
    (1 off the loss mask). The policy loss is multiplied by the weight, a constant (no gradient); the mask is
    kept. Metrics: `tis` (the raw ratio), `tis_weight`, `tis_clipfrac` (`clipped`), `tis_abs`, `mismatch_kl`,
    `mismatch_k3_kl`."""

    def tis(
        *,
        pg_loss: torch.Tensor,
        train_log_probs: torch.Tensor,
        rollout_log_probs: torch.Tensor,
        loss_mask: torch.Tensor,
        clip_low: float,
        clip_high: float,
    ) -> TISResult:
        log_ratio = _train_rollout_log_ratio(train_log_probs, rollout_log_probs, loss_mask).detach()
        ratio = log_ratio.exp()
        weight, clipped = weigh(ratio, clip_low, clip_high)
        metrics = _mismatch_metrics(ratio, log_ratio)
        metrics["tis_weight"] = weight
        metrics["tis_clipfrac"] = clipped.to(ratio.dtype)
        return TISResult(pg_loss=pg_loss * weight, loss_mask=loss_mask, metrics=metrics)

    # the weighting's name (a dotted path resolves and pickles to it), not its signature: called as TISFn
    tis.__name__, tis.__qualname__, tis.__doc__ = weigh.__name__, weigh.__qualname__, weigh.__doc__
    return tis


@TIS_FUNCTIONS.register(TISFunction.VANILLA)
@_truncated_is
def vanilla_tis(ratio: torch.Tensor, clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling between the engine and the trainer (Yao et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training"): pg_loss * clamp(pi_train / pi_rollout, low, high).

    A TIS function (`_truncated_is`): all [B, T]; the weight is a constant (no gradient). Metrics: `tis` (raw
    ratio), `tis_weight`, `tis_clipfrac`, `tis_abs`, `mismatch_kl`, `mismatch_k3_kl`.
    """
    weight = ratio.clamp(min=clip_low, max=clip_high)
    return weight, weight != ratio


@TIS_FUNCTIONS.register(TISFunction.ICEPOP)
@_truncated_is
def icepop_tis(ratio: torch.Tensor, clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """IcePop (inclusionAI, Ring-1T report 2025): keep pi_train / pi_rollout inside [low, high], zero it outside.

    A TIS function (`_truncated_is`): all [B, T]; the token stays in the reducer's denominator (only its weight
    is 0). Same metrics as `vanilla_tis`.
    """
    inside = (ratio >= clip_low) & (ratio <= clip_high)
    return torch.where(inside, ratio, torch.zeros_like(ratio)), ~inside


def opsm_keep_mask(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    delta: float,
) -> torch.Tensor:
    """Off-policy sequence masking (DeepSeek-AI 2025, "DeepSeek-V3.2" technical report): 0/1 keep mask [B, T].

    A token is dropped when its advantage is negative and its sequence has drifted: the sequence KL
    (1/|y|) sum_t (log pi_old - log pi) over the masked tokens exceeds `opsm-delta`. pi_old is the same
    old policy the ratio uses (the engine's with `use-rollout-logprobs`). Positive-advantage tokens are
    always kept. The mask is a constant (no gradient).
    """
    diff = torch.where(loss_mask > 0, old_log_probs - log_probs, torch.zeros_like(log_probs)).detach()
    seq_kl = (diff * loss_mask).sum(dim=-1) / loss_mask.sum(dim=-1).clamp(min=1.0)
    drop = (advantages < 0) & (seq_kl[:, None] > delta)
    return (~drop).to(log_probs.dtype)
