"""MegatronCriticBackend on CPU (gloo), two ranks (TP=2 with sequence parallelism: the value head replicated
across tensor-parallel ranks), against TorchCriticBackend on the same tiny model in fp32: a fresh critic
predicts 0; with the same value-head weights both predict the same values and take the same first step;
the value loss falls over a few steps; a torch_dist save -> load round trip gives back the same values.
Two ranks (TP=2 + SP, and DP=2) train as the one-rank critic does over several steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.runtime import ranks

TOLERANCE = {"values": 1e-4, "metrics": 1e-4}
STEPS = 6


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
            "resource": {"actor": [1, 2], "rollout": [1, 2]},
            "hidden-dropout": 0.0,
            "attention-dropout": 0.0,
            **overrides,
        }
    )
    values = spec.values()
    values["bf16"] = False  # fp32, to compare with the torch critic exactly
    return values


def _config():
    from runtime.algos.losses import LossConfig
    from runtime.train.critic import CriticConfig
    from runtime.train.schedule import LRSchedule

    return CriticConfig(
        lr_schedule=LRSchedule(lr=1e-2),
        global_batch_size=4,
        micro_batch_size=2,
        loss=LossConfig(value_clip=0.2),
    )


def _batch(n: int = 8, seed: int = 0):
    from runtime.types import RolloutBatch, Sample

    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        prompt, response = 5 + i % 3, 3 + i % 5  # ragged rows, uneven micro-batches
        tokens = torch.randint(3, 300, (prompt + response,), generator=g).tolist()
        samples.append(Sample(i, i // 4, "p", tokens=tokens, response_length=response))
    batch = RolloutBatch.from_samples(samples, 0)
    batch.returns = batch.loss_mask * torch.randn(n, 1, generator=g)
    return batch


def _head(hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(1, hidden, generator=g) * 0.5, torch.tensor([0.1])


def _worker(rank: int, world: int, port: int, model: str, out: str) -> None:
    torch.set_num_threads(1)
    from runtime.devices import Device
    from runtime.train.base import TrainContext
    from runtime.train.critic import critic_save_root
    from runtime.train.megatron.convert import unwrap
    from runtime.train.megatron.critic import MegatronCriticBackend

    values = _values(Path(model), **{"tensor-model-parallel-size": 2, "sequence-parallel": True})
    context = TrainContext(rank, world, "127.0.0.1", port, values)
    critic = MegatronCriticBackend(model, _config(), device=Device.detect(), context=context)
    batch = _batch()
    result: dict[str, Any] = {"fresh": critic.compute_values(batch)}
    weight, bias = _head(critic.args.hidden_size)
    with torch.no_grad():
        for chunk in critic.models:
            head = unwrap(chunk).output_layer
            head.weight.copy_(weight)
            head.bias.copy_(bias)
    batch.values = critic.compute_values(batch)
    result["values"] = batch.values
    result["steps"] = [critic.train_step(batch) for _ in range(STEPS)]
    root = critic_save_root(None, str(Path(out).parent / "save"))
    assert root is not None
    record = critic.save_checkpoint(root, 3)
    result["saved"] = critic.compute_values(batch)
    critic.train_step(batch)  # move away from the checkpoint
    result["moved"] = critic.compute_values(batch)
    result["iteration"] = critic.load_checkpoint(str(Path(out).parent / "save"))  # found in <save>/critic
    result["loaded"] = critic.compute_values(batch)
    result["optimizer_steps"] = critic.optimizer_steps
    result["record"] = None if record is None else record.path
    if rank == 0:
        torch.save(result, out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runtime.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny", seed=0)


COMPARED_STEPS = 3


def _steps_worker(rank: int, world: int, port: int, model: str, out: str, overrides: dict[str, Any]) -> None:
    """A critic rank as the critic role starts it (`critic_context`): the head set as `_worker` sets it, the
    values, `COMPARED_STEPS` training steps on them, the values after them."""
    torch.set_num_threads(1)
    from runtime.devices import Device
    from runtime.train.megatron.convert import unwrap
    from runtime.train.megatron.critic import MegatronCriticBackend, critic_context

    values = _values(Path(model), **overrides)
    context = critic_context(rank, world, "127.0.0.1", port, values)
    critic = MegatronCriticBackend(model, _config(), device=Device.detect(), context=context)
    weight, bias = _head(critic.args.hidden_size)
    with torch.no_grad():
        for chunk in critic.models:
            head = unwrap(chunk).output_layer
            head.weight.copy_(weight)
            head.bias.copy_(bias)
    batch = _batch()
    batch.values = critic.compute_values(batch)
    result: dict[str, Any] = {"values": batch.values, "layout": (critic.layout.tp, critic.dp_size)}
    result["steps"] = [critic.train_step(batch) for _ in range(COMPARED_STEPS)]
    result["trained"] = critic.compute_values(batch)
    if rank == 0:
        torch.save(result, out)


@pytest.fixture(scope="module")
def one_rank(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The one-rank critic of a TP=2 + SP job (a critic entry of one device: model-parallel sizes set to 1)."""
    from runtime.train.megatron.parallel import free_port

    out = tmp_path_factory.mktemp("one-rank") / "result.pt"
    tp2 = {"tensor-model-parallel-size": 2, "sequence-parallel": True}
    ranks.spawn(_steps_worker, (1, free_port(), str(tiny), str(out), tp2), nprocs=1)
    result = torch.load(out, weights_only=False)
    assert result["layout"] == (1, 1)
    return result


def _assert_same_training(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert float((got["values"] - want["values"]).abs().max()) < TOLERANCE["values"]
    for step, (mine, theirs) in enumerate(zip(got["steps"], want["steps"], strict=False)):
        for name in ("value_loss", "value_clipfrac", "grad_norm", "lr"):
            assert mine[name] == pytest.approx(theirs[name], abs=TOLERANCE["metrics"], rel=1e-4), (step, name)
    assert (
        len(want["steps"]) == COMPARED_STEPS
        and want["steps"][-1]["value_loss"] < want["steps"][0]["value_loss"]
    )


def _torch_critic(model: Path) -> dict[str, Any]:
    from runtime.devices import Device
    from runtime.train.critic import TorchCriticBackend

    torch.set_num_threads(1)
    critic = TorchCriticBackend(str(model), _config(), device=Device.detect())
    batch = _batch()
    weight, bias = _head(critic.model.value_head.in_features)
    with torch.no_grad():
        critic.model.value_head.weight.copy_(weight)
        critic.model.value_head.bias.copy_(bias)
    batch.values = critic.compute_values(batch)
    return {"values": batch.values, "first": critic.train_step(batch)}


def test_megatron_critic_matches_the_torch_critic_learns_and_round_trips(
    tiny: Path, tmp_path: Path, one_rank: dict[str, Any]
) -> None:
    from runtime.train.megatron.parallel import free_port

    out = tmp_path / "result.pt"
    ranks.spawn(_worker, (2, free_port(), str(tiny), str(out)))
    got = torch.load(out, weights_only=False)
    want = _torch_critic(tiny)
    batch = _batch()

    # a fresh critic predicts 0 (zero-initialised head): PPO's first advantages are the plain returns
    assert torch.equal(got["fresh"], torch.zeros_like(batch.loss_mask))
    # the same weights: the same values (column t = V(tokens[:t]), zero outside the response)
    assert got["values"].shape == want["values"].shape
    assert float((got["values"] - want["values"]).abs().max()) < TOLERANCE["values"]
    assert float(got["values"].abs().sum()) > 0
    outside = (batch.response_mask if batch.response_mask is not None else batch.loss_mask) == 0
    assert bool((got["values"][outside] == 0).all())
    # the same first update: value loss, clip fraction, gradient norm
    first = got["steps"][0]
    for name in ("value_loss", "value_clipfrac", "grad_norm", "lr"):
        assert first[name] == pytest.approx(want["first"][name], abs=TOLERANCE["metrics"], rel=1e-4), name
    # two tensor-parallel ranks train as the one-rank critic does, step after step
    _assert_same_training(got, one_rank)
    # it learns the fixed returns
    losses = [step["value_loss"] for step in got["steps"]]
    assert losses[-1] < 0.5 * losses[0], losses
    # torch_dist round trip, the value head included
    assert got["record"] == str(tmp_path / "save" / "critic" / "iter_0000003")
    assert (tmp_path / "save" / "critic" / "iter_0000003" / "critic_state.json").is_file()
    assert float((got["moved"] - got["saved"]).abs().max()) > 1e-4
    assert got["iteration"] == 3 and got["optimizer_steps"] == 2 * STEPS
    assert torch.equal(got["loaded"], got["saved"])


def test_a_critic_on_two_data_parallel_ranks_matches_the_one_rank_critic(
    tiny: Path, tmp_path: Path, one_rank: dict[str, Any]
) -> None:
    """A critic entry of two devices in a TP=1 job: two ranks, each with half of every optimizer step's
    samples (and of the values), gradients averaged by megatron's DDP: the one-rank critic's values, losses
    and gradient norms over `COMPARED_STEPS` steps, and its values after them."""
    from runtime.train.megatron.parallel import free_port

    out = tmp_path / "result.pt"
    ranks.spawn(_steps_worker, (2, free_port(), str(tiny), str(out), {}))
    got = torch.load(out, weights_only=False)
    assert got["layout"] == (1, 2)  # tp 1, dp 2
    _assert_same_training(got, one_rank)
    assert float((got["trained"] - one_rank["trained"]).abs().max()) < TOLERANCE["values"]
    assert float((got["trained"] - got["values"]).abs().max()) > 1e-3  # it trained


def test_a_megatron_ppo_job_plans_its_critic_in_the_jobs_layout_or_on_one_rank(tiny: Path) -> None:
    """`train-backend megatron`: the critic role runs `MegatronCriticBackend` with the spec's values; a critic
    of one device is one rank (whatever model-parallel sizes the values name are set to 1 for it), one of
    several devices splits the model as the job's values say; under the torch backend it stays the torch
    critic, in one process."""
    from runtime.pipeline import critic_plan
    from runtime.spec import load_spec
    from runtime.train.megatron.critic import critic_context
    from runtime.train.megatron.parallel import ParallelLayout

    raw = {
        "train-backend": "megatron",
        "hf-checkpoint": str(tiny),
        "prompt-data": "unused.jsonl",
        "rollout-batch-size": 4,
        "num-rollout": 1,
        "rm-type": "math",
        "colocate": True,
        "advantage-estimator": "ppo",
        "resource": {"actor": [1, 1], "critic": [1, 1], "rollout": [1, 1], "advantages": [1, 0]},
    }
    plan = critic_plan(load_spec(raw), 1, str(tiny))
    assert plan is not None and plan.backend == "megatron" and plan.hf_checkpoint == str(tiny)
    assert plan.values["hf_checkpoint"] == str(tiny) and plan.world == 1
    tp2 = {**plan.values, "tensor_model_parallel_size": 2, "sequence_parallel": True}
    alone = critic_context(0, 1, "127.0.0.1", 1, tp2)
    layout = ParallelLayout.from_values(alone.values, 1)
    assert (layout.tp, layout.pp, layout.dp, layout.sequence_parallel) == (1, 1, 1, False)
    ranked = critic_context(1, 4, "127.0.0.1", 1, tp2)
    assert ranked.rank == 1 and ranked.values == tp2
    layout = ParallelLayout.from_values(ranked.values, 4)
    assert (layout.tp, layout.dp, layout.sequence_parallel) == (2, 2, True)
    torch_plan = critic_plan(load_spec({**raw, "train-backend": "torch"}), 1, str(tiny))
    assert torch_plan is not None and torch_plan.backend == "torch" and torch_plan.values == {}
    assert torch_plan.world is None
