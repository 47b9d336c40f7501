"""Sample -> RolloutBatch alignment, trimming and micro-batching."""

from __future__ import annotations

import pytest
import torch

from runtime.types import RolloutBatch, Sample


def _samples() -> list[Sample]:
    return [
        Sample(
            index=0,
            group_index=0,
            prompt="a",
            tokens=[5, 6, 7, 8],
            response_length=2,
            rollout_log_probs=[-0.1, -0.2],
            reward=1.0,
        ),
        Sample(
            index=1,
            group_index=0,
            prompt="a",
            tokens=[5, 6, 9],
            response_length=1,
            rollout_log_probs=[-0.3],
            reward=0.0,
        ),
        Sample(
            index=2,
            group_index=1,
            prompt="bb",
            tokens=[4, 4, 4, 1, 2, 3],
            response_length=3,
            rollout_log_probs=[-1.0, -2.0, -3.0],
            loss_mask=[1, 0, 1],
            reward=0.5,
        ),
    ]


def test_from_samples_aligns_response_tensors_with_tokens() -> None:
    batch = RolloutBatch.from_samples(_samples(), pad_token_id=0)
    assert batch.tokens.shape == (3, 6)
    assert batch.tokens[1].tolist() == [5, 6, 9, 0, 0, 0]
    assert batch.attention_mask[1].tolist() == [1, 1, 1, 0, 0, 0]
    assert batch.loss_mask[0].tolist() == [0, 0, 1, 1, 0, 0]
    assert batch.loss_mask[2].tolist() == [0, 0, 0, 1, 0, 1]
    assert batch.rollout_log_probs[2, 3:].tolist() == pytest.approx([-1.0, -2.0, -3.0])
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5]
    assert batch.group_index.tolist() == [0, 0, 1]
    assert batch.num_tokens == 13


def test_select_trims_padding_and_micro_batches_cover_the_batch() -> None:
    batch = RolloutBatch.from_samples(_samples(), pad_token_id=0)
    sub = batch.select(slice(0, 2))
    assert sub.tokens.shape == (2, 4)
    parts = batch.micro_batches(2)
    assert [p.batch_size for p in parts] == [2, 1]
    budget = batch.token_budget_batches(7)
    assert [p.batch_size for p in budget] == [2, 1]  # 4 + 3 tokens fit, the next 6 do not
    assert sum(p.batch_size for p in batch.token_budget_batches(1)) == 3  # oversize samples go alone
    assert torch.equal(torch.cat([p.rewards for p in parts]), batch.rewards)


def test_loss_mask_length_is_checked() -> None:
    bad = Sample(index=0, group_index=0, prompt="a", tokens=[1, 2], response_length=1, loss_mask=[1, 1])
    with pytest.raises(ValueError, match="loss_mask"):
        RolloutBatch.from_samples([bad], pad_token_id=0)
