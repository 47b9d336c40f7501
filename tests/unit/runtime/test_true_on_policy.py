"""True-on-policy mode (`true-on-policy-mode`, one optimizer step per rollout): the log-probs stage does not
ask the trainer for old log-probs, and the loss takes the train forward's own, detached, as pi_old. A training
step then leaves the weights where the step with the recompute leaves them (torch backend here; the megatron
backend in test_true_on_policy_megatron.py). Where something reads the old log-probs before the loss, the
recompute stays."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from runtime.algos.advantages import AdvantageConfig, AdvantageInputs, compute_advantages_and_returns
from runtime.algos.losses import LossConfig
from runtime.devices import Device
from runtime.pipeline import RLPipeline
from runtime.pipeline.plans import old_log_probs_from_train_forward, old_log_probs_readers, train_config_from
from runtime.rollout.context import RolloutOutput
from runtime.rollout.engine import SamplingParams, TorchRolloutEngine
from runtime.spec import RuntimeSpec
from runtime.train.schedule import LRSchedule
from runtime.train.torch_backend import TorchTrainBackend, TrainConfig
from runtime.types import RolloutBatch, Sample
from tests.unit.runtime.rollouts import sample_groups

DEVICE = Device.detect()
# 3 prompts x 4 samples, one optimizer step of 12
ON_POLICY = RuntimeSpec(
    rollout_batch_size=3, n_samples_per_prompt=4, global_batch_size=12, true_on_policy_mode=True
)


@pytest.fixture(scope="module")
def tok(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def samples(tiny_model: Path, tok) -> list[Sample]:
    engine = TorchRolloutEngine(str(tiny_model), device=DEVICE)
    return sample_groups(engine, tok, [(1, 2), (3, 4), (5, 6)], SamplingParams(max_new_tokens=6, seed=0))


def _backend(tiny_model: Path, *, from_forward: bool, loss: LossConfig) -> TorchTrainBackend:
    config = TrainConfig(
        lr_schedule=LRSchedule(lr=1e-2),
        weight_decay=0.0,
        global_batch_size=12,
        micro_batch_size=5,  # uneven micro-batches: pi_old per micro-batch
        seed=3,
        loss=loss,
        old_log_probs_from_forward=from_forward,
    )
    return TorchTrainBackend(str(tiny_model), config, device=DEVICE)


def _pipeline(spec: RuntimeSpec, train: TorchTrainBackend) -> RLPipeline:
    roles = SimpleNamespace(
        train=train, actor_fwd=None, reference=None, critic=None, use_for_training=lambda: None
    )
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
        reward=None,
        postprocess=None,
    )


def _rollout(samples: list[Sample]) -> RolloutOutput:
    return RolloutOutput(groups=[[dataclasses.replace(s) for s in samples]])


def _with_advantages(batch: RolloutBatch) -> RolloutBatch:
    out = compute_advantages_and_returns(
        "grpo", AdvantageInputs(batch.rewards, batch.group_index, batch.loss_mask), AdvantageConfig()
    )
    batch.advantages = out.advantages
    return batch


def test_the_spec_decides_which_consumers_keep_the_recompute() -> None:
    assert old_log_probs_readers(ON_POLICY) == [] and old_log_probs_from_train_forward(ON_POLICY)
    assert train_config_from(ON_POLICY, 1).old_log_probs_from_forward
    # off without the mode
    assert not old_log_probs_from_train_forward(dataclasses.replace(ON_POLICY, true_on_policy_mode=False))
    assert not train_config_from(
        dataclasses.replace(ON_POLICY, true_on_policy_mode=False), 1
    ).old_log_probs_from_forward
    # only the loss reads them: the loss's readers take the forward's (TIS, OPSM, unbiased KL, custom loss)
    for loss_side in (
        {"use_tis": True, "get_mismatch_metrics": True},
        {"use_rollout_logprobs": True, "use_tis": True},
        {"use_opsm": True},
        {"use_kl_loss": True, "kl_loss_coef": 0.1, "use_unbiased_kl": True},
        {"loss_type": "custom_loss", "custom_loss_function_path": "a.loss"},
        {"kl_coef": 0.1},  # the GRPO family ignores kl-coef: no reward shaping reads them
        {
            "advantage_estimator": "rloo",
            "kl_coef": 0.1,
            "use_rollout_logprobs": True,
        },  # shapes with the engine's
        {"resource": {"actor": [1, 1], "rollout": [1, 1]}},
    ):
        assert old_log_probs_from_train_forward(dataclasses.replace(ON_POLICY, **loss_side)), loss_side
    # a reader before or outside the loss keeps the recompute, and says which
    for reader, why in (
        ({"global_batch_size": 6}, "more than one optimizer step"),
        ({"resource": {"actor": [1, 1], "rollout": [1, 1], "actor_fwd": [1, 1]}}, "actor_fwd"),
        ({"advantage_estimator": "rloo", "kl_coef": 0.1}, "kl-coef reward shaping"),
        ({"use_opd": True, "opd_type": "megatron"}, "on-policy distillation"),
        ({"rollout_data_postprocess_path": "a.post"}, "rollout-data-postprocess-path"),
        ({"save_debug_train_data": "/tmp/x_{rollout_id}.pt"}, "save-debug-train-data"),
    ):
        spec = dataclasses.replace(ON_POLICY, **reader)
        assert not old_log_probs_from_train_forward(spec), reader
        assert any(why in r for r in old_log_probs_readers(spec)), (reader, old_log_probs_readers(spec))
        assert not train_config_from(spec, 1).old_log_probs_from_forward


@pytest.mark.parametrize(
    "loss",
    [
        LossConfig(),
        # TIS and the mismatch metrics read pi_old's values on the train side: the forward's serve them
        LossConfig(use_tis=True, tis_clip=5.0, use_kl_loss=True, kl_loss_coef=0.1, use_unbiased_kl=True),
    ],
    ids=["grpo", "tis-unbiased-kl"],
)
def test_no_recompute_and_the_same_update(tiny_model: Path, samples: list[Sample], loss: LossConfig) -> None:
    skipping = _backend(tiny_model, from_forward=True, loss=loss)
    initial = {k: v.clone() for k, v in skipping.model.state_dict().items()}
    batch = _pipeline(ON_POLICY, skipping).log_probs(_rollout(samples))
    assert batch.old_log_probs is None  # the trainer was not asked
    if loss.use_kl_loss:  # the KL loss's reference: the initial policy (this test's trainer holds none)
        batch.ref_log_probs = skipping._log_probs(skipping.model, batch) * batch.loss_mask
    got = skipping.train_step(_with_advantages(batch))

    recomputing = _backend(tiny_model, from_forward=False, loss=loss)
    spec = dataclasses.replace(ON_POLICY, true_on_policy_mode=False)
    reference = _pipeline(spec, recomputing).log_probs(_rollout(samples))
    assert reference.old_log_probs is not None
    reference.ref_log_probs = batch.ref_log_probs
    want = recomputing.train_step(_with_advantages(reference))

    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-5, rel=1e-4), name
    assert got["ppo_kl"] == pytest.approx(0.0, abs=1e-6) and got["pg_clipfrac"] == 0.0
    after, before = skipping.model.state_dict(), recomputing.model.state_dict()
    moved = max(float((after[k] - initial[k]).abs().max()) for k in before)
    assert moved > 0
    worst = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert worst < 1e-5, worst


def test_a_reader_keeps_the_recompute(tiny_model: Path, samples: list[Sample]) -> None:
    """rloo's kl-coef shaping reads the trainer's old log-probs in the advantages stage: the log-probs stage
    still fills them, and the trainer does not substitute its forward's."""
    spec = dataclasses.replace(ON_POLICY, advantage_estimator="rloo", kl_coef=0.1)
    backend = TorchTrainBackend(str(tiny_model), train_config_from(spec, 1), device=DEVICE)
    assert not backend.config.old_log_probs_from_forward
    batch = _pipeline(spec, backend).log_probs(_rollout(samples))
    assert batch.old_log_probs is not None
    fresh = backend._log_probs(backend.model, batch) * batch.loss_mask
    assert torch.allclose(batch.old_log_probs, fresh)


def test_a_batch_without_old_log_probs_is_refused_outside_the_mode(tiny_model: Path, samples) -> None:
    backend = _backend(tiny_model, from_forward=False, loss=LossConfig())
    batch = _with_advantages(RolloutBatch.from_samples(samples, 0))
    with pytest.raises(ValueError, match="old_log_probs"):
        backend.train_step(batch)
