"""Per-token loss (`calculate-per-token-loss`) over micro-batches with a fully masked sample (issue 17, item 4).

Relax divides the step's summed token loss by sum_i max(tokens_i, 1): a sample with no trained token counts as
one. A backend that splits the step into micro-batches keeps that normaliser only when it weighs each
micro-batch by token_count(micro) / token_count(step), not by its raw `loss_mask.sum()` share. The step here:
four samples of 4 prompt and 3 response tokens, trained tokens (and their advantages or returns)

    micro-batch 1: S0 [1, 2, 3]  S1 [4, -, -]        (4 tokens)
    micro-batch 2: S2 [-, -, -]  S3 [5, 6, -]        (0 + 2 tokens; S2 counts 1: 3)

so Relax's normaliser is 3 + 1 + 1 + 2 = 7 (the raw mask has 6 tokens). At ratio 1 (old log-probs = current)
the PPO token loss is -A, so the step's per-token loss is -(1 + 2 + 3 + 4 + 5 + 6) / 7 = -3; the raw weighting
gave 4/6 * (-10/4) + 2/6 * (-11/3) = -2.889. Its gradient is that of -sum(A * log pi) / 7 on one batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.algos.losses import LossConfig, token_log_probs
from runtime.train.schedule import LRSchedule
from runtime.types import RolloutBatch, Sample

PROMPT, RESPONSE = 4, 3
MASKS = [[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]]
VALUES = [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [0.0, 0.0, 0.0], [5.0, 6.0, 0.0]]  # advantages, or returns
RELAX_TOKENS = 3 + 1 + 1 + 2  # the fully masked S2 counts one
RELAX_LOSS = -(1 + 2 + 3 + 4 + 5 + 6) / RELAX_TOKENS  # -3


def _batch() -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(
            i,
            i // 2,
            "p",
            tokens=torch.randint(3, 300, (PROMPT + RESPONSE,), generator=g).tolist(),
            response_length=RESPONSE,
            rollout_log_probs=[-1.0] * RESPONSE,
            loss_mask=MASKS[i],
        )
        for i in range(len(MASKS))
    ]
    batch = RolloutBatch.from_samples(samples, 0)
    per_token = torch.zeros(batch.tokens.shape)
    per_token[:, PROMPT:] = torch.tensor(VALUES)
    batch.advantages = per_token
    return batch


def _relax_gradient(model: torch.nn.Module, batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """The gradient of Relax's one-batch loss at ratio 1, -sum(A * log pi over trained tokens) / 7, on `model`
    (its gradients cleared again)."""
    from runtime.train.torch_backend import position_ids_for

    model.zero_grad(set_to_none=True)
    mask = batch.attention_mask
    logits = model(input_ids=batch.tokens, attention_mask=mask, position_ids=position_ids_for(mask)).logits
    log_probs = token_log_probs(logits, batch.tokens, 1.0)
    (-(batch.advantages * batch.loss_mask * log_probs).sum() / RELAX_TOKENS).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values())))


def test_micro_batch_weight_counts_a_fully_masked_sample_as_one_token() -> None:
    from runtime.train.torch_backend import micro_batch_weight

    batch = _batch()
    first, second = batch.micro_batches(2)
    assert micro_batch_weight(first, batch, per_token_loss=True) == pytest.approx(4 / 7)
    assert micro_batch_weight(second, batch, per_token_loss=True) == pytest.approx(3 / 7)  # not 2/6
    assert micro_batch_weight(second, batch, per_token_loss=False) == 2 / 4  # per-sample: unchanged


def _capture_gradients(backend: Any) -> dict[str, torch.Tensor]:
    """Record the accumulated gradients at the optimizer step (before clipping) of `backend.train_step`."""
    captured: dict[str, torch.Tensor] = {}
    step = backend._clip_and_step

    def capture() -> float:
        captured.update(
            {n: p.grad.detach().clone() for n, p in backend.model.named_parameters() if p.grad is not None}
        )
        return step()

    backend._clip_and_step = capture
    return captured


def test_torch_backend_step_of_two_micro_batches_gives_relax_loss_and_gradient(tiny_model: Path) -> None:
    from runtime.devices import Device
    from runtime.train.torch_backend import TorchTrainBackend, TrainConfig

    config = TrainConfig(
        lr_schedule=LRSchedule(lr=1e-3), micro_batch_size=2, loss=LossConfig(per_token_loss=True)
    )
    backend = TorchTrainBackend(str(tiny_model), config, device=Device.detect())
    batch = backend.compute_log_probs(_batch())  # old log-probs = current: ratio 1, token loss -A
    want = _relax_gradient(backend.model, batch)
    got = _capture_gradients(backend)
    metrics = backend.train_step(batch)
    assert metrics["loss"] == pytest.approx(RELAX_LOSS, abs=1e-5)  # -3 (the raw weighting: -2.889)
    assert metrics["pg_loss"] == pytest.approx(-3.0, abs=1e-5)
    assert got.keys() == want.keys()
    scale = max(float(g.abs().max()) for g in want.values())
    worst = max(float((got[n] - want[n]).abs().max()) for n in want)
    assert worst < 1e-5 * scale, (worst, scale)
    assert metrics["grad_norm"] == pytest.approx(_norm(want), rel=1e-5)


def test_torch_backend_sample_mean_keeps_its_sample_weighting(tiny_model: Path) -> None:
    """Without per-token loss each sample's token mean counts once, a fully masked sample 0: S0 -2, S1 -4,
    S2 0, S3 -5.5 -> -11.5 / 4 = -2.875 (micro-batches weighted 2/4 each: (-3 - 2.75) / 2)."""
    from runtime.devices import Device
    from runtime.train.torch_backend import TorchTrainBackend, TrainConfig

    config = TrainConfig(lr_schedule=LRSchedule(lr=1e-3), micro_batch_size=2, loss=LossConfig())
    backend = TorchTrainBackend(str(tiny_model), config, device=Device.detect())
    metrics = backend.train_step(backend.compute_log_probs(_batch()))
    assert metrics["loss"] == pytest.approx(-11.5 / 4, abs=1e-5)


def test_torch_critic_step_of_two_micro_batches_gives_relax_value_loss(tiny_model: Path) -> None:
    """A fresh critic predicts 0 (zero value head), old values 0: token loss (0 - R)^2 with returns R as above.
    Relax: (1 + 4 + 9 + 16 + 25 + 36) / 7 = 13 (the raw weighting: 4/6 * 30/4 + 2/6 * 61/3 = 11.78); the value
    head's bias, on every value, gets sum 2 (0 - R) / 7 = -2 * 21 / 7 = -6."""
    from runtime.devices import Device
    from runtime.train.critic import CriticConfig, TorchCriticBackend

    config = CriticConfig(
        lr_schedule=LRSchedule(lr=1e-3), micro_batch_size=2, loss=LossConfig(per_token_loss=True)
    )
    critic = TorchCriticBackend(str(tiny_model), config, device=Device.detect())
    got = _capture_gradients(critic)
    metrics = critic.train_step(_critic_batch())
    assert metrics["value_loss"] == pytest.approx(91 / 7, abs=1e-5)
    assert got["value_head.bias"].item() == pytest.approx(-6.0, abs=1e-5)


# -- the megatron backend on CPU (gloo): two data-parallel ranks, two micro-batches each ---------------------------


def _megatron_worker(rank: int, world: int, port: int, model: str, out: str) -> None:
    torch.set_num_threads(1)
    from runtime.devices import Device
    from runtime.train.base import TrainContext, train_backend_class
    from runtime.train.torch_backend import TrainConfig
    from tests.unit.runtime.test_megatron_backend import _values

    values = _values(Path(model), **{"resource": {"actor": [1, 2], "rollout": [1, 2]}})
    config = TrainConfig(
        lr_schedule=LRSchedule(lr=1e-3),
        global_batch_size=4,
        micro_batch_size=1,  # rank 0: S0 | S1, rank 1: S2 (fully masked) | S3
        loss=LossConfig(per_token_loss=True),
    )
    context = TrainContext(rank, world, "127.0.0.1", port, values)
    backend = train_backend_class("megatron")(model, config, device=Device.detect(), context=context)
    metrics = backend.train_step(backend.compute_log_probs(_batch()))
    if rank == 0:
        torch.save({"metrics": metrics, "dp": backend.dp_size}, out)


def test_megatron_data_parallel_step_gives_relax_loss_and_gradient(tiny_model: Path, tmp_path: Path) -> None:
    """Each rank weighs its micro-batches by their token count over the whole step's (7, every rank's rows),
    and DDP sums the ranks: the loss is -3 and the gradient's norm that of Relax's one-batch loss."""
    from transformers import AutoModelForCausalLM

    from runtime.train.megatron.parallel import free_port
    from tests.unit.runtime import ranks

    out = tmp_path / "result.pt"
    ranks.spawn(_megatron_worker, (2, free_port(), str(tiny_model), str(out)))
    got = torch.load(out, weights_only=False)
    assert got["dp"] == 2
    assert got["metrics"]["loss"] == pytest.approx(RELAX_LOSS, abs=1e-5)
    assert got["metrics"]["pg_loss"] == pytest.approx(-3.0, abs=1e-5)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    want = _norm(_relax_gradient(model, _batch()))
    assert got["metrics"]["grad_norm"] == pytest.approx(want, rel=1e-4)


def _critic_batch() -> RolloutBatch:
    batch = _batch()
    batch.returns, batch.advantages = batch.advantages, None
    batch.values = torch.zeros_like(batch.returns)
    return batch


def _megatron_critic_worker(rank: int, world: int, port: int, model: str, out: str) -> None:
    torch.set_num_threads(1)
    from runtime.devices import Device
    from runtime.train.base import TrainContext
    from runtime.train.critic import CriticConfig
    from runtime.train.megatron.critic import MegatronCriticBackend
    from tests.unit.runtime.test_megatron_critic import _values

    config = CriticConfig(
        lr_schedule=LRSchedule(lr=1e-3),
        global_batch_size=4,
        micro_batch_size=1,  # rank 0: S0 | S1, rank 1: S2 (fully masked) | S3
        loss=LossConfig(per_token_loss=True),
    )
    context = TrainContext(rank, world, "127.0.0.1", port, _values(Path(model)))  # DP=2
    critic = MegatronCriticBackend(model, config, device=Device.detect(), context=context)
    metrics = critic.train_step(_critic_batch())
    if rank == 0:
        torch.save({"metrics": metrics, "dp": critic.dp_size}, out)


def test_megatron_critic_data_parallel_step_gives_relax_value_loss(tiny_model: Path, tmp_path: Path) -> None:
    """The megatron critic weighs micro-batches as the policy does: value loss 91 / 7 = 13 over two ranks
    (the raw weighting: 91 / 6), and the gradient of the torch critic's step, whose value-head bias gradient
    is -6 (test_torch_critic_step_of_two_micro_batches_gives_relax_value_loss)."""
    from runtime.devices import Device
    from runtime.train.critic import CriticConfig, TorchCriticBackend
    from runtime.train.megatron.parallel import free_port
    from tests.unit.runtime import ranks

    out = tmp_path / "result.pt"
    ranks.spawn(_megatron_critic_worker, (2, free_port(), str(tiny_model), str(out)))
    got = torch.load(out, weights_only=False)
    assert got["dp"] == 2
    assert got["metrics"]["value_loss"] == pytest.approx(91 / 7, abs=1e-5)
    config = CriticConfig(
        lr_schedule=LRSchedule(lr=1e-3), micro_batch_size=2, loss=LossConfig(per_token_loss=True)
    )
    torch_critic = TorchCriticBackend(str(tiny_model), config, device=Device.detect())
    want = torch_critic.train_step(_critic_batch())["grad_norm"]
    assert got["metrics"]["grad_norm"] == pytest.approx(want, rel=1e-4)
