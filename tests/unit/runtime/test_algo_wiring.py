"""How the pipeline and the torch backend wire runtime/algos and runtime/rewards: each spec parameter of
issue 4 reaches the function that implements it (in-process, no Ray)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from runtime.algos.advantages import (
    AdvantageConfig,
    AdvantageEstimator,
    AdvantageInputs,
    compute_advantages_and_returns,
)
from runtime.algos.losses import LossConfig
from runtime.devices import Device
from runtime.pipeline import RLPipeline, loss_config_from, role_plan, train_config_from
from runtime.rewards import RewardModel
from runtime.rollout.context import RolloutOutput
from runtime.rollout.engine import SamplingParams, TorchRolloutEngine
from runtime.spec import RuntimeSpec
from runtime.train.critic import CriticConfig, TorchCriticBackend, critic_checkpoint_root, critic_save_root
from runtime.train.schedule import LRSchedule
from runtime.train.torch_backend import TorchTrainBackend, TrainConfig
from runtime.types import RolloutBatch, Sample
from tests.unit.runtime.rollouts import sample_groups

DEVICE = Device.detect()


@pytest.fixture(scope="module")
def tok(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def samples(tiny_model: Path, tok) -> list[Sample]:
    """12 sampled responses (3 prompts x 4) with the engine's log-probs and 0/1 rewards."""
    engine = TorchRolloutEngine(str(tiny_model), device=DEVICE)
    return sample_groups(engine, tok, [(1, 2), (3, 4), (5, 6)], SamplingParams(max_new_tokens=6, seed=0))


def _batch(samples: list[Sample], tok) -> RolloutBatch:
    return RolloutBatch.from_samples([dataclasses.replace(s) for s in samples], tok.pad_token_id)


def _backend(tiny_model: Path, **overrides: Any) -> TorchTrainBackend:
    loss = overrides.pop("loss", LossConfig())
    config = TrainConfig(
        lr_schedule=LRSchedule(lr=1e-2), weight_decay=0.0, micro_batch_size=12, loss=loss, **overrides
    )
    return TorchTrainBackend(str(tiny_model), config, device=DEVICE)


def _with_advantages(batch: RolloutBatch, estimator: str = "grpo") -> RolloutBatch:
    out = compute_advantages_and_returns(
        estimator, AdvantageInputs(batch.rewards, batch.group_index, batch.loss_mask), AdvantageConfig()
    )
    batch.advantages, batch.returns = out.advantages, out.returns
    return batch


# -- the trainer -----------------------------------------------------------------------------------------


def test_old_log_probs_are_the_trainers_even_with_rollout_logprobs(tiny_model: Path, tok, samples) -> None:
    """TIS compares trainer and engine: with use-rollout-logprobs the trainer still recomputes its own
    (a copy of the engine's made every TIS weight 1), and TIS weights differ from 1 once they disagree."""
    loss = LossConfig(use_rollout_logprobs=True, use_tis=True, tis_clip=5.0, tis_clip_low=0.0)
    backend = _backend(tiny_model, loss=loss)
    batch = _batch(samples, tok)
    drift = 0.3 * batch.loss_mask  # the engine "sampled" with other weights
    batch.rollout_log_probs = batch.rollout_log_probs - drift
    batch = backend.compute_log_probs(batch)
    assert not torch.allclose(batch.old_log_probs, batch.rollout_log_probs)
    metrics = backend.train_step(_with_advantages(batch))
    # weight = exp(old - rollout) = exp(0.3) on every trained token
    assert metrics["tis_weight"] == pytest.approx(float(torch.tensor(0.3).exp()), rel=1e-3)
    assert metrics["train_rollout_logprob_abs_diff"] == pytest.approx(0.3, rel=1e-3)


def test_freezing_keeps_frozen_parameters_and_warns_on_unmatched(
    tiny_model: Path, tok, samples, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="runtime.train.torch_backend"):
        backend = _backend(tiny_model, freeze_params=("embed_tokens", "output_layer"))
    assert "output_layer" in caplog.text  # a Megatron name that matches nothing on an HF model
    frozen = {n: p.detach().clone() for n, p in backend.model.named_parameters() if "embed_tokens" in n}
    trained = {n: p.detach().clone() for n, p in backend.model.named_parameters() if "layers.0.mlp" in n}
    assert frozen and trained
    backend.train_step(_with_advantages(backend.compute_log_probs(_batch(samples, tok))))
    now = dict(backend.model.named_parameters())
    assert all(torch.equal(now[n], before) for n, before in frozen.items())
    assert any(not torch.equal(now[n], before) for n, before in trained.items())

    only = _backend(tiny_model, only_train_params=(r"layers\.1\.",))
    assert all(p.requires_grad == (".layers.1." in n) for n, p in only.model.named_parameters())


def test_entropy_bonus_trains_through_live_logits(tiny_model: Path, tok, samples) -> None:
    """With zero advantages the policy gradient is 0: only an entropy bonus with a graph moves weights."""
    batch = _batch(samples, tok)
    batch.advantages = torch.zeros_like(batch.loss_mask)
    still = _backend(tiny_model)
    before = still.parameter_checksum()
    still.train_step(still.compute_log_probs(batch))
    assert still.parameter_checksum() == before
    moved = _backend(tiny_model, loss=LossConfig(entropy_coef=0.1))
    moved.train_step(moved.compute_log_probs(batch))
    assert moved.parameter_checksum() != before


def test_custom_loss_function_path_is_the_loss(
    tiny_model: Path, tok, samples, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_loss.py").write_text(
        "import torch\n"
        "CALLS = []\n"
        "def loss(inputs, config):\n"
        "    CALLS.append(inputs.rollout_log_probs is not None)\n"
        "    value = -(inputs.log_probs * inputs.loss_mask).sum() / inputs.loss_mask.sum()\n"
        "    return value, {'my_metric': value.detach()}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    backend = _backend(
        tiny_model, loss_type="custom_loss", loss=LossConfig(custom_loss_function_path="my_loss.loss")
    )
    metrics = backend.train_step(backend.compute_log_probs(_batch(samples, tok)))
    import my_loss  # type: ignore[import-not-found]

    assert my_loss.CALLS == [True] and "my_metric" in metrics


# -- spec -> configs -------------------------------------------------------------------------------------


def test_every_loss_parameter_reaches_the_loss_config() -> None:
    spec = RuntimeSpec(
        rollout_batch_size=4,
        advantage_estimator="sapo",
        use_unbiased_kl=True,
        sapo_tau_pos=2.0,
        sapo_tau_neg=3.0,
        use_rollout_logprobs=True,
        use_tis=True,
        tis_clip=4.0,
        tis_clip_low=0.1,
        custom_tis_function_path="a.tis",
        custom_pg_loss_reducer_function_path="a.reduce",
        use_opsm=True,
        opsm_delta=0.5,
        value_clip=0.3,
        custom_loss_function_path="a.loss",
        eps_clip=0.1,
        eps_clip_c=3.0,
        entropy_coef=0.01,
        calculate_per_token_loss=True,
    )
    loss = loss_config_from(spec)
    assert loss == LossConfig(
        eps_clip=0.1,
        eps_clip_high=0.1,
        eps_clip_c=3.0,
        use_unbiased_kl=True,
        entropy_coef=0.01,
        per_token_loss=True,
        advantage_estimator="sapo",
        sapo_tau_pos=2.0,
        sapo_tau_neg=3.0,
        use_rollout_logprobs=True,
        use_tis=True,
        tis_clip=4.0,
        tis_clip_low=0.1,
        custom_tis_function_path="a.tis",
        custom_pg_loss_reducer_function_path="a.reduce",
        use_opsm=True,
        opsm_delta=0.5,
        value_clip=0.3,
        custom_loss_function_path="a.loss",
    )
    config = train_config_from(
        dataclasses.replace(spec, freeze_params_name_list=["embed"], only_train_params_name_list=None), 10
    )
    assert config.loss == loss and config.freeze_params == ("embed",)


def test_role_plan_reference_critic_and_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    base = RuntimeSpec(
        hf_checkpoint="/m", rollout_batch_size=4, n_samples_per_prompt=4, lr=1e-3, num_rollout=3
    )
    assert not role_plan(base, 3).need_ref
    assert role_plan(dataclasses.replace(base, advantage_estimator="rloo", kl_coef=0.1), 3).need_ref
    # Relax computes, but never applies, kl-coef for the GRPO family: no reference model for it
    assert not role_plan(dataclasses.replace(base, kl_coef=0.1), 3).need_ref

    ppo = dataclasses.replace(
        base, advantage_estimator="ppo", critic_lr=5e-3, critic_lr_warmup_iters=7, colocate=True
    )
    plan = role_plan(ppo, 3).critic
    assert plan is not None and plan.model_path == "/m"
    assert plan.config.lr_schedule.lr == 5e-3 and plan.config.lr_schedule.warmup_steps == 7
    assert role_plan(dataclasses.replace(ppo, critic_lr=None), 3).critic.config.lr_schedule.lr == 1e-3  # type: ignore[union-attr]
    assert role_plan(base, 3).critic is None

    external = dataclasses.replace(base, rollout_external=True, rollout_external_engine_addrs=["h:1", "h:2"])
    assert role_plan(external, 3).external_engines == ("h:1", "h:2")
    monkeypatch.setenv("RELAX_ROLLOUT_ENGINE", "in-process")
    assert role_plan(base, 3).engine_kind == "in-process"
    monkeypatch.setenv("RELAX_ROLLOUT_ENGINE", "vllm")
    with pytest.raises(ValueError, match="RELAX_ROLLOUT_ENGINE"):
        role_plan(base, 3)


# -- the advantages and log-probs stages ------------------------------------------------------------------


def _pipeline(spec: RuntimeSpec, reward: RewardModel | None = None) -> RLPipeline:
    roles = SimpleNamespace(train=None, actor_fwd=None, reference=None, critic=None)
    return RLPipeline(
        spec=spec,
        reporter=None,  # type: ignore[arg-type]
        tokenizer=SimpleNamespace(pad_token_id=0),
        roles=roles,  # type: ignore[arg-type]
        total_rollouts=1,
        checkpoints=None,  # type: ignore[arg-type]
        weight_sync=None,  # type: ignore[arg-type]
        relay=None,
        source=None,  # type: ignore[arg-type]
        generation=None,
        reward=reward,
        postprocess=None,
    )


def _stage_batch() -> RolloutBatch:
    gen = torch.Generator().manual_seed(0)
    mask = torch.zeros(8, 6)
    mask[:, 2:] = 1
    mask[1, 5] = 0
    batch = RolloutBatch(
        tokens=torch.ones(8, 6, dtype=torch.long),
        attention_mask=torch.ones(8, 6, dtype=torch.long),
        loss_mask=mask,
        group_index=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 1.0]),
        rollout_log_probs=-torch.rand(8, 6, generator=gen) * mask,
    )
    batch.old_log_probs = -torch.rand(8, 6, generator=gen) * mask
    batch.ref_log_probs = -torch.rand(8, 6, generator=gen) * mask
    batch.values = torch.randn(8, 6, generator=gen) * mask
    return batch


@pytest.mark.parametrize("estimator", list(AdvantageEstimator))
def test_advantages_stage_runs_the_estimator_of_the_spec(estimator: AdvantageEstimator) -> None:
    kl = estimator in ("rloo", "reinforce_plus_plus", "ppo")
    spec = RuntimeSpec(
        advantage_estimator=str(estimator),
        gamma=0.9,
        lambd=0.8,
        kl_coef=0.2 if kl else 0.0,
        kl_loss_type="k3",
        normalize_advantages=estimator.startswith("reinforce"),
        use_rollout_logprobs=True,
    )
    batch = _pipeline(spec).compute_advantages(_stage_batch())
    fresh = _stage_batch()
    want = compute_advantages_and_returns(
        str(estimator),
        AdvantageInputs(
            fresh.rewards,
            fresh.group_index,
            fresh.loss_mask,
            log_probs=fresh.rollout_log_probs,  # use-rollout-logprobs: the engine's are pi_old
            ref_log_probs=fresh.ref_log_probs,
            values=fresh.values,
        ),
        AdvantageConfig(
            gamma=0.9,
            lambd=0.8,
            kl_coef=spec.kl_coef,
            kl_type="k3",
            normalize_advantages=spec.normalize_advantages,
        ),
    )
    assert torch.equal(batch.advantages, want.advantages) and torch.equal(batch.returns, want.returns)
    if estimator not in ("grpo", "gspo", "sapo", "cispo"):  # those share GRPO's advantages by design
        # a different estimator really ran
        grpo = _pipeline(RuntimeSpec()).compute_advantages(_stage_batch())
        assert not torch.equal(batch.advantages, grpo.advantages)


def test_custom_reward_post_process_replaces_rewards_and_their_normalization(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "post.py").write_text(
        "def post(args, samples):\n    return [10.0 * s.reward for s in samples]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = RuntimeSpec(rm_type="math", custom_reward_post_process_path="post.post", loss_type="policy_loss")
    reward = RewardModel.from_spec(spec)
    assert reward.replaces_reward_normalization
    samples = [
        Sample(index=i, group_index=0, prompt="", tokens=[1, 2, 3], response_length=1, reward=float(i % 2))
        for i in range(4)
    ]
    p = _pipeline(spec, reward)
    batch = p.log_probs(RolloutOutput(groups=[samples]))
    assert batch.rewards.tolist() == [0.0, 10.0, 0.0, 10.0]
    batch = p.compute_advantages(batch)
    # the hook's rewards go in as they are: no group normalisation on top
    assert batch.advantages[:, 2].tolist() == [0.0, 10.0, 0.0, 10.0]


# -- the critic ---------------------------------------------------------------------------------------------


def test_critic_values_are_prefix_values_and_fit_the_returns(
    tiny_model: Path, tok, samples, tmp_path: Path
) -> None:
    config = CriticConfig(
        lr_schedule=LRSchedule(lr=1e-2), micro_batch_size=12, loss=LossConfig(value_clip=10.0)
    )
    critic = TorchCriticBackend(str(tiny_model), config, device=DEVICE)
    batch = _batch(samples, tok)
    assert torch.equal(critic.compute_values(batch), torch.zeros_like(batch.loss_mask))  # zero-init head
    torch.nn.init.normal_(critic.model.value_head.weight, std=0.5)
    values = critic.compute_values(batch)
    # column t is V(tokens[:t]): changing token t (and later) leaves columns <= t alone
    edited = _batch(samples, tok)
    edited.tokens[:, -1] = (edited.tokens[:, -1] + 1) % 100
    assert torch.allclose(critic.compute_values(edited)[:, :-1], values[:, :-1], atol=1e-6)

    batch.values = values
    batch.returns = batch.rewards[:, None] * batch.loss_mask
    first = critic.train_step(batch)
    for _ in range(15):
        last = critic.train_step(batch)
    assert last["value_loss"] < 0.5 * first["value_loss"] and {"value_clipfrac", "grad_norm", "lr"} <= set(
        last
    )

    root = critic_save_root(None, str(tmp_path / "save"))
    assert root == str(tmp_path / "save" / "critic")
    assert critic_save_root(str(tmp_path / "save"), str(tmp_path / "save")) == root  # never the policy's root
    critic.save_checkpoint(root, 4)
    restored = TorchCriticBackend(str(tiny_model), config, device=DEVICE)
    assert restored.load_checkpoint(str(tmp_path / "save")) == 4  # found under <load>/critic
    assert critic_checkpoint_root(tmp_path / "nothing") is None
    assert torch.allclose(restored.compute_values(batch), critic.compute_values(batch))
    assert restored.optimizer_steps == critic.optimizer_steps


def test_critic_only_steps_and_critic_train_only_hold_the_policy_back() -> None:
    ppo = RuntimeSpec(advantage_estimator="ppo", num_critic_only_steps=2)
    assert [_pipeline(ppo).policy_trains(r) for r in range(4)] == [False, False, True, True]
    only = dataclasses.replace(ppo, critic_train_only=True)
    assert not any(_pipeline(only).policy_trains(r) for r in range(10))
    # without a critic neither applies: GRPO's policy trains from the first step
    grpo = RuntimeSpec(num_critic_only_steps=2, critic_train_only=True)
    assert all(_pipeline(grpo).policy_trains(r) for r in range(3))
