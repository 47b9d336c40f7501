"""The tiny model, the torch rollout engine and the torch train backend, in-process (no Ray)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from runtime.algos.advantages import AdvantageConfig, AdvantageInputs, compute_advantages
from runtime.devices import Device
from runtime.rollout.engine import FinishReason, SamplingParams, TorchRolloutEngine
from runtime.train.checkpoint import LATEST_FILE, iteration_dir, read_latest_iteration
from runtime.train.schedule import LRSchedule
from runtime.train.torch_backend import TorchTrainBackend, TrainConfig
from runtime.types import RolloutBatch, Sample
from tests.unit.runtime.rollouts import sample_groups

DEVICE = Device.detect()


def test_tiny_model_loads_offline(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    ids = tok("What is 12 + 7? \\boxed{19}", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "What is 12 + 7? \\boxed{19}"
    assert [tok.decode([i]) for i in tok("19", add_special_tokens=False)["input_ids"]] == ["1", "9"]
    assert tok.eos_token_id == tok.pad_token_id == model.config.eos_token_id


def test_build_is_deterministic(tmp_path: Path, tiny_model: Path) -> None:
    from runtime.models.tiny import build_tiny_model

    again = build_tiny_model(tmp_path / "again", seed=0)
    from safetensors.torch import load_file

    a, b = load_file(tiny_model / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _rollout(engine: TorchRolloutEngine, tok, temperature: float = 1.0) -> list[Sample]:
    params = SamplingParams(temperature=temperature, top_p=0.95, max_new_tokens=6, seed=0)
    return sample_groups(engine, tok, [(1, 2), (10, 3), (7, 7)], params)


@pytest.fixture(scope="module")
def tok(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def test_engine_log_probs_agree_with_trainer_recompute(tiny_model: Path, tok) -> None:
    engine = TorchRolloutEngine(str(tiny_model), device=DEVICE)
    samples = _rollout(engine, tok, temperature=0.8)
    assert all(0 < s.response_length <= 6 for s in samples)
    backend = TorchTrainBackend(str(tiny_model), TrainConfig(log_probs_temperature=0.8), device=DEVICE)
    batch = backend.compute_log_probs(RolloutBatch.from_samples(samples, tok.pad_token_id))
    diff = ((batch.old_log_probs - batch.rollout_log_probs).abs() * batch.loss_mask).max().item()
    assert diff < 1e-4


def test_engine_stops_on_eos_and_reports_length(tiny_model: Path) -> None:
    engine = TorchRolloutEngine(str(tiny_model), device=DEVICE)
    eos = engine.eos_token_ids[0]
    results = engine.generate(
        [[5, 6, 7]] * 16, SamplingParams(max_new_tokens=3, stop_token_ids=(eos,), seed=1)
    )
    for r in results:
        assert len(r.token_ids) == len(r.log_probs) <= 3
        if r.finish_reason is FinishReason.STOP:
            assert r.token_ids[-1] in engine.eos_token_ids
        else:
            assert len(r.token_ids) == 3
    engine.offload()
    with pytest.raises(RuntimeError, match="offloaded"):
        engine.generate([[1]], SamplingParams())


def _grpo_batch(tiny_model: Path, tok) -> RolloutBatch:
    engine = TorchRolloutEngine(str(tiny_model), device=DEVICE)
    batch = RolloutBatch.from_samples(_rollout(engine, tok), tok.pad_token_id)
    batch.advantages = compute_advantages(
        "grpo", AdvantageInputs(batch.rewards, batch.group_index, batch.loss_mask), AdvantageConfig()
    ).advantages
    return batch


def _config(**overrides) -> TrainConfig:
    base = dict(
        lr_schedule=LRSchedule(lr=1e-2), global_batch_size=6, micro_batch_size=4, seed=5, weight_decay=0.0
    )
    return TrainConfig(**{**base, **overrides})


def test_train_step_updates_weights_and_syncs_into_the_engine(tiny_model: Path, tok) -> None:
    batch = _grpo_batch(tiny_model, tok)
    backend = TorchTrainBackend(str(tiny_model), _config(), device=DEVICE)
    before = backend.parameter_checksum()
    metrics = backend.train_step(backend.compute_log_probs(batch))
    assert backend.parameter_checksum() != before
    assert metrics["optimizer_steps"] == 2  # 12 samples in global batches of 6
    assert {"loss", "pg_loss", "entropy", "pg_clipfrac", "grad_norm", "lr"} <= set(metrics)
    engine = TorchRolloutEngine(str(tiny_model), device=DEVICE)
    engine.load_weights(backend.named_weights(), version=1)
    assert engine.weight_version == 1
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, backend.model.state_dict()[name])


def test_checkpoint_round_trip_resumes_identically(tiny_model: Path, tok, tmp_path: Path) -> None:
    batch = _grpo_batch(tiny_model, tok)
    uninterrupted = TorchTrainBackend(str(tiny_model), _config(), device=DEVICE)
    uninterrupted.train_step(uninterrupted.compute_log_probs(batch))
    record = uninterrupted.save_checkpoint(str(tmp_path), 3, {"data": {"epoch": 0, "offset": 7}})
    assert record.step == 3 and record.size_bytes > 0 and record.path == str(iteration_dir(tmp_path, 3))
    assert (tmp_path / LATEST_FILE).read_text().strip() == "3" and read_latest_iteration(tmp_path) == 3
    assert sorted(os.listdir(iteration_dir(tmp_path, 3))) == [
        ".relax-job",  # the job that wrote it (runtime/access.py)
        "model",
        "optimizer.pt",
        "rng.pt",
        "trainer_state.json",
    ]

    resumed = TorchTrainBackend(str(tiny_model), _config(), device=DEVICE)
    assert resumed.load_checkpoint(str(tmp_path)) == (3, {"data": {"epoch": 0, "offset": 7}})
    for name, tensor in uninterrupted.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name])
    # one more step on each gives the same weights: optimizer state came back too
    uninterrupted.train_step(uninterrupted.compute_log_probs(batch))
    resumed.train_step(resumed.compute_log_probs(batch))
    for name, tensor in uninterrupted.model.state_dict().items():
        assert torch.allclose(tensor, resumed.model.state_dict()[name], atol=1e-7)
    assert (
        TorchTrainBackend(str(tiny_model), _config(), device=DEVICE).load_checkpoint(str(tmp_path / "none"))
        is None
    )


def test_sft_step_and_hf_export_load_with_transformers(tiny_model: Path, tok, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompt = tok("What is 2 + 2?", add_special_tokens=False)["input_ids"]
    answer = tok("\\boxed{4}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    sample = Sample(index=0, group_index=0, prompt="", tokens=prompt + answer, response_length=len(answer))
    batch = RolloutBatch.from_samples([sample] * 4, tok.pad_token_id)
    backend = TorchTrainBackend(
        str(tiny_model), _config(loss_type="sft", global_batch_size=None), device=DEVICE
    )
    losses = [backend.train_step(batch)["loss"] for _ in range(40)]
    assert losses[-1] < losses[0] * 0.5
    record = backend.export_hf(str(tmp_path / "hf"), step=40)
    assert record.format == "hf" and record.size_bytes > 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    out = model.generate(torch.tensor([prompt]), max_new_tokens=len(answer), do_sample=False)
    assert out[0, len(prompt) :].tolist() == answer
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").eos_token_id == tok.eos_token_id


def test_offload_blocks_training_until_onload(tiny_model: Path, tok) -> None:
    backend = TorchTrainBackend(str(tiny_model), _config(), device=DEVICE)
    backend.offload()
    with pytest.raises(RuntimeError, match="offloaded"):
        backend.train_step(_grpo_batch(tiny_model, tok))
    backend.onload()
    assert not backend.offloaded


def test_ref_load_sets_reference_and_initial_weights(tiny_model: Path, tok, tmp_path: Path) -> None:
    trained = TorchTrainBackend(str(tiny_model), _config(), device=DEVICE)
    trained.train_step(trained.compute_log_probs(_grpo_batch(tiny_model, tok)))
    trained.save_checkpoint(str(tmp_path / "ckpt"), 4, {})
    trained.export_hf(str(tmp_path / "hf"), 4)
    for ref_load in (tmp_path / "ckpt", tmp_path / "hf"):  # a checkpoint root or an HF folder
        backend = TorchTrainBackend(
            str(tiny_model), _config(ref_load=str(ref_load)), device=DEVICE, need_ref=True
        )
        assert backend.ref_model is not None
        for name, tensor in trained.model.state_dict().items():
            assert torch.equal(backend.model.state_dict()[name], tensor)
            assert torch.equal(backend.ref_model.state_dict()[name], tensor)


def test_opd_teacher_log_probs_and_loss_mode(tiny_model: Path, tok, tmp_path: Path) -> None:
    """`opd-teacher-load` (a checkpoint root at `opd-teacher-ckpt-step`, or an HF folder): the torch backend
    holds the teacher and fills `teacher_log_probs` as its own forward of those weights; in OPD's loss mode
    (`opd-loss-coef`) the train step reports the term."""
    from runtime.algos.losses import LossConfig
    from runtime.algos.opd import OPDConfig

    batch = _grpo_batch(tiny_model, tok)
    trained = TorchTrainBackend(str(tiny_model), _config(), device=DEVICE)
    trained.train_step(trained.compute_log_probs(batch))
    trained.save_checkpoint(str(tmp_path / "ckpt"), 3, {})
    trained.export_hf(str(tmp_path / "hf"), 3)
    want = trained.compute_log_probs(batch).old_log_probs
    opd = LossConfig(opd=OPDConfig(kl_coef=0.0, loss_coef=1.0, is_clip=2.0))
    for load, step in ((tmp_path / "ckpt", 3), (tmp_path / "hf", None)):
        config = _config(loss=opd, opd_teacher_load=str(load), opd_teacher_ckpt_step=step)
        student = TorchTrainBackend(str(tiny_model), config, device=DEVICE)
        filled = student.compute_log_probs(batch)
        assert torch.allclose(filled.teacher_log_probs, want, atol=1e-5)
        assert not torch.allclose(filled.old_log_probs, want, atol=1e-3)  # the student is not the teacher
    filled.advantages = torch.zeros_like(filled.loss_mask)
    metrics = student.train_step(filled)
    assert abs(metrics["opd_kl"]) > 1e-4  # the student's KL to the teacher: a value (not 0, not NaN)
    assert {"opd_loss", "opd_is_clipfrac"} <= set(metrics) and metrics["pg_loss"] == 0
