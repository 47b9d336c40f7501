"""Typed contracts of the loss hooks users set by dotted path, and their loader.

| spec field | Protocol | called as |
| --- | --- | --- |
| `custom-tis-function-path` | `TISFn` | `fn(pg_loss=, train_log_probs=, rollout_log_probs=, loss_mask=, clip_low=, clip_high=) -> TISResult` |
| `custom-pg-loss-reducer-function-path` | `PGLossReducerFn` | `fn(values, loss_mask, per_token_loss=) -> scalar` |
| `custom-loss-function-path` (`loss-type custom_loss`) | `CustomLossFn` | `fn(inputs: LossInputs, config: LossConfig) -> (loss, metrics)` |

Every tensor is [B, T], aligned with the batch's tokens (see `runtime/types.py`). Paths are
`package.module.function` (or `package.module:function`); Relax's own default paths resolve to the
implementations here, so existing Relax configs keep working.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

import torch

from runtime.algos.off_policy import TISResult
from runtime.plugins import load_object

if TYPE_CHECKING:
    from runtime.algos.losses import LossConfig, LossInputs


class TISFn(Protocol):
    """`custom-tis-function-path`: re-weight (and optionally reject) the per-token policy loss.

    pg_loss [B, T] (carries gradients), train_log_probs [B, T] (the trainer's recomputed pi_old),
    rollout_log_probs [B, T] (the engine's), loss_mask [B, T]; clip_low / clip_high are `tis-clip-low` /
    `tis-clip`. Return a `TISResult`: the new pg_loss, the mask the pg reducer divides by (zero tokens to
    reject them), and per-token metrics the caller reduces over the original mask and reports by name.
    """

    def __call__(
        self,
        *,
        pg_loss: torch.Tensor,
        train_log_probs: torch.Tensor,
        rollout_log_probs: torch.Tensor,
        loss_mask: torch.Tensor,
        clip_low: float,
        clip_high: float,
    ) -> TISResult: ...


class PGLossReducerFn(Protocol):
    """`custom-pg-loss-reducer-function-path`: reduce the per-token policy loss to the scalar trained on.

    values [B, T], loss_mask [B, T] -> [] . Only pg_loss uses it; every other term and metric keeps the
    default reducer. The trainer weights each micro-batch by its share of samples (or, with
    `calculate-per-token-loss`, of the step's `token_count`, where a sample with no trained token counts as one,
    as Relax counts it), so return a mean over this micro-batch, not a sum.
    """

    def __call__(
        self, values: torch.Tensor, loss_mask: torch.Tensor, *, per_token_loss: bool
    ) -> torch.Tensor: ...


class CustomLossFn(Protocol):
    """`custom-loss-function-path` with `loss-type custom_loss`: the whole loss of one micro-batch.

    Same contract as the built-in loss types (`runtime.algos.losses.LOSS_TYPES`): returns (loss [],
    metrics name -> []), reported as `train/<name>`.
    """

    def __call__(
        self, inputs: LossInputs, config: LossConfig
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


class HookKind(StrEnum):
    TIS = "custom-tis-function-path"
    PG_LOSS_REDUCER = "custom-pg-loss-reducer-function-path"
    LOSS = "custom-loss-function-path"


# Relax's own dotted paths -> ours, so a Relax config naming a built-in keeps working.
RELAX_ALIASES: dict[str, str] = {
    "relax.backends.megatron.loss.vanilla_tis_function": "runtime.algos.off_policy.vanilla_tis",
    "relax.backends.megatron.loss.icepop_function": "runtime.algos.off_policy.icepop_tis",
}

# A dummy call per hook kind: binding it to the loaded function's signature catches a wrong signature
# at load time, with the path in the message, instead of mid-training.
_PROBE_CALLS: dict[HookKind, tuple[tuple[Any, ...], dict[str, Any]]] = {
    HookKind.TIS: (
        (),
        dict.fromkeys(
            ("pg_loss", "train_log_probs", "rollout_log_probs", "loss_mask", "clip_low", "clip_high")
        ),
    ),
    HookKind.PG_LOSS_REDUCER: ((None, None), {"per_token_loss": False}),
    HookKind.LOSS: ((None, None), {}),
}


@functools.cache
def load_hook(kind: HookKind | str, path: str) -> Callable[..., Any]:
    """Import the hook at `path` (cached per process) and check it can be called as `kind` expects."""
    kind = HookKind(kind)
    resolved = RELAX_ALIASES.get(path, path).replace(":", ".")
    fn = load_object(resolved)
    if not callable(fn):
        raise TypeError(f"{kind} {path!r} is not callable")
    args, kwargs = _PROBE_CALLS[kind]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return fn
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        wanted = ", ".join([*("_" for _ in args), *(f"{k}=" for k in kwargs)])
        raise TypeError(f"{kind} {path!r} cannot be called as fn({wanted}): {exc}") from None
    return fn
