"""Where the maths deliberately differ from Relax's code (Relax has a bug there; issue 17): each example that
`jobspec.docs.MATHS_DEVIATIONS` prints beside its flag, computed here with numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from jobspec.docs import MATHS_DEVIATIONS, render_parameters_md
from jobspec.spec import FIELDS
from runtime.algos.advantages import AdvantageConfig, AdvantageInputs, compute_advantages
from runtime.algos.losses import LOSS_TYPES, LossConfig, LossInputs
from runtime.algos.surrogates import POLICY_SURROGATES, PolicySurrogate, SurrogateParams
from runtime.spec import RuntimeSpec


def test_eps_clip_c_applies_the_dual_clip() -> None:
    """A = -1, ratio 5, eps 0.2: PPO-clip is max(-A r, -A clip(r, 0.8, 1.2)) = max(5, 1.2) = 5 (Relax, which
    never passes --eps-clip-c on); the dual clip min(5, -A * 3) = 3 here."""
    old = torch.tensor([[0.0]])
    log_probs = old + math.log(5.0)  # ratio e^(log pi - log pi_old) = 5
    adv, mask = torch.tensor([[-1.0]]), torch.ones(1, 1)
    ppo = POLICY_SURROGATES.get(PolicySurrogate.PPO_CLIP)
    dual = SurrogateParams(eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=3.0)
    plain = SurrogateParams(eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=None)
    assert ppo(log_probs, old, adv, mask, dual).loss.item() == pytest.approx(3.0)
    assert ppo(log_probs, old, adv, mask, plain).loss.item() == pytest.approx(5.0)  # Relax's number


def test_a_group_of_identical_non_binary_rewards_gets_zero_advantage() -> None:
    """Eight samples of one prompt all rewarded 0.9: every reward equals the mean, so the advantage is 0
    (Relax's float32 arithmetic leaves about -0.06)."""
    rewards = torch.full((8,), 0.9)
    out = compute_advantages(
        "grpo",
        AdvantageInputs(rewards, torch.zeros(8, dtype=torch.long), torch.ones(8, 2)),
        AdvantageConfig(),
    )
    assert out.advantages.abs().max().item() == 0.0


def test_a_batch_of_partial_groups_is_normalised_per_prompt() -> None:
    """--n-samples-per-prompt 4 and 6 samples rewarded 1, 0, 0, 0 | 1, 1. Prompt 0: mean 0.25, unbiased std
    sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5, so 0.75 / 0.5 = 1.5 and -0.25 / 0.5 = -0.5; prompt 1: no spread, 0.
    (One group of six, as Relax's reference commit takes it: mean 0.5, std sqrt(6 * 0.25 / 5), +-0.91.)"""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    out = compute_advantages("grpo", AdvantageInputs(rewards, groups, torch.ones(6, 1)), AdvantageConfig())
    assert out.advantages[:, 0].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, 0.0, 0.0], abs=1e-5)
    assert 0.5 / math.sqrt(6 * 0.25 / 5) == pytest.approx(0.91, abs=5e-3)  # the reference commit's number


def test_opsm_clipfrac_counts_trained_tokens_only() -> None:
    """One sample, 4 response tokens, tokens 1 and 2 tool output (not trained); A < 0 and the policy drifted
    (seq KL = 0.5 > delta), so OPSM drops it: 2 of its 2 trained tokens, clipfrac 1 (Relax: 4 / 2 = 2)."""
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    old = torch.zeros(1, 4)
    inputs = LossInputs(
        log_probs=old - 0.5,  # seq KL = mean over trained tokens of (log pi_old - log pi) = 0.5
        entropy=torch.zeros(1, 4),
        loss_mask=mask,
        old_log_probs=old,
        advantages=torch.full((1, 4), -1.0),
    )
    _, metrics = LOSS_TYPES.get("policy_loss")(inputs, LossConfig(use_opsm=True, opsm_delta=1e-4))
    assert metrics["opsm_clipfrac"].item() == 1.0


def test_each_deviation_is_printed_beside_its_flag_with_its_example() -> None:
    page = render_parameters_md()
    assert len(MATHS_DEVIATIONS) == 4
    for deviation in MATHS_DEVIATIONS:
        flag = FIELDS[deviation.field].flag
        rows = [line for line in page.splitlines() if line.startswith(f"| `--{flag}`")]
        assert rows, flag
        example = deviation.example.replace("|", "\\|")
        assert any("deliberate deviation" in row and example in row for row in rows), flag


def test_reinforce_plus_plus_baseline_with_kl_coef_loads_the_reference_model() -> None:
    """Its advantages now take --kl-coef (as Relax's do), so the job needs pi_ref's log-probs."""
    spec = RuntimeSpec(advantage_estimator="reinforce_plus_plus_baseline", kl_coef=0.1)
    assert spec.needs_reference
    assert not RuntimeSpec(advantage_estimator="reinforce_plus_plus_baseline").needs_reference
