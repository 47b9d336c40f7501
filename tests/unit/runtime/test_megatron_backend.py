"""MegatronTrainBackend on CPU (gloo), two ranks in two processes, against the torch backend on the same tiny
model in fp32: the same log-probs, the same loss and gradient norm (the same micro-batch weighting), the
same weights after the optimizer steps, under TP=2, DP=2 and PP=2; checkpoints in torch_dist restore the
weights and honour --no-load-optim and --finetune."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

TOLERANCE = {"log_probs": 1e-5, "metrics": 1e-4, "weights": 1e-4}


def _values(model: Path, **overrides: Any) -> dict[str, Any]:
    from runtime.spec import load_spec

    spec = load_spec(
        {
            "train-backend": "megatron",
            "hf-checkpoint": str(model),
            "prompt-data": "unused.jsonl",
            "rollout-batch-size": 4,
            "num-rollout": 1,
            "rm-type": "math",
            "colocate": True,
            "hidden-dropout": 0.0,
            "attention-dropout": 0.0,
            **overrides,
        }
    )
    values = spec.values()
    values["bf16"] = False  # fp32, to compare with the torch backend exactly (Relax derives bf16)
    return values


def _batch(n: int = 8, seed: int = 0):
    from runtime.types import RolloutBatch, Sample

    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        prompt, response = 5 + i % 3, 3 + i % 5  # ragged: right padding and uneven micro-batches
        tokens = torch.randint(3, 300, (prompt + response,), generator=g).tolist()
        samples.append(
            Sample(
                i, i // 4, "p", tokens=tokens, response_length=response, rollout_log_probs=[-1.0] * response
            )
        )
    batch = RolloutBatch.from_samples(samples, 0)
    batch.advantages = batch.loss_mask * torch.randn(n, 1, generator=g)
    return batch


# dynamic batch size (micro-batches of at most 24 tokens, so ranks get different micro-batch counts) with a
# per-token loss: the other weighting of micro-batches
DYNAMIC = {"max_tokens_per_micro_batch": 24, "per_token_loss": True}


def _config(**overrides: Any):
    from runtime.algos.losses import LossConfig
    from runtime.train.schedule import LRSchedule
    from runtime.train.torch_backend import TrainConfig

    per_token = overrides.pop("per_token_loss", False)
    return TrainConfig(
        lr_schedule=LRSchedule(lr=1e-3),
        global_batch_size=4,
        micro_batch_size=2,
        weight_decay=0.0,
        loss=LossConfig(use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01, per_token_loss=per_token),
        **overrides,
    )


def _worker(
    rank: int, world: int, port: int, model: str, overrides: dict, out: str, checkpoints: bool
) -> None:
    torch.set_num_threads(1)
    from runtime.devices import Device
    from runtime.train.base import TrainContext, train_backend_class

    overrides = dict(overrides)
    config = _config(**overrides.pop("config", {}))
    context = TrainContext(rank, world, "127.0.0.1", port, _values(Path(model), **overrides))
    backend = train_backend_class("megatron")(
        model, config, device=Device.detect(), need_ref=True, context=context
    )
    batch = backend.compute_log_probs(_batch())
    metrics = backend.train_step(batch)
    result: dict[str, Any] = {
        "old": batch.old_log_probs,
        "ref": batch.ref_log_probs,
        "metrics": metrics,
        "weights": backend.named_weights(),
        "checksum": backend.parameter_checksum(),
    }
    if checkpoints:
        save = Path(out).parent / "ckpt"
        record = backend.save_checkpoint(str(save), 0, {"data": {"position": 7}})
        saved = backend.named_weights()
        backend.train_step(batch)  # move away from the checkpoint
        moved = backend.named_weights()
        iteration, extra = backend.load_checkpoint(str(save))
        loaded = backend.named_weights()
        steps = backend.optimizer_steps
        backend.values["no_load_optim"] = True
        backend.train_step(batch)
        backend.load_checkpoint(str(save))
        backend.values["no_load_optim"] = False
        backend.values["finetune"] = True
        finetune = backend.load_checkpoint(str(save))
        backend.export_hf(str(Path(out).parent / "hf"), 0)
        # --no-save-optim: the weights only; loading refreshes the optimizer's copy of them
        import dataclasses

        backend.config = dataclasses.replace(backend.config, save_optimizer=False)
        backend.values["finetune"] = False
        backend.save_checkpoint(str(save), 1, {})
        backend.train_step(batch)
        result["without_optimizer"] = backend.load_checkpoint(str(save))
        result["loaded_without_optimizer"] = backend.named_weights()
        # `ref-load` naming a checkpoint root of this backend: the policy (and reference) start from it
        from runtime.train.megatron.parallel import destroy_parallel

        destroy_parallel(process_group=False)
        from_ckpt = train_backend_class("megatron")(
            model, _config(ref_load=str(save)), device=Device.detect(), need_ref=True, context=context
        )
        result["from_ref_load"] = from_ckpt.named_weights()
        result.update(
            record=None if record is None else record.path,
            iteration=iteration,
            extra=extra,
            saved=saved,
            moved=moved,
            loaded=loaded,
            steps=steps,
            finetune=finetune,
            after_finetune=backend.named_weights(),
        )
    if rank == 0:
        torch.save(result, out)


def _spawn(model: Path, tmp_path: Path, overrides: dict, *, checkpoints: bool = False) -> dict[str, Any]:
    from runtime.train.megatron.parallel import free_port

    out = tmp_path / "result.pt"
    mp.spawn(_worker, args=(2, free_port(), str(model), overrides, str(out), checkpoints), nprocs=2)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runtime.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny", seed=0)


def _torch_answers(model: Path, config: dict) -> dict[str, Any]:
    """The torch backend's answers on the same model and batch."""
    from runtime.devices import Device
    from runtime.train.torch_backend import TorchTrainBackend

    torch.set_num_threads(1)
    backend = TorchTrainBackend(str(model), _config(**config), device=Device.detect(), need_ref=True)
    batch = backend.compute_log_probs(_batch())
    metrics = backend.train_step(batch)
    return {
        "old": batch.old_log_probs,
        "ref": batch.ref_log_probs,
        "metrics": metrics,
        "weights": backend.named_weights(),
    }


@pytest.fixture(scope="module")
def reference(tiny: Path) -> dict[str, Any]:
    return _torch_answers(tiny, {})


@pytest.fixture(scope="module")
def dynamic_reference(tiny: Path) -> dict[str, Any]:
    return _torch_answers(tiny, DYNAMIC)


def _assert_matches(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert float((got["old"] - want["old"]).abs().max()) < TOLERANCE["log_probs"]
    assert float((got["ref"] - want["ref"]).abs().max()) < TOLERANCE["log_probs"]
    assert set(got["metrics"]) == set(want["metrics"])
    for name, value in want["metrics"].items():
        assert got["metrics"][name] == pytest.approx(value, abs=TOLERANCE["metrics"], rel=1e-4), name
    assert got["weights"].keys() == want["weights"].keys()
    worst = max(float((got["weights"][k] - want["weights"][k]).abs().max()) for k in want["weights"])
    assert worst < TOLERANCE["weights"], worst


@pytest.mark.parametrize(
    "layout",
    [
        {"tensor-model-parallel-size": 2, "resource": {"actor": [1, 2], "rollout": [1, 2]}},
        {"resource": {"actor": [1, 2], "rollout": [1, 2]}},  # DP=2
        {"pipeline-model-parallel-size": 2, "resource": {"actor": [1, 2], "rollout": [1, 2]}},
        {
            "overlap-grad-reduce": True,
            "overlap-param-gather": True,
            "sequence-parallel": True,
            "tensor-model-parallel-size": 2,
            "resource": {"actor": [1, 2], "rollout": [1, 2]},
        },
        {
            "overlap-grad-reduce": True,
            "overlap-param-gather": True,
            "resource": {"actor": [1, 2], "rollout": [1, 2]},
        },
        {"balance-data": True, "resource": {"actor": [1, 2], "rollout": [1, 2]}},
    ],
    ids=["tp2", "dp2", "pp2", "tp2-sp-overlap", "dp2-overlap", "dp2-balance-data"],
)
def test_two_ranks_match_the_torch_backend(tiny: Path, reference: dict, tmp_path: Path, layout: dict) -> None:
    got = _spawn(tiny, tmp_path, layout)
    _assert_matches(got, reference)
    assert got["checksum"] == pytest.approx(
        float(sum(t.double().abs().sum() for t in got["weights"].values()))
    )


@pytest.mark.parametrize(
    "layout",
    [
        {"resource": {"actor": [1, 2], "rollout": [1, 2]}},  # DP=2: each rank its own micro-batch count
        {"pipeline-model-parallel-size": 2, "resource": {"actor": [1, 2], "rollout": [1, 2]}},
    ],
    ids=["dp2", "pp2"],
)
def test_dynamic_batches_and_per_token_loss_match_the_torch_backend(
    tiny: Path, dynamic_reference: dict, tmp_path: Path, layout: dict
) -> None:
    got = _spawn(tiny, tmp_path, {**layout, "config": DYNAMIC})
    _assert_matches(got, dynamic_reference)


def test_balance_data_balances_the_data_parallel_shares() -> None:
    """`balance_data`: equal-size shares (as without it) whose token counts are even; the backend's
    data-parallel shares follow it (`dp2-balance-data` above: the same update as one rank)."""
    from runtime.train.megatron.backend import balanced_rows

    tokens = torch.tensor([90, 10, 80, 20, 70, 30, 5, 95])
    parts = balanced_rows(tokens, [4, 4])
    assert sorted(torch.cat(parts).tolist()) == list(range(8))
    assert [len(p) for p in parts] == [4, 4]
    loads = [int(tokens[p].sum()) for p in parts]
    assert abs(loads[0] - loads[1]) <= 10
    skewed = torch.tensor([100, 100, 100, 100, 1, 1, 1, 1, 1])
    parts = balanced_rows(skewed, [5, 4])
    loads = [int(skewed[p].sum()) for p in parts]
    assert [len(p) for p in parts] == [5, 4] and max(loads) - min(loads) <= 3  # contiguous: 401 vs 4
    assert all(p.tolist() == sorted(p.tolist()) for p in parts)  # batch order inside each share


def test_checkpoint_round_trip_and_load_flags(tiny: Path, reference: dict, tmp_path: Path) -> None:
    layout = {"tensor-model-parallel-size": 2, "resource": {"actor": [1, 2], "rollout": [1, 2]}}
    got = _spawn(tiny, tmp_path, layout, checkpoints=True)
    _assert_matches(got, reference)
    folder = tmp_path / "ckpt" / "iter_0000000"
    assert got["record"] == str(folder)
    assert (
        tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    ).read_text().strip() == "1"  # the last save
    assert (folder / ".metadata").is_file() and (folder / ".relax-job").is_file()
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["optimizer_steps"] == 2 and state["extra"] == {"data": {"position": 7}}
    assert got["iteration"] == 0 and got["extra"] == {"data": {"position": 7}} and got["steps"] == 2

    def worst(a: dict, b: dict) -> float:
        return max(float((a[k] - b[k]).abs().max()) for k in a)

    assert worst(got["moved"], got["saved"]) > 1e-4  # the extra step moved the weights
    assert worst(got["loaded"], got["saved"]) == 0.0  # loading brought them back exactly
    assert got["finetune"] is None  # finetune: weights only, the run starts at rollout 0
    assert worst(got["after_finetune"], got["saved"]) == 0.0
    assert worst(got["loaded_without_optimizer"], got["saved"]) == 0.0
    assert worst(got["from_ref_load"], got["saved"]) == 0.0  # iteration 1 holds the same weights
    state = json.loads((tmp_path / "ckpt" / "iter_0000001" / "trainer_state.json").read_text())
    assert state["has_optimizer"] is False and got["without_optimizer"][0] == 1
    exported = tmp_path / "hf"
    assert (exported / "model.safetensors").is_file() and (exported / "config.json").is_file()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no scratch folder left behind
