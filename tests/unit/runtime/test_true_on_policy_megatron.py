"""True-on-policy mode on the megatron backend (CPU, gloo, two data-parallel ranks): a step whose batch has no
old log-probs (the trainer was not asked for them) takes each micro-batch's forward log-probs, detached, as
pi_old, and leaves the weights where the step with the recompute leaves them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.runtime import ranks
from tests.unit.runtime.test_megatron_backend import _batch, _config, _values

DP2 = {"resource": {"actor": [1, 2], "rollout": [1, 2]}}


def _worker(rank: int, world: int, port: int, model: str, out: str) -> None:
    torch.set_num_threads(1)
    from runtime.devices import Device
    from runtime.train.base import TrainContext, train_backend_class
    from runtime.train.megatron.parallel import destroy_parallel

    context = TrainContext(rank, world, "127.0.0.1", port, _values(Path(model), **DP2))
    result: dict[str, Any] = {}
    for from_forward in (False, True):
        # one optimizer step over the 8 samples (the mode's condition), micro-batches of 2 on each rank
        config = dataclasses.replace(_config(), global_batch_size=8, old_log_probs_from_forward=from_forward)
        backend = train_backend_class("megatron")(
            model, config, device=Device.detect(), need_ref=True, context=context
        )
        result["initial"] = backend.named_weights()
        batch = backend.compute_log_probs(_batch(), old=not from_forward)
        result[f"old_{from_forward}"] = batch.old_log_probs
        result[f"metrics_{from_forward}"] = backend.train_step(batch)
        result[f"weights_{from_forward}"] = backend.named_weights()
        destroy_parallel(process_group=False)
    if rank == 0:
        torch.save(result, out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runtime.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny", seed=0)


def test_the_train_forward_is_pi_old_and_the_update_is_the_recomputes(tiny: Path, tmp_path: Path) -> None:
    from runtime.train.megatron.parallel import free_port

    out = tmp_path / "result.pt"
    ranks.spawn(_worker, (2, free_port(), str(tiny), str(out)))
    result = torch.load(out, weights_only=False)
    assert result["old_True"] is None and result["old_False"] is not None
    got, want = result["metrics_True"], result["metrics_False"]
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-5, rel=1e-4), name
    assert got["ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    after, recomputed = result["weights_True"], result["weights_False"]
    assert after.keys() == recomputed.keys()
    assert max(float((after[k] - result["initial"][k]).abs().max()) for k in after) > 1e-4
    worst = max(float((after[k] - recomputed[k]).abs().max()) for k in recomputed)
    assert worst < 1e-5, worst
