"""Loss types (policy, value, SFT) composed from the pure per-token terms, registered by `loss-type`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import torch

from runtime.algos.hooks import HookKind, load_hook
from runtime.algos.kl import (  # noqa: F401  (re-exported: the names this module always had)
    KL_ESTIMATORS,
    KLType,
    compute_approx_kl,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_low_var,
)
from runtime.algos.logprobs import entropy_from_logits, token_entropy, token_log_probs  # noqa: F401
from runtime.algos.off_policy import (
    TIS_FUNCTIONS,
    TISFunction,
    TISResult,
    opsm_keep_mask,
    select_old_log_probs,
)
from runtime.algos.opd import OPDConfig, opd_loss
from runtime.algos.reducers import (  # noqa: F401
    LOSS_REDUCERS,
    LossReducer,
    default_reducer,
    sample_mean,
    sample_sum_mean,
    token_mean,
)
from runtime.algos.surrogates import (  # noqa: F401
    POLICY_SURROGATES,
    PolicySurrogate,
    SurrogateParams,
    masked_log_ratio,
    surrogate_for_estimator,
)
from runtime.algos.value import compute_value_loss
from runtime.registry import Registry


class LossType(StrEnum):
    POLICY_LOSS = "policy_loss"  # RL policy gradient; the surrogate follows `advantage-estimator`
    VALUE_LOSS = "value_loss"  # PPO critic: clipped squared error against the GAE returns
    SFT = "sft"  # negative log-likelihood of the response tokens; "sft_loss" is its deprecated alias
    CUSTOM_LOSS = "custom_loss"  # `custom-loss-function-path`; resolved by `resolve_loss_fn`, not registered


@dataclass(frozen=True)
class LossConfig:
    """The spec fields the loss types read (defaults are the spec defaults)."""

    eps_clip: float = 0.2
    eps_clip_high: float = 0.2  # the spec's `effective_eps_clip_high`
    eps_clip_c: float | None = None
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = KLType.K1
    use_unbiased_kl: bool = False  # weight the KL loss by pi / pi_old (DeepSeek-V3.2)
    entropy_coef: float = 0.0
    per_token_loss: bool = False  # `calculate-per-token-loss`
    advantage_estimator: str = "grpo"  # picks the policy surrogate (`surrogate_for_estimator`)
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    use_rollout_logprobs: bool = False  # the ratio's pi_old: engine log-probs instead of the trainer's
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    custom_tis_function_path: str | None = None
    # `get-mismatch-metrics`: the TIS function's metrics (tis, mismatch_kl, ...) reported, the loss unweighted
    get_mismatch_metrics: bool = False
    custom_pg_loss_reducer_function_path: str | None = None
    use_opsm: bool = False
    opsm_delta: float = 1e-4
    value_clip: float = 0.2
    custom_loss_function_path: str | None = None
    opd: OPDConfig | None = None  # `use-opd`; its loss mode acts when `opd.loss_coef` != 0

    @property
    def surrogate_params(self) -> SurrogateParams:
        return SurrogateParams(
            eps_clip=self.eps_clip,
            eps_clip_high=self.eps_clip_high,
            eps_clip_c=self.eps_clip_c,
            sapo_tau_pos=self.sapo_tau_pos,
            sapo_tau_neg=self.sapo_tau_neg,
        )


@dataclass(frozen=True)
class LossInputs:
    """What a loss type sees for one micro-batch; every tensor is [B, T] aligned with the tokens.

    log_probs, entropy and values carry gradients (entropy only needs them when entropy_coef != 0); the
    rest are constants from the rollout / trainer / critic.

    log_probs          current policy log-probs
    entropy            current policy entropy per token
    loss_mask          1 on trained response tokens
    old_log_probs      the trainer's log-probs before the update (ratio's pi_old; TIS's train side)
    ref_log_probs      reference model (KL loss)
    advantages         from the advantages stage
    rollout_log_probs  the engine's log-probs (ratio's pi_old with use-rollout-logprobs; TIS's rollout side)
    values             current critic values (value loss)
    old_values         critic values before the update (value clipping)
    returns            GAE returns (value targets)
    teacher_log_probs  the on-policy-distillation teacher's log-probs of the tokens (OPD's loss mode)
    """

    log_probs: torch.Tensor
    entropy: torch.Tensor
    loss_mask: torch.Tensor
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    rollout_log_probs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    teacher_log_probs: torch.Tensor | None = None


class LossFn(Protocol):
    def __call__(
        self, inputs: LossInputs, config: LossConfig
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


LOSS_TYPES: Registry[LossFn] = Registry("loss-type")


def _require(value: torch.Tensor | None, what: str) -> torch.Tensor:
    if value is None:
        raise ValueError(f"the loss needs {what}, which the batch does not carry")
    return value


def _pg_reducer(
    config: LossConfig, surrogate: PolicySurrogate
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if config.custom_pg_loss_reducer_function_path:
        custom = load_hook(HookKind.PG_LOSS_REDUCER, config.custom_pg_loss_reducer_function_path)
        return lambda values, mask: custom(values, mask, per_token_loss=config.per_token_loss)
    if surrogate is PolicySurrogate.REINFORCE:  # -A log pi(y): a sum over the sequence (Relax's RLOO)
        return sample_sum_mean
    return default_reducer(config.per_token_loss)


def _apply_tis(pg: torch.Tensor, inputs: LossInputs, config: LossConfig) -> TISResult:
    tis_fn = (
        load_hook(HookKind.TIS, config.custom_tis_function_path)
        if config.custom_tis_function_path
        else TIS_FUNCTIONS.get(TISFunction.VANILLA)
    )
    result = tis_fn(
        pg_loss=pg,
        train_log_probs=_require(inputs.old_log_probs, "old_log_probs (the trainer's side of TIS)").detach(),
        rollout_log_probs=_require(inputs.rollout_log_probs, "rollout_log_probs (the engine's side of TIS)"),
        loss_mask=inputs.loss_mask,
        clip_low=config.tis_clip_low,
        clip_high=config.tis_clip,
    )
    if not isinstance(result, TISResult):
        raise TypeError(f"the TIS function must return a TISResult, got {type(result).__name__}")
    return result


@LOSS_TYPES.register(LossType.POLICY_LOSS)
def policy_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """pg_loss - entropy_coef * entropy (+ kl_loss_coef * kl with use-kl-loss, + opd_loss_coef * OPD KL in
    OPD's loss mode); returns (loss [], metrics).

    pg per token from the estimator's surrogate, times the OPSM keep mask (use-opsm), times the TIS
    weights (use-tis), reduced by the pg reducer (custom, per-token, or per-sample mean). Metrics:
    pg_loss, pg_clipfrac, ppo_kl, entropy, [kl_loss], [tis*, mismatch_*: use-tis or get-mismatch-metrics],
    [opsm_clipfrac],
    [opd_loss, opd_kl, opd_*_clipfrac], [train_rollout_logprob_abs_diff].
    """
    mask = inputs.loss_mask
    advantages = _require(inputs.advantages, "advantages")
    old = select_old_log_probs(
        inputs.old_log_probs, inputs.rollout_log_probs, use_rollout_logprobs=config.use_rollout_logprobs
    ).detach()
    surrogate = surrogate_for_estimator(config.advantage_estimator)
    reduce = sample_mean if surrogate is PolicySurrogate.REINFORCE else default_reducer(config.per_token_loss)
    terms = POLICY_SURROGATES.get(surrogate)(inputs.log_probs, old, advantages, mask, config.surrogate_params)
    pg = terms.loss
    metrics: dict[str, torch.Tensor] = {}

    if config.use_opsm:
        keep = opsm_keep_mask(inputs.log_probs, old, advantages, mask, delta=config.opsm_delta)
        pg = pg * keep
        metrics["opsm_clipfrac"] = reduce(1.0 - keep, mask)

    pg_mask = mask
    if config.use_tis or (config.get_mismatch_metrics and inputs.rollout_log_probs is not None):
        tis = _apply_tis(pg, inputs, config)
        if config.use_tis:  # else (get-mismatch-metrics alone) the metrics only: the loss is left as it is
            pg, pg_mask = tis.pg_loss, tis.loss_mask
        for name, value in tis.metrics.items():  # over the pre-rejection mask, so rejections show
            metrics[name] = reduce(value.detach(), mask)

    pg_loss = _pg_reducer(config, surrogate)(pg, pg_mask)
    entropy = reduce(inputs.entropy, mask)
    loss = pg_loss - config.entropy_coef * entropy
    metrics.update(
        pg_loss=pg_loss,
        entropy=entropy,
        pg_clipfrac=reduce(terms.clipped, mask),
        ppo_kl=reduce(terms.ppo_kl, mask),
    )
    if config.use_kl_loss:
        ref = _require(inputs.ref_log_probs, "ref_log_probs (use-kl-loss)")
        # padded slots see log pi = log pi_ref (KL 0): a pad token's very low log-prob would overflow
        # k3's exp there and turn the masked-out gradient into NaN
        on_mask = torch.where(mask > 0, inputs.log_probs, ref)
        weight = masked_log_ratio(inputs.log_probs, old, mask).exp() if config.use_unbiased_kl else None
        kl_loss = reduce(compute_approx_kl(on_mask, ref, config.kl_loss_type, weight), mask)
        loss = loss + config.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss
    if config.opd is not None and config.opd.loss_coef != 0:
        teacher = _require(inputs.teacher_log_probs, "teacher_log_probs (use-opd with opd-loss-coef)")
        opd_term, opd_metrics = opd_loss(inputs.log_probs, teacher, old, mask, config.opd)
        loss = loss + opd_term
        metrics.update(opd_metrics)
    if inputs.rollout_log_probs is not None and inputs.old_log_probs is not None:
        diff = (inputs.old_log_probs - inputs.rollout_log_probs).abs().detach()
        metrics["train_rollout_logprob_abs_diff"] = reduce(diff, mask)
    return loss, metrics


@LOSS_TYPES.register(LossType.VALUE_LOSS)
def value_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO critic loss: reduced clipped squared error (`compute_value_loss`); returns (loss [], metrics).

    Needs values (with gradients), old_values and returns. Metrics: value_loss, value_clipfrac.
    """
    reduce = default_reducer(config.per_token_loss)
    per_token, clipped = compute_value_loss(
        _require(inputs.values, "values (the critic's current predictions)"),
        _require(inputs.old_values, "old_values (the critic's predictions at rollout time)"),
        _require(inputs.returns, "returns (from the advantages stage)"),
        value_clip=config.value_clip,
    )
    loss = reduce(per_token, inputs.loss_mask)
    return loss, {"value_loss": loss, "value_clipfrac": reduce(clipped, inputs.loss_mask)}


@LOSS_TYPES.register(LossType.SFT, "sft_loss")
def sft_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log-likelihood of the masked (response) tokens; returns (loss [], metrics)."""
    reduce = default_reducer(config.per_token_loss)
    loss = reduce(-inputs.log_probs, inputs.loss_mask)
    return loss, {"entropy": reduce(inputs.entropy, inputs.loss_mask)}


def resolve_loss_fn(loss_type: str, custom_loss_function_path: str | None = None) -> LossFn:
    """The loss of `loss-type`: a registered one, or the `custom-loss-function-path` hook for custom_loss."""
    if str(loss_type) == LossType.CUSTOM_LOSS:
        if not custom_loss_function_path:
            raise ValueError("loss-type custom_loss needs custom-loss-function-path")
        return load_hook(HookKind.LOSS, custom_loss_function_path)
    return LOSS_TYPES.get(loss_type)
