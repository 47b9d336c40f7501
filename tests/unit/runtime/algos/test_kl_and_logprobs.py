"""KL estimators (incl. the unbiased weighting) and token log-probs / entropies against naive loops."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.algos.kl import KL_ESTIMATORS, KLType, compute_approx_kl
from runtime.algos.logprobs import entropy_from_logits, token_entropy, token_log_probs


def naive_kl(d: float, kind: str) -> float:
    """d = log pi - log pi_ref."""
    return {
        "k1": d,
        "k2": 0.5 * d * d,
        "k3": math.exp(-d) - 1 + d,
        "low_var_kl": min(max(math.exp(min(max(-d, -20), 20)) - 1 - min(max(-d, -20), 20), -10), 10),
    }[kind]


@pytest.mark.parametrize("kind", list(KLType))
def test_kl_estimators_match_naive_reference(kind: str) -> None:
    gen = torch.Generator().manual_seed(2)
    lp, ref = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
    out = compute_approx_kl(lp, ref, kind)
    for b in range(3):
        for t in range(4):
            d = lp[b, t].item() - ref[b, t].item()
            assert out[b, t].item() == pytest.approx(naive_kl(d, kind), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("kind", list(KLType))
def test_unbiased_kl_is_importance_weighted_then_clamped_once(kind: str) -> None:
    gen = torch.Generator().manual_seed(3)
    lp, ref, old = (torch.randn(2, 5, generator=gen) * 3 for _ in range(3))
    ratio = (lp - old).exp()
    out = compute_approx_kl(lp, ref, kind, importance_ratio=ratio)
    for b in range(2):
        for t in range(5):
            d = lp[b, t].item() - ref[b, t].item()
            if kind == "low_var_kl":  # Relax: weight the unclamped k3, then clamp the product once
                want = min(max(ratio[b, t].item() * naive_kl(d, "k3"), -10), 10)
            else:
                want = ratio[b, t].item() * naive_kl(d, kind)
            assert out[b, t].item() == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_unbiased_low_var_kl_example_value_and_gradient() -> None:
    """log pi = -3, log pi_ref = 0, w = pi / pi_old = 0.5 (log pi_old = -3 + ln 2).

    k3 = e^(ref - lp) - (ref - lp) - 1 = e^3 - 3 - 1 = 16.0855, under the clamp of 10 only once weighted:
    value = w * k3 = 0.5 * 16.0855 = 8.0428.
    Gradient w.r.t. lp, with w = e^(lp - lp_old) (dw/dlp = w) and dk3/dlp = -e^(ref - lp) + 1 = 1 - e^3:
    d(w k3)/dlp = w k3 + w (1 - e^3) = 0.5 (e^3 - 4 + 1 - e^3) = 0.5 * (-3) = -1.5: the KL term pulls log pi
    up towards the reference. Clamping k3 to 10 before the weighting as well gave 5.0 with gradient
    +w * 10 = +5.0, pushing log pi further down."""
    lp = torch.tensor([-3.0], requires_grad=True)
    ratio = (lp - torch.tensor([-3.0 + math.log(2.0)])).exp()
    value = compute_approx_kl(lp, torch.tensor([0.0]), "low_var_kl", importance_ratio=ratio)
    value.sum().backward()
    assert value.item() == pytest.approx(0.5 * (math.exp(3) - 3 - 1), rel=1e-5)
    assert value.item() == pytest.approx(8.04, abs=5e-3)
    assert lp.grad is not None and lp.grad.item() == pytest.approx(-1.5, abs=1e-4)
    # the weighted product is clamped: w = 1 with the same tokens gives 16.09 -> 10, gradient 0
    capped = compute_approx_kl(lp.detach(), torch.tensor([0.0]), "low_var_kl", importance_ratio=torch.ones(1))
    assert capped.item() == 10.0


def test_kl_is_zero_for_identical_policies_and_k3_nonnegative() -> None:
    lp = torch.randn(2, 3)
    for kind in KL_ESTIMATORS:
        assert compute_approx_kl(lp, lp, kind).abs().max().item() < 1e-6
    assert (compute_approx_kl(torch.randn(50), torch.randn(50), "k3") >= -1e-7).all()


def test_unbiased_kl_is_unbiased_under_the_old_policy() -> None:
    """E_{y ~ pi_old}[pi/pi_old * k3] = KL(pi || pi_ref), which plain k3 on pi_old's samples misses."""
    gen = torch.Generator().manual_seed(4)
    logits = {k: torch.randn(6, generator=gen) for k in ("pi", "ref", "old")}
    logp = {k: torch.log_softmax(v, -1) for k, v in logits.items()}
    exact = (logp["pi"].exp() * (logp["pi"] - logp["ref"])).sum()
    p_old = logp["old"].exp()
    weighted = (
        p_old * compute_approx_kl(logp["pi"], logp["ref"], "k3", (logp["pi"] - logp["old"]).exp())
    ).sum()
    plain = (p_old * compute_approx_kl(logp["pi"], logp["ref"], "k3")).sum()
    assert weighted.item() == pytest.approx(exact.item(), rel=1e-5)
    assert abs(plain.item() - exact.item()) > 1e-3


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
