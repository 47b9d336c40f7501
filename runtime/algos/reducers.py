"""Loss reducers: per-token values [B, T] and a mask -> one scalar, registered by name."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

import torch

from runtime.registry import Registry


class LossReducer(StrEnum):
    SUM_OF_SAMPLE_MEAN = "sum_of_sample_mean"  # Relax's default: mean over samples of token means
    PER_TOKEN = "per_token"  # `calculate-per-token-loss`: mean over every masked token of the batch
    SUM_OF_SAMPLE_SUM = "sum_of_sample_sum"  # mean over samples of token sums (RLOO's REINFORCE)


class ReducerFn(Protocol):
    def __call__(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor: ...


LOSS_REDUCERS: Registry[ReducerFn] = Registry("loss reducer")


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # `where`, not `values * mask`: a NaN or inf in a padded slot (exp overflow of a garbage log-ratio)
    # would survive a multiplication by 0 and poison the sum.
    return torch.where(mask > 0, values * mask, torch.zeros_like(values))


@LOSS_REDUCERS.register(LossReducer.SUM_OF_SAMPLE_MEAN)
def sample_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over samples of each sample's masked token mean: [B, T], [B, T] -> [] (empty samples count 0).

    Every sample weighs the same whatever its length (Relax's default reduction; `calculate-per-token-loss`
    is the token-weighted alternative, `token_mean`). A fractional mask weighs tokens.
    """
    per_sample = _masked(values, mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
    return per_sample.mean()


def token_count(mask: torch.Tensor) -> torch.Tensor:
    """The per-token loss's normaliser: the masked tokens of each sample, at least one; [B, T] -> [].

    Relax's `loss_function` (relax/backends/megatron/loss.py) counts `clamp_min(loss_mask.sum(), 1)` per
    sample: masks [1, 1, 1] and [0, 0, 0] give 4 tokens, not 3. A backend that splits a step into micro-
    batches weighs each micro-batch by token_count(micro) / token_count(step) to keep that normaliser.
    """
    return mask.sum(dim=-1).clamp(min=1.0).sum().clamp(min=1.0)  # the outer clamp: an empty batch


@LOSS_REDUCERS.register(LossReducer.PER_TOKEN)
def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over every masked token of the batch over `token_count(mask)`: [B, T], [B, T] -> [].

    A fully masked sample adds nothing to the sum and one to the count, as in Relax.
    """
    return _masked(values, mask).sum() / token_count(mask)


@LOSS_REDUCERS.register(LossReducer.SUM_OF_SAMPLE_SUM)
def sample_sum_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over samples of each sample's masked token sum: [B, T], [B, T] -> [].

    The sequence-level REINFORCE objective -A * log pi(y) = -A * sum_t log pi(y_t) (RLOO, Ahmadian et al.
    2024, arXiv:2402.14740).
    """
    return _masked(values, mask).sum(dim=-1).mean()


def default_reducer(per_token_loss: bool) -> ReducerFn:
    """The reducer of every loss term: `token_mean` with `calculate-per-token-loss`, else `sample_mean`."""
    return LOSS_REDUCERS.get(LossReducer.PER_TOKEN if per_token_loss else LossReducer.SUM_OF_SAMPLE_MEAN)
