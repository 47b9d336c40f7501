"""`runtime.weight_sync.in_place`: a trainer's tensors copied into a colocated fastgen engine of the same process,
on CPU with the tiny Qwen2 (the same code copies GPU to GPU on CUDA). The megatron trainer's side
(`MegatronTrainBackend.iter_device_weights`) is tested in tests/unit/runtime/megatron/test_in_place_sync.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from runtime.devices import Device, DeviceKind
from runtime.rollout.fastgen import FastGenEngine
from runtime.rollout.params import SamplingParams
from runtime.weight_sync.in_place import InPlaceWeightSync

CPU = Device(DeviceKind.CPU)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
PROMPTS = [[5, 9, 11, 3], [7, 7, 2]]


@pytest.fixture(scope="module")
def trained(tiny_model: Path) -> dict[str, torch.Tensor]:
    """The tiny model's weights after a 'training step' (each tensor moved by seeded noise)."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def weights_of(engine: FastGenEngine) -> dict[str, torch.Tensor]:
    return {name: engine.weights.target(name).clone() for name in engine.weights.hf}


@pytest.mark.parametrize("bucket_bytes", [None, 4096])
def test_push_copies_every_tensor_in_place_and_takes_the_version(
    tiny_model: Path, trained: dict[str, torch.Tensor], bucket_bytes: int | None
) -> None:
    engine = FastGenEngine(str(tiny_model), device=CPU, max_batch_size=4)
    before = [r.token_ids for r in engine.generate(PROMPTS, GREEDY)]
    storage = engine.weights.flat.data_ptr()
    sync = InPlaceWeightSync(engine, bucket_bytes=bucket_bytes)
    update = sync.push(iter(trained.items()), version=1)
    assert engine.weight_version == update.version == 1
    assert engine.weights.flat.data_ptr() == storage  # the engine's own buffer, overwritten
    for name, tensor in weights_of(engine).items():
        assert torch.equal(tensor, trained[name]), name
    assert update.tensors == len(trained) and update.bytes == sum(t.numel() * 4 for t in trained.values())
    assert (update.buckets > 1) == (bucket_bytes is not None)
    after = engine.generate(PROMPTS, GREEDY)
    assert [r.token_ids for r in after] != before and {r.weight_version for r in after} == {1}
    update = sync.push(iter(trained.items()), version=2)  # versions advance one at a time
    assert engine.weight_version == 2


def test_a_wrong_version_is_refused_before_any_weight_is_read(
    tiny_model: Path, trained: dict[str, torch.Tensor]
) -> None:
    engine = FastGenEngine(str(tiny_model), device=CPU, max_batch_size=4)
    original = weights_of(engine)
    read: list[str] = []

    def weights():  # type: ignore[no-untyped-def]
        for name, tensor in trained.items():
            read.append(name)
            yield name, tensor

    for version in (0, 2, 5):
        with pytest.raises(ValueError, match=f"version {version}: the engine holds 0, expected 1"):
            InPlaceWeightSync(engine).push(weights(), version=version)
    assert read == [] and engine.weight_version == 0
    assert all(torch.equal(original[n], t) for n, t in weights_of(engine).items())


def test_a_missing_tensor_is_refused_and_leaves_the_engine_as_it_was(
    tiny_model: Path, trained: dict[str, torch.Tensor]
) -> None:
    engine = FastGenEngine(str(tiny_model), device=CPU, max_batch_size=4)
    original = weights_of(engine)
    partial = {k: v for k, v in trained.items() if k != "model.layers.1.self_attn.k_proj.weight"}
    with pytest.raises(KeyError, match=r"missing \['model.layers.1.self_attn.k_proj.weight'\]"):
        InPlaceWeightSync(engine).push(iter(partial.items()), version=1)
    assert engine.weight_version == 0
    assert all(torch.equal(original[n], t) for n, t in weights_of(engine).items())  # nothing copied
    # bucketed: each bucket is copied as it comes, the missing tensor is caught at the end, version unchanged
    with pytest.raises(KeyError, match="weight update 1 is missing"):
        InPlaceWeightSync(engine, bucket_bytes=4096).push(iter(partial.items()), version=1)
    assert engine.weight_version == 0
    InPlaceWeightSync(engine, bucket_bytes=4096).push(
        iter(trained.items()), version=1
    )  # a full push repairs it
    assert engine.weight_version == 1


def test_unknown_misshapen_or_foreign_device_tensors_are_refused(
    tiny_model: Path, trained: dict[str, torch.Tensor]
) -> None:
    engine = FastGenEngine(str(tiny_model), device=CPU, max_batch_size=4)
    sync = InPlaceWeightSync(engine)
    with pytest.raises(KeyError, match="model.layers.7.mlp.up_proj.weight"):
        sync.push(iter({**trained, "model.layers.7.mlp.up_proj.weight": torch.zeros(2)}.items()), version=1)
    with pytest.raises(ValueError, match="model.norm.weight"):
        sync.push(iter({**trained, "model.norm.weight": torch.zeros(3)}.items()), version=1)
    elsewhere = {
        **trained,
        "model.norm.weight": torch.empty_like(trained["model.norm.weight"], device="meta"),
    }
    with pytest.raises(ValueError, match="'model.norm.weight' is on meta, the engine on cpu"):
        sync.push(iter(elsewhere.items()), version=1)
    assert engine.weight_version == 0
