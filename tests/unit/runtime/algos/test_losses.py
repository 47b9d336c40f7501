"""Policy surrogates, TIS, OPSM, value loss, reducers and the composed loss types against naive loops."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from runtime.algos.losses import (
    LOSS_TYPES,
    LossConfig,
    LossInputs,
    resolve_loss_fn,
)
from runtime.algos.off_policy import icepop_tis, opsm_keep_mask, select_old_log_probs, vanilla_tis
from runtime.algos.reducers import LOSS_REDUCERS, sample_mean, sample_sum_mean, token_count, token_mean
from runtime.algos.surrogates import (
    POLICY_SURROGATES,
    SURROGATE_OF_ESTIMATOR,
    PolicySurrogate,
    SurrogateParams,
    ppo_clip_from_log_ratio,
    surrogate_for_estimator,
)
from runtime.algos.value import compute_value_loss
from runtime.registry import UnknownNameError

FAST = settings(max_examples=30, deadline=None, database=None)
PARAMS = SurrogateParams(
    eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=3.0, sapo_tau_pos=1.0, sapo_tau_neg=1.05
)

# -- naive references ------------------------------------------------------------------------------------


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def naive_row_surrogate(kind: str, lp: list, old: list, adv: list, mask: list, p: SurrogateParams):
    """Per-token (loss, clipped, ppo_kl) of one sample, on its masked tokens only (None elsewhere)."""
    idx = [t for t, m in enumerate(mask) if m > 0]
    seq = sum(lp[t] - old[t] for t in idx) / max(len(idx), 1)
    out = []
    for t in range(len(mask)):
        if t not in idx:
            out.append(None)
            continue
        a, log_r = adv[t], (seq if kind == "gspo" else lp[t] - old[t])
        r = math.exp(log_r)
        if kind in ("ppo_clip", "gspo"):
            u, c = -a * r, -a * min(max(r, 1 - p.eps_clip), 1 + p.eps_clip_high)
            loss = max(u, c)
            if p.eps_clip_c is not None and a < 0:
                loss = min(loss, -a * p.eps_clip_c)
            out.append((loss, float(c > u), -log_r))
        elif kind == "sapo":
            tau = p.sapo_tau_pos if a > 0 else p.sapo_tau_neg
            g = sigmoid(tau * (r - 1))
            out.append((-(4 / tau) * g * a, float(4 * g * (1 - g) < 0.9), -log_r))
        elif kind == "cispo":
            w = min(r, 1 + p.eps_clip_high) if a >= 0 else max(r, 1 - p.eps_clip)
            clipped = (a >= 0 and r > 1 + p.eps_clip_high) or (a < 0 and r < 1 - p.eps_clip)
            out.append((-w * a * lp[t], float(clipped), -log_r))
        else:  # reinforce
            out.append((-a * lp[t], 0.0, -log_r))
    return out


def naive_sample_mean(values: list[list[float | None]]) -> float:
    means = []
    for row in values:
        kept = [v for v in row if v is not None]
        means.append(sum(kept) / len(kept) if kept else 0.0)
    return sum(means) / len(means)


def naive_token_mean(values: list[list[float | None]]) -> float:
    """Relax's per-token normaliser: each sample counts its masked tokens, at least one."""
    kept = [v for row in values for v in row if v is not None]
    count = sum(max(sum(v is not None for v in row), 1) for row in values)
    return sum(kept) / max(count, 1)


def naive_sample_sum(values: list[list[float | None]]) -> float:
    return sum(sum(v for v in row if v is not None) for row in values) / len(values)


def random_loss_batch(seed: int, batch: int = 6, width: int = 8, drift: float = 0.3) -> dict:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, width)
    for b in range(batch):
        start = int(torch.randint(0, 3, (1,), generator=gen))
        length = int(torch.randint(1 if b else 0, width - start + 1, (1,), generator=gen))
        mask[b, start : start + length] = 1.0
    old = -torch.rand(batch, width, generator=gen) * 2
    adv_seq = torch.randn(batch, 1, generator=gen)
    return {
        "log_probs": old + torch.randn(batch, width, generator=gen) * drift,
        "old": old,
        "rollout": old + torch.randn(batch, width, generator=gen) * drift,
        "ref": old + torch.randn(batch, width, generator=gen) * drift,
        "adv": (adv_seq + 0.3 * torch.randn(batch, width, generator=gen)) * mask,
        "entropy": torch.rand(batch, width, generator=gen),
        "mask": mask,
        "values": torch.randn(batch, width, generator=gen),
        "old_values": torch.randn(batch, width, generator=gen),
        "returns": torch.randn(batch, width, generator=gen),
    }


def loss_inputs(
    x: dict, *, log_probs: torch.Tensor | None = None, entropy: torch.Tensor | None = None
) -> LossInputs:
    return LossInputs(
        log_probs=x["log_probs"] if log_probs is None else log_probs,
        entropy=x["entropy"] if entropy is None else entropy,
        loss_mask=x["mask"],
        old_log_probs=x["old"],
        ref_log_probs=x["ref"],
        advantages=x["adv"],
        rollout_log_probs=x["rollout"],
        values=x["values"],
        old_values=x["old_values"],
        returns=x["returns"],
    )


# -- surrogates ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(PolicySurrogate))
def test_surrogates_match_naive_reference(kind: PolicySurrogate) -> None:
    x = random_loss_batch(1, drift=0.4)
    terms = POLICY_SURROGATES.get(kind)(x["log_probs"], x["old"], x["adv"], x["mask"], PARAMS)
    rows = [
        naive_row_surrogate(kind, *(x[k][b].tolist() for k in ("log_probs", "old", "adv", "mask")), PARAMS)
        for b in range(6)
    ]
    mask = x["mask"].bool()
    for i, tensor in enumerate((terms.loss, terms.clipped, terms.ppo_kl)):
        want = [[cell[i] if cell else 0.0 for cell in row] for row in rows]
        assert_close(tensor[mask], torch.tensor(want)[mask], atol=1e-5, rtol=1e-5)
        assert torch.isfinite(tensor).all()


def test_ppo_loss_matches_naive_reference_without_masks() -> None:
    gen = torch.Generator().manual_seed(1)
    lp, old = torch.randn(4, 5, generator=gen) * 0.3, torch.randn(4, 5, generator=gen) * 0.3
    adv = torch.randn(4, 5, generator=gen)
    loss, clipped = ppo_clip_from_log_ratio(lp - old, adv, eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=3.0)
    rows = [
        naive_row_surrogate("ppo_clip", lp[b].tolist(), old[b].tolist(), adv[b].tolist(), [1] * 5, PARAMS)
        for b in range(4)
    ]
    assert_close(loss, torch.tensor([[c[0] for c in row] for row in rows]), atol=1e-6, rtol=1e-5)
    assert_close(clipped, torch.tensor([[c[1] for c in row] for row in rows]))
    with pytest.raises(ValueError, match="must be > 1"):
        ppo_clip_from_log_ratio(lp - old, adv, eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=0.9)


def _grad(kind: PolicySurrogate, x: dict, params: SurrogateParams = PARAMS) -> torch.Tensor:
    lp = x["log_probs"].clone().requires_grad_(True)
    terms = POLICY_SURROGATES.get(kind)(lp, x["old"], x["adv"], x["mask"], params)
    (terms.loss * x["mask"]).sum().backward()
    assert lp.grad is not None
    return lp.grad


def test_surrogate_gradients_match_their_papers() -> None:
    x = random_loss_batch(2, drift=0.5)
    lp, old, adv, mask = (x[k].tolist() for k in ("log_probs", "old", "adv", "mask"))
    p = PARAMS
    # CISPO: d/dlogpi = -w * A, with w the sign-dependent clipped ratio (no token loses its gradient)
    # SAPO: d/dlogpi = -4 s (1 - s) r A, s = sigmoid(tau (r - 1))
    # REINFORCE: -A
    # GSPO (clip off): d/dlogpi_t = -s / |y| * sum_k A_k, s the sequence ratio
    wide = SurrogateParams(eps_clip=10.0, eps_clip_high=10.0)
    want: dict[PolicySurrogate, list[list[float]]] = {k: [] for k in ("cispo", "sapo", "reinforce", "gspo")}
    for b in range(6):
        idx = [t for t in range(8) if mask[b][t] > 0]
        seq_ratio = math.exp(sum(lp[b][t] - old[b][t] for t in idx) / max(len(idx), 1))
        rows = {k: [0.0] * 8 for k in want}
        for t in idx:
            a, r = adv[b][t], math.exp(lp[b][t] - old[b][t])
            w = min(r, 1 + p.eps_clip_high) if a >= 0 else max(r, 1 - p.eps_clip)
            tau = p.sapo_tau_pos if a > 0 else p.sapo_tau_neg
            s = sigmoid(tau * (r - 1))
            rows["cispo"][t] = -w * a
            rows["sapo"][t] = -4 * s * (1 - s) * r * a
            rows["reinforce"][t] = -a
            rows["gspo"][t] = -seq_ratio / len(idx) * sum(adv[b][k] for k in idx)
        for k in want:
            want[k].append(rows[k])
    for kind in ("cispo", "sapo", "reinforce"):
        assert_close(_grad(PolicySurrogate(kind), x), torch.tensor(want[kind]), atol=1e-5, rtol=1e-5)
    assert_close(_grad(PolicySurrogate.GSPO, x, wide), torch.tensor(want["gspo"]), atol=1e-5, rtol=1e-5)


def test_every_estimator_has_a_surrogate() -> None:
    from runtime.algos.advantages import AdvantageEstimator

    assert set(SURROGATE_OF_ESTIMATOR) == {str(e) for e in AdvantageEstimator}
    assert surrogate_for_estimator("gspo") is PolicySurrogate.GSPO
    with pytest.raises(UnknownNameError, match="valid names: cispo"):
        surrogate_for_estimator("nope")


@st.composite
def token_batches(draw: st.DrawFn) -> dict:
    batch, width = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))  # values: seeded, cheap to draw

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(batch, width, generator=gen)

    mask = (torch.rand(batch, width, generator=gen) > draw(st.sampled_from([0.0, 0.3, 0.7]))).float()
    old = -uniform(0, 4)
    return {
        "log_probs": old + uniform(-2, 2),
        "old": old,
        "rollout": old + uniform(-2, 2),
        "ref": old + uniform(-1, 1),
        "adv": uniform(-3, 3) * mask,
        "entropy": uniform(0, 3),
        "mask": mask,
        "values": uniform(-2, 2),
        "old_values": uniform(-2, 2),
        "returns": uniform(-2, 2),
    }


@FAST
@given(x=token_batches(), eps=st.floats(0.05, 0.5), eps_high=st.floats(0.05, 0.5), c=st.floats(1.5, 5))
def test_clipping_bounds_hold(x: dict, eps: float, eps_high: float, c: float) -> None:
    params = SurrogateParams(eps_clip=eps, eps_clip_high=eps_high, eps_clip_c=c)
    m, a = x["mask"] > 0, x["adv"]
    ppo = POLICY_SURROGATES.get("ppo_clip")(x["log_probs"], x["old"], a, x["mask"], params).loss
    pos, neg = m & (a > 0), m & (a < 0)
    tol = 1e-5
    assert (ppo[pos] >= -a[pos] * (1 + eps_high) - tol).all()  # objective capped at (1 + eps_high) A
    assert (ppo[neg] >= -a[neg] * (1 - eps) - tol).all()  # and at (1 - eps) A for A < 0
    assert (ppo[neg] <= -a[neg] * c + tol).all()  # dual clip
    # CISPO's weight (its gradient / -A) respects the sign-dependent bounds
    lp = x["log_probs"].clone().requires_grad_(True)
    POLICY_SURROGATES.get("cispo")(lp, x["old"], a, x["mask"], params).loss[m].sum().backward()
    nonzero = m & (a.abs() > 1e-3)
    weight = lp.grad[nonzero] / -a[nonzero]
    assert (weight[a[nonzero] > 0] <= 1 + eps_high + 1e-4).all()
    assert (weight[a[nonzero] < 0] >= 1 - eps - 1e-4).all()
    # SAPO's gate stays in (0, 4 / tau)
    sapo = POLICY_SURROGATES.get("sapo")(x["log_probs"], x["old"], a, x["mask"], SurrogateParams()).loss
    assert (sapo[m].abs() <= 4 * a[m].abs() / 1.0 + tol).all()
    # GSPO: one ratio, one clip decision per sequence
    gspo = POLICY_SURROGATES.get("gspo")(x["log_probs"], x["old"], a, x["mask"], params)
    for b in range(a.shape[0]):
        assert gspo.ppo_kl[b][m[b]].unique().numel() <= 1


# -- TIS / OPSM / old log-probs --------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [vanilla_tis, icepop_tis])
def test_tis_matches_naive_reference(fn) -> None:
    x = random_loss_batch(3, drift=0.6)
    pg = torch.randn(6, 8)
    low, high = 0.5, 1.5
    out = fn(
        pg_loss=pg,
        train_log_probs=x["old"],
        rollout_log_probs=x["rollout"],
        loss_mask=x["mask"],
        clip_low=low,
        clip_high=high,
    )
    for b in range(6):
        for t in range(8):
            if x["mask"][b, t] == 0:
                continue
            r = math.exp(x["old"][b, t].item() - x["rollout"][b, t].item())
            if fn is vanilla_tis:
                w, clipped = min(max(r, low), high), float(r < low or r > high)
            else:
                w, clipped = (r if low <= r <= high else 0.0), float(not low <= r <= high)
            assert out.pg_loss[b, t].item() == pytest.approx(pg[b, t].item() * w, rel=1e-5, abs=1e-6)
            assert out.metrics["tis"][b, t].item() == pytest.approx(r, rel=1e-5)
            assert out.metrics["tis_weight"][b, t].item() == pytest.approx(w, rel=1e-5)
            assert out.metrics["tis_clipfrac"][b, t].item() == clipped
    assert torch.equal(out.loss_mask, x["mask"])


def test_get_mismatch_metrics_reports_the_tis_metrics_and_leaves_the_loss() -> None:
    """`get-mismatch-metrics` without `use-tis`: the TIS function's metrics (tis, mismatch_kl, ...) are
    reported, the loss and its gradient are the plain policy loss's; with `use-tis` the weights apply."""
    x = random_loss_batch(7, drift=0.5)
    policy = LOSS_TYPES.get("policy_loss")

    def run(**config):
        lp = x["log_probs"].clone().requires_grad_(True)
        loss, metrics = policy(loss_inputs(x, log_probs=lp), LossConfig(**config))
        loss.backward()
        return loss.detach(), lp.grad, metrics

    plain, plain_grad, plain_metrics = run()
    seen, seen_grad, seen_metrics = run(get_mismatch_metrics=True)
    weighted, _, weighted_metrics = run(use_tis=True)
    assert "mismatch_kl" not in plain_metrics and "tis" not in plain_metrics
    assert torch.equal(seen, plain) and torch.equal(seen_grad, plain_grad)
    assert seen.item() != pytest.approx(weighted.item())  # use-tis reweights; the metrics alone do not
    for name in ("tis", "tis_abs", "mismatch_kl", "mismatch_k3_kl", "tis_weight", "tis_clipfrac"):
        assert_close(seen_metrics[name], weighted_metrics[name])
    mask = x["mask"]
    k1 = ((x["rollout"] - x["old"]) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    assert seen_metrics["mismatch_kl"].item() == pytest.approx(float(k1.mean()), rel=1e-5)


def test_opsm_matches_naive_reference() -> None:
    x = random_loss_batch(4, drift=0.3)
    delta = 0.01
    keep = opsm_keep_mask(x["log_probs"], x["old"], x["adv"], x["mask"], delta=delta)
    for b in range(6):
        idx = [t for t in range(8) if x["mask"][b, t] > 0]
        seq_kl = sum(x["old"][b, t].item() - x["log_probs"][b, t].item() for t in idx) / max(len(idx), 1)
        for t in range(8):
            drop = x["adv"][b, t].item() < 0 and seq_kl > delta
            assert keep[b, t].item() == float(not drop)
    assert 0 < keep.sum() < keep.numel()  # the batch exercises both branches


def test_select_old_log_probs() -> None:
    a, b = torch.zeros(1, 2), torch.ones(1, 2)
    assert select_old_log_probs(a, b, use_rollout_logprobs=False) is a
    assert select_old_log_probs(a, b, use_rollout_logprobs=True) is b
    with pytest.raises(ValueError, match="use-rollout-logprobs"):
        select_old_log_probs(a, None, use_rollout_logprobs=True)


# -- value loss and reducers -----------------------------------------------------------------------------


def test_value_loss_matches_naive_reference() -> None:
    x = random_loss_batch(5)
    clip = 0.2
    loss, clipped = compute_value_loss(x["values"], x["old_values"], x["returns"], value_clip=clip)
    for b in range(6):
        for t in range(8):
            v, old, ret = x["values"][b, t].item(), x["old_values"][b, t].item(), x["returns"][b, t].item()
            vc = old + min(max(v - old, -clip), clip)
            assert loss[b, t].item() == pytest.approx(
                max((v - ret) ** 2, (vc - ret) ** 2), rel=1e-5, abs=1e-6
            )
            assert clipped[b, t].item() == float(abs(v - old) > clip)


def test_reducers_match_naive_reference() -> None:
    values = torch.tensor([[1.0, 3.0, 100.0], [2.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    cells = [
        [v if m else None for v, m in zip(vr, mr, strict=True)]
        for vr, mr in zip(values.tolist(), mask.tolist(), strict=True)
    ]
    assert sample_mean(values, mask).item() == pytest.approx(naive_sample_mean(cells))
    assert token_mean(values, mask).item() == pytest.approx(naive_token_mean(cells))
    assert sample_sum_mean(values, mask).item() == pytest.approx(naive_sample_sum(cells))
    assert LOSS_REDUCERS.names() == ["per_token", "sum_of_sample_mean", "sum_of_sample_sum"]
    poisoned = values.clone()
    poisoned[0, 2] = float("inf")  # a padded slot that overflowed never reaches the result
    for reduce in (sample_mean, token_mean, sample_sum_mean):
        assert reduce(poisoned, mask).item() == reduce(values, mask).item()


def test_per_token_normaliser_counts_a_fully_masked_sample_as_one_token() -> None:
    """Relax's loss_function divides the per-token loss by sum_i max(tokens_i, 1): values 1, 3 on a
    sample of two trained tokens and a sample with none give (1 + 3) / (2 + 1) = 4/3, not 4/2 = 2."""
    values = torch.tensor([[1.0, 3.0], [5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert token_count(mask).item() == 3.0
    assert token_mean(values, mask).item() == pytest.approx(4 / 3)
    assert token_mean(values, torch.zeros(2, 2)).item() == 0.0  # nothing trained: 0 / 2


# -- composed loss types ---------------------------------------------------------------------------------


def naive_policy_loss(x: dict, config: LossConfig) -> dict[str, float]:
    """The whole policy_loss by loops: surrogate, OPSM, TIS, reducers, entropy and (unbiased) KL."""
    kind = SURROGATE_OF_ESTIMATOR[config.advantage_estimator]
    params = config.surrogate_params
    old_key = "rollout" if config.use_rollout_logprobs else "old"
    reduce = naive_token_mean if config.per_token_loss and kind != "reinforce" else naive_sample_mean
    pg_reduce = naive_sample_sum if kind == "reinforce" else reduce
    rows = {k: x[k].tolist() for k in x}
    pg, clip, kl, ent, klloss, opsm, tisw = [], [], [], [], [], [], []
    for b in range(len(rows["mask"])):
        cells = naive_row_surrogate(
            kind, rows["log_probs"][b], rows[old_key][b], rows["adv"][b], rows["mask"][b], params
        )
        idx = [t for t, m in enumerate(rows["mask"][b]) if m > 0]
        seq_kl = sum(rows[old_key][b][t] - rows["log_probs"][b][t] for t in idx) / max(len(idx), 1)
        row = {k: [None] * len(cells) for k in ("pg", "clip", "kl", "ent", "klloss", "opsm", "tisw")}
        for t, cell in enumerate(cells):
            if cell is None:
                continue
            loss, c, k = cell
            a = rows["adv"][b][t]
            dropped = config.use_opsm and a < 0 and seq_kl > config.opsm_delta
            loss = 0.0 if dropped else loss
            if config.use_tis:
                r = math.exp(rows["old"][b][t] - rows["rollout"][b][t])
                w = min(max(r, config.tis_clip_low), config.tis_clip)
                loss *= w
                row["tisw"][t] = w
            d = rows["log_probs"][b][t] - rows["ref"][b][t]
            k1 = {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) - 1 + d}[config.kl_loss_type]
            if config.use_unbiased_kl:
                k1 *= math.exp(rows["log_probs"][b][t] - rows[old_key][b][t])
            row["pg"][t], row["clip"][t], row["kl"][t] = loss, c, k
            row["ent"][t], row["klloss"][t], row["opsm"][t] = rows["entropy"][b][t], k1, float(dropped)
        for name, bucket in zip(
            ("pg", "clip", "kl", "ent", "klloss", "opsm", "tisw"),
            (pg, clip, kl, ent, klloss, opsm, tisw),
            strict=True,
        ):
            bucket.append(row[name])
    out = {
        "pg_loss": pg_reduce(pg),
        "pg_clipfrac": reduce(clip),
        "ppo_kl": reduce(kl),
        "entropy": reduce(ent),
    }
    loss = out["pg_loss"] - config.entropy_coef * out["entropy"]
    if config.use_kl_loss:
        out["kl_loss"] = reduce(klloss)
        loss += config.kl_loss_coef * out["kl_loss"]
    if config.use_opsm:
        out["opsm_clipfrac"] = reduce(opsm)
    if config.use_tis:
        out["tis_weight"] = reduce(tisw)
    out["loss"] = loss
    return out


CONFIGS = [
    LossConfig(
        advantage_estimator="grpo", eps_clip_c=3.0, entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.1
    ),
    LossConfig(advantage_estimator="gspo", eps_clip=0.05, eps_clip_high=0.08, per_token_loss=True),
    LossConfig(
        advantage_estimator="sapo",
        use_opsm=True,
        opsm_delta=0.0,
        use_kl_loss=True,
        kl_loss_coef=0.2,
        kl_loss_type="k3",
        use_unbiased_kl=True,
    ),
    LossConfig(
        advantage_estimator="cispo", use_tis=True, tis_clip=1.3, tis_clip_low=0.8, use_rollout_logprobs=True
    ),
    LossConfig(advantage_estimator="rloo", per_token_loss=True, entropy_coef=0.02),
    LossConfig(
        advantage_estimator="ppo",
        use_tis=True,
        use_opsm=True,
        opsm_delta=0.0,
        per_token_loss=True,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        kl_loss_type="k2",
    ),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.advantage_estimator)
def test_policy_loss_matches_naive_reference(config: LossConfig) -> None:
    x = random_loss_batch(6, drift=0.4)
    loss, metrics = LOSS_TYPES.get("policy_loss")(loss_inputs(x), config)
    want = naive_policy_loss(x, config)
    assert loss.item() == pytest.approx(want.pop("loss"), rel=1e-5, abs=1e-6)
    for name, value in want.items():
        assert metrics[name].item() == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_policy_loss_with_ratio_one_is_the_vanilla_policy_gradient() -> None:
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
    assert loss.item() == pytest.approx(
        (metrics["pg_loss"] - 0.01 * metrics["entropy"] + 0.5 * metrics["kl_loss"]).item(), abs=1e-6
    )
    assert metrics["kl_loss"].item() == pytest.approx(0.1, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == 0.0
    assert metrics["pg_loss"].item() == pytest.approx(-inputs.advantages.mean(dim=1).mean().item(), abs=1e-6)


def test_entropy_bonus_reaches_the_entropy_gradient() -> None:
    x = random_loss_batch(7)
    entropy = x["entropy"].clone().requires_grad_(True)
    loss, _ = LOSS_TYPES.get("policy_loss")(loss_inputs(x, entropy=entropy), LossConfig(entropy_coef=0.5))
    loss.backward()
    per_sample = x["mask"].sum(1, keepdim=True).clamp(min=1)
    assert_close(entropy.grad, -0.5 * x["mask"] / per_sample / x["mask"].shape[0])


@FAST
@given(x=token_batches(), config=st.sampled_from(CONFIGS), seed=st.integers(0, 1000))
def test_padding_never_changes_the_loss(x: dict, config: LossConfig, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    off = x["mask"] == 0
    garbage = {
        k: torch.where(off, torch.randn(x[k].shape, generator=gen) * 100, x[k]) for k in x if k != "mask"
    }
    garbage["mask"] = x["mask"]
    lp = garbage["log_probs"].clone().requires_grad_(True)
    loss, metrics = LOSS_TYPES.get("policy_loss")(loss_inputs(garbage, log_probs=lp), config)
    base_loss, base_metrics = LOSS_TYPES.get("policy_loss")(loss_inputs(x), config)
    assert_close(loss, base_loss, atol=1e-5, rtol=1e-5)
    for name, value in base_metrics.items():
        assert_close(metrics[name], value, atol=1e-5, rtol=1e-5)
    loss.backward()
    assert torch.isfinite(lp.grad).all() and not lp.grad[off].any()


def test_value_loss_type() -> None:
    x = random_loss_batch(8)
    values = x["values"].clone().requires_grad_(True)
    inputs = LossInputs(
        log_probs=x["log_probs"],
        entropy=x["entropy"],
        loss_mask=x["mask"],
        values=values,
        old_values=x["old_values"],
        returns=x["returns"],
    )
    loss, metrics = LOSS_TYPES.get("value_loss")(inputs, LossConfig(value_clip=0.1))
    per_token, clipped = compute_value_loss(x["values"], x["old_values"], x["returns"], value_clip=0.1)
    assert loss.item() == pytest.approx(sample_mean(per_token, x["mask"]).item())
    assert metrics["value_clipfrac"].item() == pytest.approx(sample_mean(clipped, x["mask"]).item())
    loss.backward()
    assert values.grad is not None and not values.grad[x["mask"] == 0].any()
    with pytest.raises(ValueError, match="old_values"):
        LOSS_TYPES.get("value_loss")(
            loss_inputs(x).__class__(x["log_probs"], x["entropy"], x["mask"], values=values), LossConfig()
        )


def test_sft_loss_is_masked_nll_and_has_its_alias() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    loss, _ = LOSS_TYPES.get("sft")(
        LossInputs(log_probs=lp, entropy=torch.zeros(1, 3), loss_mask=mask), LossConfig()
    )
    assert loss.item() == pytest.approx(-(math.log(0.25) + math.log(0.9)) / 2, abs=1e-6)
    assert LOSS_TYPES.get("sft_loss") is LOSS_TYPES.get("sft")
    assert resolve_loss_fn("sft") is LOSS_TYPES.get("sft")
    with pytest.raises(ValueError, match="custom-loss-function-path"):
        resolve_loss_fn("custom_loss")


def test_policy_loss_names_missing_inputs() -> None:
    x = random_loss_batch(9)
    bare = LossInputs(
        log_probs=x["log_probs"], entropy=x["entropy"], loss_mask=x["mask"], advantages=x["adv"]
    )
    with pytest.raises(ValueError, match="old_log_probs"):
        LOSS_TYPES.get("policy_loss")(bare, LossConfig())
    with_old = LossInputs(
        x["log_probs"], x["entropy"], x["mask"], old_log_probs=x["old"], advantages=x["adv"]
    )
    with pytest.raises(ValueError, match="rollout_log_probs"):
        LOSS_TYPES.get("policy_loss")(with_old, LossConfig(use_tis=True))
    with pytest.raises(ValueError, match="ref_log_probs"):
        LOSS_TYPES.get("policy_loss")(with_old, LossConfig(use_kl_loss=True))
