"""Checkpoint retention (max-actor-ckpt-to-keep, rotate-ckpt), async save, reference updates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.access import LOCAL_OWNER, OWNER_FILE
from runtime.devices import Device
from runtime.train.checkpoint import (
    TRAINER_STATE_FILE,
    RetentionPolicy,
    iteration_dir,
    latest_complete_iteration,
    list_iterations,
    prune_checkpoints,
    read_latest_iteration,
    write_latest_iteration,
)
from runtime.train.schedule import LRSchedule
from runtime.train.torch_backend import REFERENCE_DIR, TorchTrainBackend, TrainConfig
from runtime.types import RolloutBatch, Sample


@pytest.mark.parametrize(
    ("policy", "on_disk", "kept"),
    [
        (RetentionPolicy(), [0, 1, 2], [0, 1, 2]),  # no retention asked for
        (RetentionPolicy(keep=2), [1, 3, 5, 7], [5, 7]),
        (RetentionPolicy(keep=0), [1, 3], [3]),  # the newest always stays: it is what load resumes
        (RetentionPolicy(rotate=True, save_interval=2), [0, 1, 2, 3, 4], [1, 3, 4]),
        (RetentionPolicy(rotate=True, save_interval=2), [0, 1, 2, 3], [1, 3]),
        (RetentionPolicy(keep=1, rotate=True, save_interval=2), [0, 1, 2, 3, 4], [3, 4]),
        (RetentionPolicy(keep=2, rotate=True, save_interval=3), list(range(9)), [5, 8]),
    ],
)
def test_retention_policy(policy: RetentionPolicy, on_disk: list[int], kept: list[int]) -> None:
    assert sorted(set(on_disk) - set(policy.to_delete(on_disk))) == kept


def test_prune_removes_only_iteration_folders(tmp_path: Path) -> None:
    for i in (0, 1, 2):
        iteration_dir(tmp_path, i).mkdir()
        (iteration_dir(tmp_path, i) / OWNER_FILE).write_text(LOCAL_OWNER)
    (tmp_path / "rollout_result").mkdir()
    (tmp_path / "iter_abc").mkdir()
    removed = prune_checkpoints(tmp_path, RetentionPolicy(keep=1))
    assert [p.name for p in removed] == ["iter_0000000", "iter_0000001"]
    assert (
        list_iterations(tmp_path) == [2]
        and (tmp_path / "rollout_result").is_dir()
        and (tmp_path / "iter_abc").is_dir()
    )


def test_prune_keeps_checkpoints_another_job_wrote(tmp_path: Path) -> None:
    for i, owner in ((0, "job_other"), (1, None), (2, "job_me"), (3, "job_me")):
        iteration_dir(tmp_path, i).mkdir()
        if owner:
            (iteration_dir(tmp_path, i) / OWNER_FILE).write_text(owner)
    removed = prune_checkpoints(tmp_path, RetentionPolicy(keep=1), owner="job_me")
    assert [p.name for p in removed] == ["iter_0000002"]
    assert list_iterations(tmp_path) == [0, 1, 3]


def test_prune_takes_a_folder_out_of_the_layout_before_deleting_it(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for i in (0, 1):
        iteration_dir(tmp_path, i).mkdir()
        (iteration_dir(tmp_path, i) / OWNER_FILE).write_text(LOCAL_OWNER)
        (iteration_dir(tmp_path, i) / TRAINER_STATE_FILE).write_text("{}")
    import runtime.train.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint.shutil, "rmtree", lambda *a, **k: None)  # killed mid-delete
    prune_checkpoints(tmp_path, RetentionPolicy(keep=1))
    assert list_iterations(tmp_path) == [1]  # the half-deleted one no longer looks like a checkpoint


def test_resume_takes_the_newest_complete_checkpoint_on_disk(tmp_path: Path) -> None:
    assert latest_complete_iteration(tmp_path) is None  # nothing yet: start from hf-checkpoint
    for i in (1, 3, 4):
        iteration_dir(tmp_path, i).mkdir()
        if i != 4:  # iter 4 has no state file: not a complete checkpoint
            (iteration_dir(tmp_path, i) / TRAINER_STATE_FILE).write_text("{}")
    write_latest_iteration(tmp_path, 1)  # the tracker lags: a crash came between rename and its update
    assert read_latest_iteration(tmp_path) == 1 and latest_complete_iteration(tmp_path) == 3
    write_latest_iteration(tmp_path, 7)  # names a folder that is gone
    assert latest_complete_iteration(tmp_path) == 3
    other = tmp_path / "other"
    other.mkdir()
    write_latest_iteration(
        other, 2
    )  # no complete folder at all: the tracker, so loading says what is missing
    assert latest_complete_iteration(other) == 2


def _batch(tok) -> RolloutBatch:
    prompt = tok("3+4=", add_special_tokens=False)["input_ids"]
    answer = tok("\\boxed{7}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    sample = Sample(0, 0, "", tokens=prompt + answer, response_length=len(answer))
    return RolloutBatch.from_samples([sample] * 2, tok.pad_token_id)


def test_async_save_writes_in_the_background_and_reports_when_done(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    config = TrainConfig(loss_type="sft", lr_schedule=LRSchedule(lr=1e-2), weight_decay=0.0)
    backend = TorchTrainBackend(str(tiny_model), config, device=Device.detect())
    batch = _batch(tok)
    backend.train_step(batch)
    snapshot = {k: v.clone() for k, v in backend.model.state_dict().items()}
    assert backend.save_checkpoint(str(tmp_path), 0, {"data": {"offset": 2}}, blocking=False) is None
    backend.train_step(batch)  # training goes on while the writer thread works on the copy
    records = backend.finished_saves(wait=True)
    assert [r.step for r in records] == [0] and records[0].size_bytes > 0
    assert read_latest_iteration(tmp_path) == 0 and backend.finished_saves() == []
    restored = TorchTrainBackend(str(tiny_model), config, device=Device.detect())
    assert restored.load_checkpoint(str(tmp_path)) == (0, {"data": {"offset": 2}})
    for name, tensor in restored.model.state_dict().items():
        assert torch.equal(tensor, snapshot[name]), name


def test_reference_update_is_saved_and_restored(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    config = TrainConfig(
        loss_type="sft", lr_schedule=LRSchedule(lr=1e-2), weight_decay=0.0, ref_update_interval=1
    )
    backend = TorchTrainBackend(str(tiny_model), config, device=Device.detect(), need_ref=True)
    backend.train_step(_batch(tok))
    assert not torch.equal(
        backend.model.model.embed_tokens.weight, backend.ref_model.model.embed_tokens.weight
    )  # type: ignore[union-attr]
    backend.update_reference()
    policy = {k: v.clone() for k, v in backend.model.state_dict().items()}
    assert all(torch.equal(v, policy[k]) for k, v in backend.ref_model.state_dict().items())  # type: ignore[union-attr]
    backend.save_checkpoint(str(tmp_path), 0, {})
    assert (iteration_dir(tmp_path, 0) / REFERENCE_DIR).is_dir()
    fresh = TorchTrainBackend(str(tiny_model), config, device=Device.detect(), need_ref=True)
    fresh.load_checkpoint(str(tmp_path))
    assert all(torch.equal(v, policy[k]) for k, v in fresh.ref_model.state_dict().items())  # type: ignore[union-attr]
    nll, tokens = fresh.evaluate_nll(_batch(tok))
    assert tokens == int(_batch(tok).loss_mask.sum()) and nll > 0
