"""`MegatronTrainBackend.iter_device_weights` -> `runtime.weight_sync.in_place` -> a fastgen engine of the same
process (one megatron rank, gloo, CPU): the engine ends up with exactly the trainer's weights after a training
step, through the live parameters (no host copy on CUDA: here the device is the CPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")


def test_the_engine_takes_the_trained_weights_in_place(hf_folder, megatron_world) -> None:  # type: ignore[no-untyped-def]
    from runtime.algos.losses import LossConfig
    from runtime.devices import Device, DeviceKind
    from runtime.rollout.fastgen import FastGenEngine
    from runtime.train.base import TrainContext
    from runtime.train.megatron.backend import MegatronTrainBackend
    from runtime.train.megatron.convert import unwrap
    from runtime.train.megatron.parallel import destroy_parallel
    from runtime.train.schedule import LRSchedule
    from runtime.train.torch_backend import TrainConfig
    from runtime.types import RolloutBatch
    from runtime.weight_sync.in_place import InPlaceWeightSync

    folder = hf_folder("qwen2")
    values = {"bf16": False, "hidden_dropout": 0.0, "attention_dropout": 0.0, "qkv_format": "bshd"}
    config = TrainConfig(lr_schedule=LRSchedule(lr=1e-2), micro_batch_size=2, loss=LossConfig())
    destroy_parallel(process_group=False)  # the backend sets megatron's groups up itself (same process group)
    backend = MegatronTrainBackend(
        str(folder), config, device=Device.detect(), context=TrainContext(values=values)
    )
    cpu = Device(DeviceKind.CPU)
    engine = FastGenEngine(str(folder), device=cpu, max_batch_size=4)

    weights = dict(backend.iter_device_weights())
    assert weights.keys() == backend.named_weights().keys()
    gpt = unwrap(backend.models[0])
    norm = gpt.decoder.layers[0].input_layernorm.weight
    assert (
        weights["model.layers.0.input_layernorm.weight"].data_ptr() == norm.data_ptr()
    )  # the live parameter

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, 150, (4, 12), generator=gen)
    loss_mask = torch.zeros(4, 12)
    loss_mask[:, 6:] = 1.0
    batch = RolloutBatch(
        tokens=tokens,
        attention_mask=torch.ones(4, 12, dtype=torch.long),
        loss_mask=loss_mask,
        group_index=torch.tensor([0, 0, 1, 1]),
        rewards=torch.tensor([1.0, 0.0, 0.5, 0.2]),
        rollout_log_probs=torch.zeros(4, 12),
        advantages=loss_mask * torch.tensor([[1.0], [-1.0], [1.0], [-1.0]]),
    )
    backend.train_step(backend.compute_log_probs(batch))
    trained = backend.named_weights()
    assert any(
        not torch.equal(trained[n], w) for n, w in weights.items() if n in trained
    )  # the step moved them
    update = InPlaceWeightSync(engine).push(backend.iter_device_weights(), version=1)
    assert engine.weight_version == 1 and update.tensors == len(trained)
    for name, tensor in trained.items():
        if name in engine.weights.hf:
            assert torch.equal(engine.weights.target(name), tensor.to(engine.dtype)), name
    with pytest.raises(ValueError, match="expected 2"):
        InPlaceWeightSync(engine).push(backend.iter_device_weights(), version=1)
