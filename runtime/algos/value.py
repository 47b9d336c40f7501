"""Critic (value) loss for PPO: clipped squared error against the GAE returns."""

from __future__ import annotations

import torch

# The squared error is not halved: Relax's value loss is max((V - R)^2, (V_clipped - R)^2) as it stands
# (OpenAI Baselines' PPO2 multiplies by 0.5; that only rescales the critic's learning rate).
VALUE_LOSS_SCALE = 1.0


def compute_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    *,
    value_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss per token; values, old_values, returns [B, T] -> (loss [B, T], clipped [B, T]).

    loss = max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2) with c = `value-clip` (PPO2's
    value clipping, Dhariwal et al. 2017, OpenAI Baselines; analysed in Engstrom et al. 2020,
    arXiv:2005.12729). `values` carries the gradient; `clipped` is 1 where |V - V_old| > c (Relax's
    value_clipfrac).
    """
    delta = values - old_values
    clipped_values = old_values + delta.clamp(-value_clip, value_clip)
    loss = VALUE_LOSS_SCALE * torch.maximum((values - returns).pow(2), (clipped_values - returns).pow(2))
    clipped = (delta.detach().abs() > value_clip).to(values.dtype)
    return loss, clipped
