"""RL maths against naive loop references."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    AdvantageInputs,
    compute_advantages,
    whiten,
)
from runtime.algos.losses import (
    KL_ESTIMATORS,
    LOSS_TYPES,
    LossConfig,
    LossInputs,
    compute_approx_kl,
    compute_ppo_policy_loss,
    entropy_from_logits,
    sample_mean,
    token_entropy,
    token_log_probs,
    token_mean,
)
from runtime.registry import Registry, UnknownNameError


def naive_grpo(rewards: list[float], groups: list[int], std_norm: bool, eps: float = 1e-6) -> list[float]:
    out = []
    for i, r in enumerate(rewards):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i]]
        mean = sum(members) / len(members)
        if not std_norm:
            out.append(r - mean)
            continue
        if len(members) == 1:
            out.append(0.0)
            continue
        var = sum((m - mean) ** 2 for m in members) / (len(members) - 1)
        out.append((r - mean) / (math.sqrt(var) + eps))
    return out


@pytest.mark.parametrize("std_norm", [True, False])
def test_grpo_matches_naive_reference(std_norm: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (24,), generator=gen).float()
    rewards[20:] = torch.tensor([0.3, 0.3, 0.3, 0.3])  # a flat group
    groups = torch.tensor([i // 4 for i in range(24)])
    groups[-1] = 99  # a group of one
    mask = (torch.rand(24, 7, generator=gen) > 0.3).float()
    out = compute_advantages(
        "grpo", AdvantageInputs(rewards, groups, mask), AdvantageConfig(std_normalization=std_norm)
    )
    expected = naive_grpo(rewards.tolist(), groups.tolist(), std_norm)
    for b in range(24):
        for t in range(7):
            assert out.advantages[b, t].item() == pytest.approx(expected[b] * mask[b, t].item(), abs=1e-5)
    assert torch.equal(out.advantages, out.returns)


def test_grpo_without_rewards_normalization_passes_raw_rewards() -> None:
    rewards, groups, mask = torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 3)
    out = compute_advantages(
        "grpo", AdvantageInputs(rewards, groups, mask), AdvantageConfig(rewards_normalization=False)
    )
    assert out.advantages.tolist() == [[1.0] * 3, [0.0] * 3]


def test_whiten_has_zero_mean_unit_variance_on_mask() -> None:
    adv = torch.randn(5, 6)
    mask = torch.ones(5, 6)
    mask[:, 4:] = 0
    out = whiten(adv, mask)
    vals = out[mask.bool()]
    assert vals.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert (vals.pow(2).mean()).item() == pytest.approx(1.0, abs=1e-3)
    assert out[:, 4:].abs().sum() == 0


def test_ppo_loss_matches_naive_reference() -> None:
    gen = torch.Generator().manual_seed(1)
    lp, old = torch.randn(4, 5, generator=gen) * 0.3, torch.randn(4, 5, generator=gen) * 0.3
    adv = torch.randn(4, 5, generator=gen)
    eps_lo, eps_hi, c = 0.2, 0.28, 3.0
    loss, clipped = compute_ppo_policy_loss(lp, old, adv, eps_clip=eps_lo, eps_clip_high=eps_hi, eps_clip_c=c)
    for b in range(4):
        for t in range(5):
            a = adv[b, t].item()
            r = math.exp(lp[b, t].item() - old[b, t].item())
            u = -a * r
            k = -a * min(max(r, 1 - eps_lo), 1 + eps_hi)
            want = max(u, k)
            if a < 0:
                want = min(want, -a * c)
            assert loss[b, t].item() == pytest.approx(want, rel=1e-5, abs=1e-6)
            assert clipped[b, t].item() == float(k > u)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_estimators_match_naive_reference(kind: str) -> None:
    gen = torch.Generator().manual_seed(2)
    lp, ref = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
    out = compute_approx_kl(lp, ref, kind)
    for b in range(3):
        for t in range(4):
            d = lp[b, t].item() - ref[b, t].item()  # log(pi / pi_ref)
            want = {
                "k1": d,
                "k2": 0.5 * d * d,
                "k3": math.exp(-d) - 1 + d,
                "low_var_kl": min(max(math.exp(-d) - 1 + d, -10), 10),
            }[kind]
            assert out[b, t].item() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_kl_is_zero_for_identical_policies_and_k3_nonnegative() -> None:
    lp = torch.randn(2, 3)
    for kind in KL_ESTIMATORS:
        assert compute_approx_kl(lp, lp, kind).abs().max().item() < 1e-6
    assert (compute_approx_kl(torch.randn(50), torch.randn(50), "k3") >= -1e-7).all()


def test_token_log_probs_and_entropy_match_naive_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 7, generator=gen)
    tokens = torch.randint(0, 7, (2, 5), generator=gen)
    temp = 0.7
    lp = token_log_probs(logits, tokens, temp)
    ent = token_entropy(logits, temp)
    for b in range(2):
        assert lp[b, 0] == 0 and ent[b, 0] == 0
        for t in range(1, 5):
            row = [x / temp for x in logits[b, t - 1].tolist()]
            z = math.log(sum(math.exp(x) for x in row))
            assert lp[b, t].item() == pytest.approx(row[tokens[b, t]] - z, abs=1e-5)
            probs = [math.exp(x - z) for x in row]
            assert ent[b, t].item() == pytest.approx(-sum(p * math.log(p) for p in probs), abs=1e-5)
    assert entropy_from_logits(torch.zeros(3, 4)).tolist() == pytest.approx([math.log(4)] * 3)


def test_reductions() -> None:
    values = torch.tensor([[1.0, 3.0, 100.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sample_mean(values, mask).item() == pytest.approx((2.0 + 2.0) / 2)
    assert token_mean(values, mask).item() == pytest.approx(6.0 / 3)


def test_policy_loss_composes_pg_entropy_and_kl() -> None:
    gen = torch.Generator().manual_seed(4)
    lp = torch.randn(3, 4, generator=gen)
    inputs = LossInputs(
        log_probs=lp,
        entropy=torch.rand(3, 4, generator=gen),
        loss_mask=torch.ones(3, 4),
        old_log_probs=lp.clone(),
        ref_log_probs=lp - 0.1,
        advantages=torch.randn(3, 4, generator=gen),
    )
    config = LossConfig(entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k1")
    loss, metrics = LOSS_TYPES.get("policy_loss")(inputs, config)
    want = metrics["pg_loss"] - 0.01 * metrics["entropy"] + 0.5 * metrics["kl_loss"]
    assert loss.item() == pytest.approx(want.item(), abs=1e-6)
    assert metrics["kl_loss"].item() == pytest.approx(0.1, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == 0.0  # ratio is exactly 1
    # with ratio 1 the PPO loss is -mean(A): its gradient is the vanilla policy gradient
    assert metrics["pg_loss"].item() == pytest.approx(-inputs.advantages.mean(dim=1).mean().item(), abs=1e-6)


def test_sft_loss_is_masked_nll_and_has_its_alias() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    inputs = LossInputs(log_probs=lp, entropy=torch.zeros(1, 3), loss_mask=mask)
    loss, _ = LOSS_TYPES.get("sft")(inputs, LossConfig())
    assert loss.item() == pytest.approx(-(math.log(0.25) + math.log(0.9)) / 2, abs=1e-6)
    assert LOSS_TYPES.get("sft_loss") is LOSS_TYPES.get("sft")


def test_registry_refuses_duplicates_and_lists_names_on_a_miss() -> None:
    reg: Registry = Registry("widget")
    reg.register("a")(object())
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(object())
    with pytest.raises(UnknownNameError, match="valid names: a"):
        reg.get("b")
    with pytest.raises(UnknownNameError, match="grpo"):
        ADVANTAGE_ESTIMATORS.get("nope")
