"""Advantage estimators against naive per-sample loop references, plus shape/mask invariants."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from runtime.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    AdvantageEstimator,
    AdvantageInputs,
    compute_advantages,
    compute_advantages_and_returns,
    generalized_advantage_estimation,
    last_token_onehot,
    whiten,
)
from runtime.algos.opd import OPDConfig

FAST = settings(max_examples=30, deadline=None, database=None)

# -- naive references (plain Python over lists) -------------------------------------------------------------


def naive_kl(lp: float, ref: float, kind: str) -> float:
    d = lp - ref
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return math.exp(-d) - 1 + d
    clamped = min(max(-d, -20.0), 20.0)
    return min(max(math.exp(clamped) - 1 - clamped, -10.0), 10.0)


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


def naive_rloo(rewards: list[float], groups: list[int]) -> list[float]:
    out = []
    for i, r in enumerate(rewards):
        others = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i] and j != i]
        out.append(r - sum(others) / len(others))
    return out


def positions(row: list[float]) -> list[int]:
    return [t for t, m in enumerate(row) if m > 0]


def naive_row_kl(b: int, x: dict, kl_coef: float, kind: str, mask_key: str = "loss_mask") -> list[float]:
    """Per-token reward-shaping KL of row b (0 off the mask / without kl_coef)."""
    mask = x[mask_key][b]
    if kl_coef == 0:
        return [0.0] * len(mask)
    return [
        naive_kl(x["log_probs"][b][t], x["ref"][b][t], kind) if mask[t] > 0 else 0.0 for t in range(len(mask))
    ]


def naive_gae(b: int, x: dict, gamma: float, lambd: float, kl_coef: float, kind: str):
    loss_mask, steps = x["loss_mask"][b], positions(x["response_mask"][b])
    kl = naive_row_kl(b, x, kl_coef, kind, "response_mask")  # Relax: the KL penalty on every response token
    T = len(loss_mask)
    rewards = [-kl_coef * kl[t] for t in steps]
    if steps:
        rewards[-1] += x["rewards"][b]
    values = [x["values"][b][t] for t in steps]
    adv, gae = [0.0] * len(steps), 0.0
    for i in reversed(range(len(steps))):
        nxt = values[i + 1] if i + 1 < len(steps) else 0.0
        gae = rewards[i] + gamma * nxt - values[i] + gamma * lambd * gae
        adv[i] = gae
    out_a, out_r = [0.0] * T, [0.0] * T
    for i, t in enumerate(steps):
        out_a[t] = adv[i] * loss_mask[t]
        out_r[t] = (adv[i] + values[i]) * loss_mask[t]
    return out_a, out_r


def naive_rpp_returns(b: int, x: dict, gamma: float, kl_coef: float, kind: str) -> list[float]:
    """Relax's loop: every column a step (an untrained one has reward 0 and still discounts); the trained
    tokens' returns are the same as over the response's columns only, as the reward sits on the last one."""
    loss_mask = x["loss_mask"][b]
    kl = naive_row_kl(b, x, kl_coef, kind)
    T = len(loss_mask)
    token_reward = [-kl_coef * kl[t] * loss_mask[t] for t in range(T)]
    trained = positions(loss_mask)
    if trained:
        token_reward[trained[-1]] += x["rewards"][b]
    out, running = [0.0] * T, 0.0
    for t in reversed(range(T)):
        running = token_reward[t] + gamma * running
        out[t] = running * loss_mask[t]
    return out


def naive_whiten(rows: list[list[float]], mask: list[list[float]], eps: float = 1e-8) -> list[list[float]]:
    vals = [rows[b][t] for b in range(len(rows)) for t in range(len(rows[b])) if mask[b][t] > 0]
    n = max(len(vals), 1)
    mean = sum(vals) / n
    var = sum((v - mean) ** 2 for v in vals) / max(n - 1, 1)  # Bessel-corrected, as Relax
    return [
        [(rows[b][t] - mean) / math.sqrt(var + eps) if mask[b][t] > 0 else 0.0 for t in range(len(rows[b]))]
        for b in range(len(rows))
    ]


# -- random batches with variable lengths, padding and multi-turn holes ----------------------------------------


def random_batch(
    seed: int, batch: int = 8, width: int = 10, group_size: int = 4, holes: bool = False
) -> dict:
    gen = torch.Generator().manual_seed(seed)
    response_mask = torch.zeros(batch, width)
    for b in range(batch):
        prompt = int(torch.randint(1, 4, (1,), generator=gen))
        length = int(torch.randint(0 if b else 1, width - prompt + 1, (1,), generator=gen))
        response_mask[b, prompt : prompt + length] = 1.0
    loss_mask = response_mask.clone()
    if holes:  # tool output inside the response: not trained, still a time step
        loss_mask *= (torch.rand(batch, width, generator=gen) > 0.25).float()
    return {
        "rewards": torch.randint(0, 3, (batch,), generator=gen).float() + torch.rand(batch, generator=gen),
        "group_index": torch.arange(batch) // group_size,
        "loss_mask": loss_mask,
        "response_mask": response_mask,
        "log_probs": -torch.rand(batch, width, generator=gen) * 3,
        "ref": -torch.rand(batch, width, generator=gen) * 3,
        "values": torch.randn(batch, width, generator=gen),
        "teacher": -torch.rand(batch, width, generator=gen) * 3,
    }


def inputs_of(x: dict, *, with_response_mask: bool = False) -> AdvantageInputs:
    return AdvantageInputs(
        rewards=x["rewards"],
        group_index=x["group_index"],
        loss_mask=x["loss_mask"],
        log_probs=x["log_probs"],
        ref_log_probs=x["ref"],
        values=x["values"],
        response_mask=x["response_mask"] if with_response_mask else None,
        teacher_log_probs=x["teacher"],
    )


def as_lists(x: dict, *, with_response_mask: bool = False) -> dict:
    out = {k: v.tolist() for k, v in x.items()}
    if not with_response_mask:
        out["response_mask"] = out["loss_mask"]
    return out


def broadcast(scores: list[float], mask: list[list[float]]) -> torch.Tensor:
    return torch.tensor([[s * m for m in row] for s, row in zip(scores, mask, strict=True)])


# -- estimators vs references --------------------------------------------------------------------------------


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
    expected = broadcast(naive_grpo(rewards.tolist(), groups.tolist(), std_norm), mask.tolist())
    assert_close(out.advantages, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(out.advantages, out.returns)


@pytest.mark.parametrize("name", ["gspo", "sapo", "cispo"])
def test_gspo_sapo_cispo_share_grpo_advantages(name: str) -> None:
    x = random_batch(1)
    assert ADVANTAGE_ESTIMATORS.get(name) is ADVANTAGE_ESTIMATORS.get("grpo")
    assert_close(
        compute_advantages_and_returns(name, inputs_of(x), AdvantageConfig()).advantages,
        compute_advantages_and_returns("grpo", inputs_of(x), AdvantageConfig()).advantages,
    )


def test_grpo_without_rewards_normalization_passes_raw_rewards() -> None:
    rewards, groups, mask = torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 3)
    out = compute_advantages(
        "grpo", AdvantageInputs(rewards, groups, mask), AdvantageConfig(rewards_normalization=False)
    )
    assert out.advantages.tolist() == [[1.0] * 3, [0.0] * 3]


@pytest.mark.parametrize("kl_coef", [0.0, 0.2])
def test_rloo_matches_naive_reference(kl_coef: float) -> None:
    x = random_batch(2)
    config = AdvantageConfig(kl_coef=kl_coef, kl_type="k3")
    out = compute_advantages_and_returns("rloo", inputs_of(x), config)
    lx = as_lists(x)
    shaped = [
        lx["rewards"][b] - kl_coef * sum(naive_row_kl(b, lx, kl_coef, "k3"))
        for b in range(len(lx["rewards"]))
    ]
    expected = broadcast(naive_rloo(shaped, lx["group_index"]), lx["loss_mask"])
    assert_close(out.advantages, expected, atol=1e-5, rtol=1e-5)
    assert_close(out.returns, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("gamma", "lambd", "kl_coef", "kind", "holes"),
    [(1.0, 1.0, 0.0, "k1", False), (0.9, 0.95, 0.1, "k1", False), (0.99, 0.5, 0.05, "low_var_kl", True)],
)
def test_ppo_gae_matches_naive_reference(
    gamma: float, lambd: float, kl_coef: float, kind: str, holes: bool
) -> None:
    x = random_batch(3, holes=holes)
    config = AdvantageConfig(gamma=gamma, lambd=lambd, kl_coef=kl_coef, kl_type=kind)
    out = compute_advantages_and_returns("ppo", inputs_of(x, with_response_mask=holes), config)
    lx = as_lists(x, with_response_mask=holes)
    pairs = [naive_gae(b, lx, gamma, lambd, kl_coef, kind) for b in range(len(lx["rewards"]))]
    assert_close(out.advantages, torch.tensor([a for a, _ in pairs]), atol=1e-5, rtol=1e-5)
    assert_close(out.returns, torch.tensor([r for _, r in pairs]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("gamma", "kl_coef", "holes"), [(1.0, 0.0, False), (0.9, 0.1, False), (0.95, 0.3, True)]
)
def test_reinforce_plus_plus_matches_naive_reference(gamma: float, kl_coef: float, holes: bool) -> None:
    x = random_batch(4, holes=holes)
    config = AdvantageConfig(gamma=gamma, kl_coef=kl_coef, kl_type="k2")
    out = compute_advantages_and_returns(
        "reinforce_plus_plus", inputs_of(x, with_response_mask=holes), config
    )
    lx = as_lists(x, with_response_mask=holes)
    returns = [naive_rpp_returns(b, lx, gamma, kl_coef, "k2") for b in range(len(lx["rewards"]))]
    assert_close(out.returns, torch.tensor(returns), atol=1e-5, rtol=1e-5)
    assert_close(out.advantages, torch.tensor(naive_whiten(returns, lx["loss_mask"])), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("kl_coef", "normalized"), [(0.0, True), (0.2, True), (0.1, False)])
def test_reinforce_plus_plus_baseline_matches_naive_reference(kl_coef: float, normalized: bool) -> None:
    x = random_batch(5, holes=True)
    config = AdvantageConfig(kl_coef=kl_coef, kl_type="k3", rewards_normalization=normalized)
    out = compute_advantages_and_returns("reinforce_plus_plus_baseline", inputs_of(x), config)
    lx = as_lists(x)
    scores = naive_grpo(lx["rewards"], lx["group_index"], std_norm=False) if normalized else lx["rewards"]
    raw = [
        [(scores[b] - kl_coef * k) * m for k, m in zip(naive_row_kl(b, lx, kl_coef, "k3"), row, strict=True)]
        for b, row in enumerate(lx["loss_mask"])
    ]
    assert_close(out.returns, torch.tensor(raw), atol=1e-5, rtol=1e-5)
    assert_close(out.advantages, torch.tensor(naive_whiten(raw, lx["loss_mask"])), atol=1e-4, rtol=1e-4)


def test_opd_adds_teacher_minus_student_before_whitening() -> None:
    x = random_batch(6)
    coef = 0.5
    plain = compute_advantages_and_returns("grpo", inputs_of(x), AdvantageConfig())
    with_opd = compute_advantages_and_returns(
        "grpo", inputs_of(x), AdvantageConfig(opd=OPDConfig(kl_coef=coef))
    )
    lx = as_lists(x)
    term = [
        [coef * (lx["teacher"][b][t] - lx["log_probs"][b][t]) * lx["loss_mask"][b][t] for t in range(10)]
        for b in range(8)
    ]
    assert_close(with_opd.advantages - plain.advantages, torch.tensor(term), atol=1e-5, rtol=1e-5)
    assert torch.equal(with_opd.returns, plain.returns)  # OPD shapes the advantages only
    whitened = compute_advantages_and_returns(
        "grpo", inputs_of(x), AdvantageConfig(opd=OPDConfig(kl_coef=coef), normalize_advantages=True)
    )
    expected = naive_whiten((plain.advantages + torch.tensor(term)).tolist(), lx["loss_mask"])
    assert_close(whitened.advantages, torch.tensor(expected), atol=1e-4, rtol=1e-4)


def test_whiten_matches_naive_reference_and_has_unit_variance() -> None:
    x = random_batch(7)
    adv = torch.randn(8, 10)
    out = whiten(adv, x["loss_mask"])
    assert_close(out, torch.tensor(naive_whiten(adv.tolist(), x["loss_mask"].tolist())), atol=1e-5, rtol=1e-5)
    vals = out[x["loss_mask"].bool()]
    assert vals.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert vals.var(unbiased=True).item() == pytest.approx(1.0, abs=1e-3)


# -- Relax's conventions on hand-sized examples (the expected numbers are worked out by hand) ----------------


def test_whitening_divides_by_the_bessel_corrected_variance() -> None:
    """[1, 2, 3, 4, 5]: mean 3, squares 4 + 1 + 0 + 1 + 4 = 10, variance 10 / (5 - 1) = 2.5 (Relax's
    distributed_masked_whiten), so 5 -> 2 / sqrt(2.5) = 1.2649; dividing by N would give 2 / sqrt(2) = 1.4142."""
    adv = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    out = whiten(adv, mask)
    expected = [(v - 3) / math.sqrt(10 / 4) for v in (1, 2, 3, 4, 5)] + [0.0]
    assert out[0].tolist() == pytest.approx(expected, abs=1e-5)
    assert out[0, 4].item() == pytest.approx(1.2649, abs=1e-4)
    assert whiten(torch.tensor([[7.0]]), torch.tensor([[1.0]])).tolist() == [[0.0]]  # one token: no spread


def test_ppo_kl_penalty_falls_on_every_response_token() -> None:
    """One sample, 4 response tokens; tokens 1 and 2 are tool output (not trained). k1 = log pi - log pi_ref
    = 1, 2, 2, 1; kl_coef 0.1; reward 1; V = 0; gamma = lambda = 1, so A_t is the sum of the token rewards
    from t on. Token rewards -0.1, -0.2, -0.2, -0.1 + 1: A_0 = -0.1 - 0.2 - 0.2 + 0.9 = 0.4, A_3 = 0.9.
    (The penalty on trained tokens only would give A_0 = -0.1 + 0.9 = 0.8.)"""
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0]),
        group_index=torch.tensor([0]),
        loss_mask=torch.tensor([[1.0, 0.0, 0.0, 1.0]]),
        log_probs=torch.tensor([[-1.0, -1.0, -1.0, -1.0]]),
        ref_log_probs=torch.tensor([[-2.0, -3.0, -3.0, -2.0]]),
        values=torch.zeros(1, 4),
        response_mask=torch.ones(1, 4),
    )
    out = compute_advantages("ppo", inputs, AdvantageConfig(kl_coef=0.1, kl_type="k1"))
    assert out.advantages[0].tolist() == pytest.approx([0.4, 0.0, 0.0, 0.9], abs=1e-6)
    assert out.returns[0].tolist() == pytest.approx([0.4, 0.0, 0.0, 0.9], abs=1e-6)  # A + V, V = 0


def test_reinforce_plus_plus_discounts_through_untrained_tokens_without_a_response_mask() -> None:
    """Columns: prompt, trained, tool output, trained, padding; reward 1, gamma 0.5, no KL and no
    response_mask. Relax discounts over the whole response: G_3 = 1, G_2 = 0.5 * 1 = 0.5 (not trained),
    G_1 = 0.5 * 0.5 = 0.25. (Skipping the tool token would give G_1 = 0.5.)"""
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0]),
        group_index=torch.tensor([0]),
        loss_mask=torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.0]]),
    )
    out = compute_advantages("reinforce_plus_plus", inputs, AdvantageConfig(gamma=0.5))
    assert out.returns[0].tolist() == pytest.approx([0.0, 0.25, 0.0, 1.0, 0.0], abs=1e-6)
    with_mask = AdvantageInputs(
        inputs.rewards, inputs.group_index, inputs.loss_mask, response_mask=torch.tensor([[0.0, 1, 1, 1, 0]])
    )
    same = compute_advantages("reinforce_plus_plus", with_mask, AdvantageConfig(gamma=0.5))
    assert torch.equal(same.returns, out.returns)


def test_reinforce_plus_plus_baseline_takes_kl_coef_and_raw_rewards() -> None:
    """Two samples of one prompt, rewards 1 and 0, two trained tokens each, k1 = 0.5, 1 | 0, 2, kl_coef 0.1.
    Centred scores +0.5, -0.5; A_t = score - 0.1 k1_t = 0.45, 0.40 | -0.50, -0.70. With
    disable-rewards-normalization the scores are the raw rewards: 0.95, 0.90 | 0.00, -0.20. The stage then
    whitens the four values (mean and Bessel-corrected variance, worked out below)."""
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        group_index=torch.tensor([0, 0]),
        loss_mask=torch.ones(2, 2),
        log_probs=torch.tensor([[-0.5, -1.0], [-1.0, -1.0]]),
        ref_log_probs=torch.tensor([[-1.0, -2.0], [-1.0, -3.0]]),
    )
    config = AdvantageConfig(kl_coef=0.1, kl_type="k1")
    out = compute_advantages("reinforce_plus_plus_baseline", inputs, config)
    assert out.advantages.flatten().tolist() == pytest.approx([0.45, 0.40, -0.50, -0.70], abs=1e-6)
    raw = compute_advantages(
        "reinforce_plus_plus_baseline", inputs, AdvantageConfig(kl_coef=0.1, rewards_normalization=False)
    )
    assert raw.advantages.flatten().tolist() == pytest.approx([0.95, 0.90, 0.00, -0.20], abs=1e-6)
    staged = compute_advantages_and_returns("reinforce_plus_plus_baseline", inputs, config)
    values = [0.45, 0.40, -0.50, -0.70]
    mean = sum(values) / 4  # -0.0875
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)
    assert staged.advantages.flatten().tolist() == pytest.approx([(v - mean) / std for v in values], abs=1e-5)
    assert staged.returns.flatten().tolist() == pytest.approx(values, abs=1e-6)  # returns: not whitened


# -- the stage's rules -------------------------------------------------------------------------------------


def test_stage_whitens_only_when_asked_or_reinforce_plus_plus() -> None:
    x = random_batch(8)
    raw = compute_advantages("grpo", inputs_of(x), AdvantageConfig())
    staged = compute_advantages_and_returns("grpo", inputs_of(x), AdvantageConfig())
    assert torch.equal(raw.advantages, staged.advantages)
    normalized = compute_advantages_and_returns(
        "grpo", inputs_of(x), AdvantageConfig(normalize_advantages=True)
    )
    assert_close(normalized.advantages, whiten(raw.advantages, x["loss_mask"]))
    rpp = compute_advantages_and_returns("reinforce_plus_plus", inputs_of(x), AdvantageConfig())
    rpp_flag = compute_advantages_and_returns(
        "reinforce_plus_plus", inputs_of(x), AdvantageConfig(normalize_advantages=True)
    )
    assert torch.equal(rpp.advantages, rpp_flag.advantages)  # whitened once, not twice


def test_stage_refusals_name_the_conflicting_setting() -> None:
    x = random_batch(9)
    with pytest.raises(ValueError, match="normalize-advantages"):
        compute_advantages_and_returns("rloo", inputs_of(x), AdvantageConfig(normalize_advantages=True))
    with pytest.raises(ValueError, match="disable-rewards-normalization"):
        compute_advantages_and_returns("rloo", inputs_of(x), AdvantageConfig(rewards_normalization=False))
    lonely = AdvantageInputs(torch.ones(3), torch.tensor([0, 0, 1]), torch.ones(3, 2))
    with pytest.raises(ValueError, match="at least 2 samples"):
        compute_advantages_and_returns("rloo", lonely, AdvantageConfig())
    bare = AdvantageInputs(x["rewards"], x["group_index"], x["loss_mask"])
    with pytest.raises(ValueError, match="critic"):
        compute_advantages_and_returns("ppo", bare, AdvantageConfig())
    for name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        with pytest.raises(ValueError, match="ref_log_probs"):
            compute_advantages_and_returns(name, bare, AdvantageConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="teacher_log_probs"):
        compute_advantages_and_returns("grpo", bare, AdvantageConfig(opd=OPDConfig()))


def test_kl_coef_needs_no_reference_when_zero() -> None:
    x = random_batch(10)
    bare = AdvantageInputs(x["rewards"], x["group_index"], x["loss_mask"], values=x["values"])
    for name in ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"):
        compute_advantages_and_returns(name, bare, AdvantageConfig())


def test_last_token_onehot() -> None:
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert last_token_onehot(mask).tolist() == [[0, 0, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]


# -- invariants (hypothesis) -------------------------------------------------------------------------------


@st.composite
def batches(draw: st.DrawFn, min_group: int = 1) -> dict:
    groups = draw(st.integers(1, 3))
    group_size = draw(st.integers(max(min_group, 1), 4))
    width = draw(st.integers(1, 7))
    batch = groups * group_size
    lengths = draw(st.lists(st.integers(0, width), min_size=batch, max_size=batch))
    starts = [draw(st.integers(0, width - n)) for n in lengths]
    mask = torch.zeros(batch, width)
    for b, (s, n) in enumerate(zip(starts, lengths, strict=True)):
        mask[b, s : s + n] = 1.0
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))  # values: seeded, cheap to draw
    rewards = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.5]), min_size=batch, max_size=batch))
    return {
        "rewards": torch.tensor(rewards) + 0.1 * torch.randn(batch, generator=gen) * draw(st.booleans()),
        "group_index": torch.arange(batch) // group_size,
        "loss_mask": mask,
        "response_mask": mask,
        "log_probs": -torch.rand(batch, width, generator=gen) * 3,
        "ref": -torch.rand(batch, width, generator=gen) * 3,
        "values": torch.randn(batch, width, generator=gen) * 2,
        "teacher": -torch.rand(batch, width, generator=gen) * 3,
    }


def _config(name: str) -> AdvantageConfig:
    return AdvantageConfig(kl_coef=0.1, kl_type="k3", gamma=0.9, lambd=0.8, opd=OPDConfig(kl_coef=0.3))


@FAST
@given(
    x=batches(min_group=2),
    name=st.sampled_from(list(AdvantageEstimator)),
    pad=st.integers(1, 3),
    seed=st.integers(0, 1000),
)
def test_padding_never_changes_advantages(x: dict, name: str, pad: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    base = compute_advantages_and_returns(name, inputs_of(x), _config(name))
    padded = dict(x)
    width = x["loss_mask"].shape[1]
    for key in ("loss_mask", "response_mask"):
        padded[key] = torch.nn.functional.pad(x[key], (0, pad))
    off = padded["loss_mask"] == 0
    for key in ("log_probs", "ref", "values", "teacher"):  # garbage wherever the mask is 0
        garbage = -torch.rand(x[key].shape[0], width + pad, generator=gen) * 50
        padded[key] = torch.where(off, garbage, torch.nn.functional.pad(x[key], (0, pad)))
    out = compute_advantages_and_returns(name, inputs_of(padded), _config(name))
    assert_close(out.advantages[:, :width], base.advantages)
    assert_close(out.returns[:, :width], base.returns)
    assert not out.advantages[:, width:].any() and not out.returns[:, width:].any()


@FAST
@given(x=batches(), name=st.sampled_from(list(AdvantageEstimator)))
def test_outputs_are_finite_and_zero_off_the_mask(x: dict, name: str) -> None:
    if name == "rloo" and int(torch.bincount(x["group_index"]).min()) < 2:
        return
    out = compute_advantages_and_returns(name, inputs_of(x), _config(name))
    off = x["loss_mask"] == 0
    for tensor in (out.advantages, out.returns):
        assert tensor.shape == x["loss_mask"].shape
        assert torch.isfinite(tensor).all()
        assert not tensor[off].any()


@FAST
@given(x=batches(), value=st.floats(-5, 5, allow_nan=False), std_norm=st.booleans())
def test_identical_rewards_give_zero_grpo_advantage(x: dict, value: float, std_norm: bool) -> None:
    inputs = AdvantageInputs(torch.full_like(x["rewards"], value), x["group_index"], x["loss_mask"])
    out = compute_advantages_and_returns("grpo", inputs, AdvantageConfig(std_normalization=std_norm))
    assert out.advantages.abs().max().item() < 1e-5


@FAST
@given(x=batches(min_group=2))
def test_rloo_and_baseline_advantages_sum_to_zero_per_group(x: dict) -> None:
    inputs = AdvantageInputs(x["rewards"], x["group_index"], torch.ones_like(x["loss_mask"]))
    for name in ("rloo", "reinforce_plus_plus_baseline"):
        per_sample = compute_advantages(name, inputs, AdvantageConfig()).advantages[:, 0]
        sums = torch.zeros(int(x["group_index"].max()) + 1).index_add_(0, x["group_index"], per_sample)
        assert sums.abs().max().item() < 1e-4


@FAST
@given(x=batches())
def test_gae_with_unit_gamma_and_lambda_is_returns_minus_values(x: dict) -> None:
    mask = x["loss_mask"]
    token_rewards = torch.randn_like(mask)
    adv, ret = generalized_advantage_estimation(token_rewards, x["values"], mask, gamma=1.0, lambd=1.0)
    reward_to_go = (token_rewards * mask).flip(1).cumsum(1).flip(1) * mask
    assert_close(adv, (reward_to_go - x["values"]) * mask, atol=1e-4, rtol=1e-4)
    assert_close(ret, reward_to_go, atol=1e-4, rtol=1e-4)


@FAST
@given(x=batches())
def test_gae_with_zero_lambda_is_one_step_td_error(x: dict) -> None:
    mask = x["loss_mask"]  # contiguous responses: the next step is the next column
    token_rewards, values = torch.randn_like(mask), x["values"]
    adv, _ = generalized_advantage_estimation(token_rewards, values, mask, gamma=0.7, lambd=0.0)
    next_values = torch.nn.functional.pad((values * mask)[:, 1:], (0, 1))
    assert_close(adv, (token_rewards + 0.7 * next_values - values) * mask, atol=1e-5, rtol=1e-5)


@FAST
@given(x=batches())
def test_whitening_is_idempotent(x: dict) -> None:
    adv, mask = x["values"], x["loss_mask"]
    picked = adv[mask > 0]
    if picked.numel() == 0 or picked.var(unbiased=False) < 1e-3:  # no spread: whitening gives 0 or noise
        return
    once = whiten(adv, mask)
    assert_close(whiten(once, mask), once, atol=1e-4, rtol=1e-4)
