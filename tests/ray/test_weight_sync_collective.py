"""The collective weight sync on a real local Ray, over gloo (the NCCL path is the same code on GPU): one
trainer rank (the torch backend) and rollout engine actors of their own (fastgen and the HF engine).
After a push the engines hold exactly the trainer's weights in `--update-weight-buffer-size` buckets; an
engine that does not hold the version the driver expects, or that needs a tensor the trainer does not
send, fails the push loudly, naming the engine, the versions or the tensor, and nobody hangs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file, save_file

from runtime.models.tiny import build_tiny_model
from runtime.roles.actors import RolloutEngineActor, TrainActor
from runtime.roles.groups import RolloutGroup, TrainGroup
from runtime.train.schedule import LRSchedule
from runtime.train.torch_backend import TrainConfig
from runtime.weight_sync import WeightSyncBackend, create_weight_sync
from runtime.weight_sync.collective import CollectiveWeightSync, WeightPushError

pytestmark = pytest.mark.ray


def variant(model: Path, out: Path, *, untied: bool = False) -> Path:
    """A copy of the model's folder: with every weight moved by seeded noise (what a trainer holds after a
    step), or `untied` (its own lm_head: an engine checkpoint that wants a tensor a tied trainer never
    sends)."""
    out.mkdir(parents=True)
    for item in model.iterdir():
        (out / item.name).write_bytes(item.read_bytes())
    weights = load_file(model / "model.safetensors")
    if untied:
        config = json.loads((model / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    else:
        gen = torch.Generator().manual_seed(1)
        weights = {
            k: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in weights.items()
        }
    save_file(weights, out / "model.safetensors")
    return out


@pytest.fixture(scope="module")
def actors(ray_local, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("collective")
    engine_model = build_tiny_model(root / "engines", seed=0)
    trainer_model = variant(engine_model, root / "trainer")  # other weights: a push visibly moves them
    untied = variant(engine_model, root / "untied", untied=True)
    fastgen = {"env_vars": {"RELAX_ROLLOUT_BACKEND": "fastgen"}}
    # CPU here (gloo). On a host with 3 GPUs or more each actor takes one and the same test runs the NCCL
    # path (NCCL cannot put two ranks on one GPU, so 1 or 2 GPUs cannot run it)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if 0 < gpus < 3:
        pytest.skip(f"{gpus} GPU(s): the NCCL path needs one per actor (3), the gloo path none")
    one = {"num_gpus": 1} if gpus else {}
    began = time.monotonic()
    trainer = (
        ray.remote(TrainActor)
        .options(num_cpus=0, **one)
        .remote(
            "torch",
            str(trainer_model),
            TrainConfig(loss_type="sft", lr_schedule=LRSchedule(lr=1e-3)),
            need_ref=False,
        )
    )
    engines = [
        ray.remote(RolloutEngineActor)
        .options(num_cpus=0, runtime_env=fastgen, **one)
        .remote(str(engine_model), engine_index=0),
        ray.remote(RolloutEngineActor).options(num_cpus=0, **one).remote(str(engine_model), engine_index=1),
    ]
    ray.get([a.ready.remote() for a in [trainer, *engines]])
    print(f"actors ready in {time.monotonic() - began:.1f} s")
    yield trainer, engines, untied
    for actor in [trainer, *engines]:
        ray.kill(actor)


def engine_weights(engine: ray.actor.ActorHandle) -> dict[str, torch.Tensor]:
    """The engine's weights under HF names, read in its own process (host copies)."""

    def read(actor: RolloutEngineActor) -> dict[str, torch.Tensor]:
        weights = getattr(actor.engine, "weights", None)
        if weights is not None:  # fastgen's flat buffer
            return {name: weights.target(name).cpu() for name in weights.hf}
        return {name: t.cpu() for name, t in actor.engine.model.state_dict().items()}

    return ray.get(engine.__ray_call__.remote(read))


def engine_version(engine: ray.actor.ActorHandle) -> int:
    return ray.get(engine.__ray_call__.remote(lambda actor: actor.engine.weight_version))


def test_push_makes_the_engines_hold_the_trainers_weights_and_checks_versions(actors) -> None:  # type: ignore[no-untyped-def]
    trainer, engines, _ = actors
    train = TrainGroup([trainer])
    rollout = RolloutGroup(engines[:2])
    sync = create_weight_sync(WeightSyncBackend.COLLECTIVE)
    assert isinstance(sync, CollectiveWeightSync)
    sync.bucket_bytes = 64 * 1024  # the tiny model (~0.4 MB) goes in several buckets
    sync.timeout_s = 20.0
    theirs = ray.get(trainer.named_weights.remote())
    before = engine_weights(engines[0])
    assert any(not torch.equal(before[n], theirs[n].to(before[n].dtype)) for n in theirs)

    began = time.monotonic()
    sync.push(train, [rollout], version=1)
    print(f"first push (group formed, {len(theirs)} tensors) in {time.monotonic() - began:.2f} s")
    for engine in engines[:2]:
        held = engine_weights(engine)
        assert set(theirs) <= set(held)
        for name, tensor in theirs.items():  # in the engine's dtype (fastgen holds bf16 on GPU)
            assert torch.equal(held[name], tensor.to(held[name].dtype)), name
        assert engine_version(engine) == 1
    assert rollout.weight_version == 1

    began = time.monotonic()
    sync.push(train, [rollout], version=3)  # versions may skip (update-weights-interval)
    print(f"second push in {time.monotonic() - began:.2f} s")
    assert [engine_version(e) for e in engines[:2]] == [3, 3]

    # engine 1 moved behind the driver's back: the next push is refused before a byte moves, for everyone
    ray.get(engines[1].__ray_call__.remote(lambda actor: setattr(actor.engine, "weight_version", 7)))
    began = time.monotonic()
    with pytest.raises(
        WeightPushError, match=r"engine1: weight push \d+ \(version 4.*holds version 7, the driver expected 3"
    ):
        sync.push(train, [rollout], version=4)
    assert time.monotonic() - began < sync.timeout_s  # aborted through the gate, not timed out
    assert engine_version(engines[0]) == 3

    # the group is formed anew after a failure; with the versions agreeing again, pushes go through
    ray.get(engines[1].__ray_call__.remote(lambda actor: setattr(actor.engine, "weight_version", 4)))
    ray.get(engines[0].__ray_call__.remote(lambda actor: setattr(actor.engine, "weight_version", 4)))
    sync.push(train, [rollout], version=5)
    assert [engine_version(e) for e in engines[:2]] == [5, 5]


def test_an_engine_missing_a_tensor_fails_the_push_naming_it(actors) -> None:  # type: ignore[no-untyped-def]
    trainer, engines, untied = actors

    def load_untied(
        actor: RolloutEngineActor,
    ) -> None:  # the HF engine, from a checkpoint with its own lm_head
        from runtime.devices import Device
        from runtime.rollout.engine import TorchRolloutEngine

        actor.engine = TorchRolloutEngine(str(untied), device=Device.detect())

    ray.get(engines[1].__ray_call__.remote(load_untied))
    sync = CollectiveWeightSync(bucket_bytes=1 << 20, timeout_s=20.0)
    with pytest.raises(
        WeightPushError, match=r"engine1: weight push 1 \(version 1.* is missing: \['lm_head.weight'\]"
    ):
        sync.push(TrainGroup([trainer]), [RolloutGroup([engines[1]])], version=1)
    assert [engine_version(e) for e in engines] == [5, 0]  # nobody took anything
