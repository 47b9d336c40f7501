"""On-policy distillation (runtime/algos/opd.py) on hand-computed tensors: the per-token KL of each
`opd-kl-type`, the clamp and the clips, advantage mode, `opd-only-reward`, loss mode and its metrics."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from runtime.algos.advantages import AdvantageConfig, AdvantageInputs, compute_advantages_and_returns
from runtime.algos.kl import kl_k1, kl_low_var
from runtime.algos.losses import LossConfig, LossInputs, policy_loss
from runtime.algos.opd import (
    OPD_KL_ESTIMATORS,
    OPDConfig,
    apply_opd_to_advantages,
    opd_loss,
    opd_metrics,
    opd_per_token_kl,
)
from runtime.registry import UnknownNameError

# two samples, three columns; column 2 of sample 1 is padding holding garbage
STUDENT = torch.tensor([[-0.7, -0.8, -0.2], [-5.0, -0.2, -100.0]])
TEACHER = torch.tensor([[-0.4, -0.5, -1.0], [-0.5, -1.0, 80.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def k3(s: float, t: float) -> float:
    return math.exp(t - s) - 1 - (t - s)


def test_estimators_are_the_kl_losss_own() -> None:
    assert OPD_KL_ESTIMATORS.get("reverse_kl") is kl_k1
    assert OPD_KL_ESTIMATORS.get("low_var_kl") is kl_low_var
    with pytest.raises(UnknownNameError, match="low_var_kl, reverse_kl"):
        OPD_KL_ESTIMATORS.get("jsd")


def test_reverse_kl_is_student_minus_teacher_on_trained_tokens() -> None:
    kl = opd_per_token_kl(STUDENT, TEACHER, MASK, OPDConfig())
    assert_close(kl, torch.tensor([[-0.3, -0.3, 0.8], [-4.5, 0.8, 0.0]]))


def test_low_var_kl_is_k3_clamped_as_the_kl_loss_clamps_it() -> None:
    kl = opd_per_token_kl(STUDENT, TEACHER, MASK, OPDConfig(kl_type="low_var_kl"))
    # k3(-5, -0.5) = e^4.5 - 5.5 = 84.5: low_var_kl's bound (10) caps it
    want = [[k3(-0.7, -0.4), k3(-0.8, -0.5), k3(-0.2, -1.0)], [10.0, k3(-0.2, -1.0), 0.0]]
    assert_close(kl, torch.tensor(want))
    assert kl[0, 0].item() == pytest.approx(math.exp(0.3) - 1.3, abs=1e-6)  # 0.0498588


def test_min_clamp_then_per_token_clip() -> None:
    config = OPDConfig(log_prob_min_clamp=-1.0, per_token_clip=0.5)
    kl = opd_per_token_kl(STUDENT, TEACHER, MASK, config)
    # s = -5 is clamped to -1 first (-1 - -0.5 = -0.5); the 0.8 entries are capped at 0.5
    assert_close(kl, torch.tensor([[-0.3, -0.3, 0.5], [-0.5, 0.5, 0.0]]))


def test_advantage_mode_subtracts_the_kl_and_only_reward_drops_the_estimator() -> None:
    advantages, returns = torch.full((2, 3), 0.5) * MASK, torch.full((2, 3), 0.25) * MASK
    config = OPDConfig(kl_coef=2.0)
    adv, ret = apply_opd_to_advantages(
        advantages, returns, student=STUDENT, teacher=TEACHER, loss_mask=MASK, config=config
    )
    assert_close(adv, torch.tensor([[1.1, 1.1, -1.1], [9.5, -1.1, 0.0]]))
    assert torch.equal(ret, returns)
    only = OPDConfig(kl_coef=2.0, only_reward=True)
    adv, ret = apply_opd_to_advantages(
        advantages, returns, student=STUDENT, teacher=TEACHER, loss_mask=MASK, config=only
    )
    assert_close(adv, torch.tensor([[0.6, 0.6, -1.6], [9.0, -1.6, 0.0]]))
    assert torch.equal(ret, torch.zeros_like(returns))
    # loss mode (kl_coef 0) leaves the advantages to the estimator
    adv, _ = apply_opd_to_advantages(
        advantages, returns, student=None, teacher=None, loss_mask=MASK, config=OPDConfig(kl_coef=0.0)
    )
    assert torch.equal(adv, advantages)


def test_the_stage_applies_opd_after_the_estimator() -> None:
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        group_index=torch.tensor([0, 0]),
        loss_mask=MASK,
        log_probs=STUDENT,
        teacher_log_probs=TEACHER,
    )
    plain = compute_advantages_and_returns("grpo", inputs, AdvantageConfig())
    only = compute_advantages_and_returns("grpo", inputs, AdvantageConfig(opd=OPDConfig(only_reward=True)))
    assert plain.advantages.abs().sum() > 0
    assert_close(only.advantages, -opd_per_token_kl(STUDENT, TEACHER, MASK, OPDConfig()))
    bare = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), MASK)
    with pytest.raises(ValueError, match="teacher_log_probs"):
        compute_advantages_and_returns("grpo", bare, AdvantageConfig(opd=OPDConfig()))


def test_loss_mode_token_mean_with_the_importance_ratio_capped() -> None:
    s = torch.tensor([[-0.7, -0.8]], requires_grad=True)
    teacher = torch.tensor([[-0.4, -0.5]])
    old = torch.tensor([[-0.9, -0.8]])  # ratios exp(0.2) = 1.221 (capped at 1.1) and 1
    mask = torch.ones(1, 2)
    config = OPDConfig(kl_coef=0.0, loss_coef=0.5, is_clip=1.1)
    loss, metrics = opd_loss(s, teacher, old, mask, config)
    assert loss.item() == pytest.approx(0.5 * (-0.3 * 1.1 - 0.3 * 1.0) / 2, abs=1e-6)  # -0.1575
    loss.backward()
    assert_close(s.grad, torch.tensor([[0.5 * 1.1 / 2, 0.5 * 1.0 / 2]]))  # the ratio is a constant
    assert metrics["opd_is_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["opd_kl"].item() == pytest.approx(-0.3, abs=1e-6)
    assert metrics["opd_loss"].item() == pytest.approx(-0.315, abs=1e-6)


def test_loss_mode_per_token_clip_stops_the_gradient_of_capped_tokens() -> None:
    s = torch.tensor([[-0.2, -0.7]], requires_grad=True)
    teacher = torch.tensor([[-1.0, -0.4]])  # k1: 0.8 (capped at 0.5), -0.3
    config = OPDConfig(kl_coef=0.0, loss_coef=1.0, per_token_clip=0.5)
    loss, metrics = opd_loss(s, teacher, s.detach(), torch.ones(1, 2), config)
    assert loss.item() == pytest.approx((0.5 - 0.3) / 2, abs=1e-6)
    loss.backward()
    assert_close(s.grad, torch.tensor([[0.0, 0.5]]))
    assert metrics["opd_per_token_clipfrac"].item() == pytest.approx(0.5)


def test_policy_loss_adds_the_opd_term_in_loss_mode_only() -> None:
    s = STUDENT.clone().requires_grad_(True)
    base = dict(
        log_probs=s,
        entropy=torch.zeros(2, 3),
        loss_mask=MASK,
        old_log_probs=STUDENT,
        advantages=torch.zeros(2, 3),
    )
    plain, _ = policy_loss(LossInputs(**base), LossConfig())
    opd = OPDConfig(kl_coef=0.0, loss_coef=0.5, kl_type="low_var_kl")
    with_opd, metrics = policy_loss(LossInputs(**base, teacher_log_probs=TEACHER), LossConfig(opd=opd))
    term, _ = opd_loss(STUDENT, TEACHER, STUDENT, MASK, opd)
    assert with_opd.item() == pytest.approx(plain.item() + term.item(), abs=1e-6)
    assert {"opd_loss", "opd_kl"} <= set(metrics)
    with_opd.backward()
    assert torch.isfinite(s.grad).all() and s.grad[1, 2] == 0  # the garbage pad has no gradient
    advantage_mode, metrics = policy_loss(LossInputs(**base), LossConfig(opd=OPDConfig()))
    assert advantage_mode.item() == pytest.approx(plain.item()) and "opd_loss" not in metrics
    with pytest.raises(ValueError, match="teacher_log_probs"):
        policy_loss(LossInputs(**base), LossConfig(opd=opd))


def test_metrics_are_token_means_over_trained_tokens() -> None:
    got = opd_metrics(STUDENT, TEACHER, MASK, OPDConfig(per_token_clip=0.1))
    assert got["opd/kl"] == pytest.approx((-0.3 - 0.3 + 0.8 - 4.5 + 0.8) / 5, abs=1e-6)  # before the clip
    assert got["opd/teacher_log_prob"] == pytest.approx((-0.4 - 0.5 - 1.0 - 0.5 - 1.0) / 5, abs=1e-6)
