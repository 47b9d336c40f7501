"""The built-in engine's sampling controls (stop strings, min new tokens, per-request budgets), length
limits, and the rollout-data-postprocess hook."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.devices import Device
from runtime.rollout.engine import FinishReason, SamplingParams, TorchRolloutEngine, stop_string_end
from runtime.rollout.generate import LengthLimits
from runtime.types import Sample


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> TorchRolloutEngine:
    return TorchRolloutEngine(str(tiny_model), device=Device.detect())


def test_stop_strings_end_the_response_and_stay_in_it(engine: TorchRolloutEngine) -> None:
    tok = engine.tokenizer
    prompt = tok("1+2=", add_special_tokens=False)["input_ids"]
    free = engine.generate([prompt] * 8, SamplingParams(max_new_tokens=12, seed=3, min_new_tokens=12))
    text = tok.decode(free[0].token_ids)
    assert len(free[0].token_ids) == 12  # min_new_tokens kept EOS away
    stop = text[3:5]  # a string the unconstrained sample produces
    stopped = engine.generate(
        [prompt] * 8, SamplingParams(max_new_tokens=12, seed=3, min_new_tokens=12, stop=(stop,))
    )
    first = stopped[0]
    assert first.finish_reason is FinishReason.STOP and stop in tok.decode(first.token_ids)
    assert stop not in tok.decode(first.token_ids[:-1])  # nothing after the first occurrence
    assert len(first.log_probs) == len(first.token_ids)


def test_per_request_budgets(engine: TorchRolloutEngine) -> None:
    prompt = engine.tokenizer("3+4=", add_special_tokens=False)["input_ids"]
    results = engine.generate(
        [prompt, prompt], SamplingParams(max_new_tokens=6, seed=0, min_new_tokens=6), [2, 5]
    )
    assert [len(r.token_ids) for r in results] == [2, 5]
    assert all(r.finish_reason is FinishReason.LENGTH for r in results)
    assert engine.generate([prompt], SamplingParams(max_new_tokens=4), [0])[0].token_ids == []


def test_stop_string_end_is_the_shortest_prefix() -> None:
    class Tok:
        def decode(self, ids: list[int]) -> str:
            return "".join(chr(i) for i in ids)

    ids = [ord(c) for c in "abcSTOPdefSTOP"]
    assert stop_string_end(Tok(), ids, ["STOP"]) == 7
    assert stop_string_end(Tok(), ids, ["zzz"]) is None


def test_length_limits_take_the_context_into_account() -> None:
    sample = Sample(0, 0, "p", tokens=[1] * 10, response_length=3)
    assert LengthLimits(8).budget(sample) == 5
    assert LengthLimits(8, max_context_len=12).budget(sample) == 2
    assert LengthLimits(8, max_context_len=9).budget(sample) == 0


def test_rollout_data_postprocess_hook_edits_the_batch(tmp_path: Path) -> None:
    from runtime.pipeline import RLPipeline
    from runtime.reporter import LocalReporter
    from runtime.roles.groups import Roles
    from runtime.rollout.context import RolloutOutput
    from runtime.rollout.sources import LoadedRollout
    from runtime.saving import CheckpointManager
    from runtime.spec import RuntimeSpec
    from runtime.weight_sync import WeightSyncBackend, create_weight_sync
    from tests.unit.runtime.fakes import CharTokenizer

    def mask_first_token(samples: list[Sample], batch):  # type: ignore[no-untyped-def]
        first = (batch.loss_mask.cumsum(-1) == 1) & (batch.loss_mask > 0)
        batch.loss_mask = batch.loss_mask.masked_fill(first, 0.0)

    spec = RuntimeSpec()
    reporter = LocalReporter(tmp_path)
    try:
        pipeline = RLPipeline(
            spec=spec,
            reporter=reporter,
            tokenizer=CharTokenizer(),
            roles=Roles(topology=None, placement_groups={}, train=None, rollout=None),  # type: ignore[arg-type]
            total_rollouts=1,
            checkpoints=CheckpointManager(spec, reporter, None),
            weight_sync=create_weight_sync(WeightSyncBackend.OBJECT_STORE),
            relay=None,
            source=LoadedRollout(str(tmp_path / "{rollout_id}.pt"), subsample=None, seed=0),
            generation=None,
            reward=None,
            postprocess=mask_first_token,
        )
        samples = [Sample(0, 0, "p", tokens=[5, 6, 7, 8], response_length=3, reward=1.0)]
        batch = pipeline.log_probs(RolloutOutput(groups=[samples]))
        assert batch.loss_mask.tolist() == [[0.0, 0.0, 1.0, 1.0]]
    finally:
        reporter.close()


def test_no_save_optim_leaves_the_optimizer_out(tiny_model: Path, tmp_path: Path) -> None:
    from runtime.train.checkpoint import iteration_dir
    from runtime.train.torch_backend import TorchTrainBackend, TrainConfig

    backend = TorchTrainBackend(str(tiny_model), TrainConfig(save_optimizer=False), device=Device.detect())
    backend.save_checkpoint(str(tmp_path), 2, {})
    assert not (iteration_dir(tmp_path, 2) / "optimizer.pt").exists()
    assert (iteration_dir(tmp_path, 2) / "model").is_dir()
    assert torch.get_num_threads() >= 1
