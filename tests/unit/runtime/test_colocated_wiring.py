"""Which jobs host their rollout engine in the trainer's rank actors (`EngineKind.IN_TRAINER`), with which
offload flags, in which layouts; and the in-place hand-over's checks into the torch engine that such a
rank holds on CPU (the tiny model): the version the driver expects, a missing tensor, a repeated version."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from runtime.devices import Device, DeviceKind
from runtime.pipeline.plans import engine_kind, in_trainer_refusal, offload_flags, role_plan, rollout_samples
from runtime.roles.colocated import MAX_HOSTED_BATCH, hosted_batch_size
from runtime.roles.groups import EngineKind, hosts_engines
from runtime.roles.placement import plan_topology
from runtime.rollout.engine import TorchRolloutEngine
from runtime.rollout.params import SamplingParams
from runtime.spec import RuntimeSpec
from runtime.train.schedule import LRSchedule
from runtime.train.torch_backend import TorchTrainBackend, TrainConfig
from runtime.weight_sync.in_place import InPlaceWeightSync

CPU = Device(DeviceKind.CPU)
COLOCATED = RuntimeSpec(
    train_backend="torch",
    hf_checkpoint="/m",
    colocate=True,
    resource={"actor": [1, 1], "rollout": [1, 1]},
)


def kind(spec: RuntimeSpec, explicit: EngineKind | None = None, **kw: bool) -> EngineKind:
    return engine_kind(spec, explicit, **kw)


def test_a_colocated_rl_job_hosts_its_engine_in_the_trainer_by_default() -> None:
    assert kind(COLOCATED) is EngineKind.IN_TRAINER
    assert kind(dataclasses.replace(COLOCATED, train_backend="megatron")) is EngineKind.IN_TRAINER
    assert kind(COLOCATED, EngineKind.IN_TRAINER) is EngineKind.IN_TRAINER


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"colocate": False}, "not colocated"),
        ({"fully_async": True}, "not colocated"),
        ({"hybrid": True}, "not colocated"),
        ({"loss_type": "sft"}, "only an RL job"),
        ({"debug_rollout_only": True}, "only an RL job"),
        ({"debug_train_only": True}, "only an RL job"),
        ({"rollout_external": True, "rollout_external_engine_addrs": ["h:1"]}, "only an RL job"),
        ({"train_backend": "plugin"}, "does not hand its weights over"),
        ({"extra": {"pipeline_model_parallel_size": 2}}, "pipeline-model-parallel-size"),
    ],
)
def test_jobs_that_cannot_host_keep_engines_of_their_own(change: dict, why: str) -> None:
    spec = dataclasses.replace(COLOCATED, **change)
    assert why in (in_trainer_refusal(spec, by_default=False) or "")
    assert kind(spec) is EngineKind.HTTP
    assert kind(spec, EngineKind.IN_TRAINER) is EngineKind.HTTP  # asked for, refused: servers, with a warning


def test_what_asks_for_engine_servers_keeps_them_unless_in_trainer_is_named() -> None:
    for spec, sglang_runs in (
        (
            dataclasses.replace(
                COLOCATED, extra={"sglang": {"server_argv": ["--mem-fraction-static", "0.5"]}}
            ),
            False,
        ),
        (dataclasses.replace(COLOCATED, extra={"use_health_check": True}), False),
        (COLOCATED, True),  # SGLang itself would run the servers
    ):
        assert kind(spec, sglang_runs=sglang_runs) is EngineKind.HTTP
        assert kind(spec, EngineKind.IN_TRAINER, sglang_runs=sglang_runs) is EngineKind.IN_TRAINER
    # a kind named explicitly wins: the engine actor of its own, or the engine servers
    assert kind(COLOCATED, EngineKind.IN_PROCESS) is EngineKind.IN_PROCESS
    assert kind(COLOCATED, EngineKind.HTTP) is EngineKind.HTTP


def test_the_role_plan_carries_the_kind_and_the_offload_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAX_ROLLOUT_ENGINE", raising=False)
    plan = role_plan(COLOCATED, 3, CPU)
    assert plan.engine_kind is EngineKind.IN_TRAINER and (plan.offload_train, plan.offload_rollout) == (
        True,
        True,
    )
    monkeypatch.setenv("RELAX_ROLLOUT_ENGINE", "in-process")
    assert role_plan(COLOCATED, 3, CPU).engine_kind is EngineKind.IN_PROCESS
    # `--offload-train` / `--offload-rollout` as set; unset: on exactly when colocated; `--offload`: both
    assert offload_flags(dataclasses.replace(COLOCATED, extra={"offload_rollout": False})) == (True, False)
    assert offload_flags(dataclasses.replace(COLOCATED, colocate=False)) == (False, False)
    assert offload_flags(dataclasses.replace(COLOCATED, offload=True, extra={"offload_train": False})) == (
        True,
        True,
    )
    # a colocated job that keeps both sides resident: the hosted engines are told so
    resident = role_plan(
        dataclasses.replace(COLOCATED, extra={"offload_train": False, "offload_rollout": False}), 3, CPU
    )
    assert (resident.offload_train, resident.offload_rollout) == (False, False)
    # each hosted engine keeps a KV slot for every sample of its share of a rollout
    assert rollout_samples({"rollout_batch_size": 64, "n_samples_per_prompt": 8}) == 512
    assert (
        rollout_samples({"rollout_batch_size": 4, "over_sampling_batch_size": 6, "n_samples_per_prompt": 2})
        == 12
    )
    assert hosted_batch_size(512, 1) == 512 and hosted_batch_size(513, 2) == 257
    assert hosted_batch_size(100_000, 1) == MAX_HOSTED_BATCH and hosted_batch_size(0, 4) == 1


@pytest.mark.parametrize(
    ("resource", "colocate", "hosts"),
    [
        ({"actor": [1, 1], "rollout": [1, 1]}, True, True),
        ({"actor": [1, 2], "rollout": [1, 2]}, True, True),  # one engine per rank (megatron, 2 ranks)
        # PPO: the rollout spans the actor's and the critic's devices: two engines, one rank
        ({"actor": [1, 1], "critic": [1, 1], "rollout": [1, 2]}, True, False),
        ({"actor": [1, 1], "rollout": [1, 1]}, False, False),
    ],
)
def test_each_rank_hosts_the_one_engine_of_its_device(resource: dict, colocate: bool, hosts: bool) -> None:
    world = resource["actor"][1] if resource["actor"][1] > 1 else None
    topology = plan_topology(
        resource,
        colocate=colocate,
        with_rollout=True,
        with_train=True,
        device=CPU,
        train_world=world,
        with_critic="critic" in resource,
    )
    assert (hosts_engines(topology) is None) is hosts


# -- the hand-over into the torch engine a rank hosts on CPU --------------------------------------------------


@pytest.fixture(scope="module")
def pair(tiny_model: Path) -> tuple[TorchTrainBackend, TorchRolloutEngine]:
    torch.manual_seed(0)
    config = TrainConfig(
        loss_type="sft", lr_schedule=LRSchedule(lr=1e-2), micro_batch_size=4, weight_decay=0.0
    )
    trainer = TorchTrainBackend(str(tiny_model), config, device=CPU)
    with torch.no_grad():  # a 'trained' policy: different from the engine's checkpoint weights
        for param in trainer.model.parameters():
            param.add_(0.01 * torch.randn_like(param))
    return trainer, TorchRolloutEngine(str(tiny_model), device=CPU, max_batch_size=4)


def engine_state(engine: TorchRolloutEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.model.state_dict().items()}


def test_push_checks_the_expected_version_and_every_tensor_before_copying(
    pair: tuple[TorchTrainBackend, TorchRolloutEngine],
) -> None:
    trainer, engine = pair
    sync = InPlaceWeightSync(engine)
    before = engine_state(engine)
    with pytest.raises(ValueError, match="the engine holds 0, the driver expected it to hold 2"):
        sync.push(trainer.iter_device_weights(), version=3, expected=2)
    weights = dict(trainer.iter_device_weights())
    dropped = dict(weights)
    dropped.pop("model.layers.0.mlp.up_proj.weight")
    with pytest.raises(ValueError, match=r"missing=\['model.layers.0.mlp.up_proj.weight'\]"):
        sync.push(iter(dropped.items()), version=1, expected=0)
    misshapen = {**weights, "model.norm.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match="'model.norm.weight' has shape"):
        sync.push(iter(misshapen.items()), version=1, expected=0)
    assert engine.weight_version == 0
    assert all(torch.equal(before[k], v) for k, v in engine_state(engine).items())  # untouched

    # the driver's first push repeats the version the engine loaded (0); later ones may skip
    assert sync.push(trainer.iter_device_weights(), version=0, expected=0).version == 0
    assert sync.push(trainer.iter_device_weights(), version=3, expected=0).version == 3
    assert engine.weight_version == 3
    own = engine.model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in weights.items())  # exactly the trainer's
    assert own["model.norm.weight"].data_ptr() != weights["model.norm.weight"].data_ptr()  # a copy
    with pytest.raises(ValueError, match="older than the engine's 3"):
        sync.push(trainer.iter_device_weights(), version=2, expected=3)
    out = engine.generate([[5, 9, 11]], SamplingParams(temperature=0.0, max_new_tokens=3))
    assert out[0].weight_version == 3
