"""The `rollout/*` metrics of one rollout, from its samples and batch."""

from __future__ import annotations

from collections import defaultdict

import torch

from runtime.types import RolloutBatch, Sample, SampleStatus


def rollout_metrics(samples: list[Sample], batch: RolloutBatch | None = None) -> dict[str, float]:
    """rollout/reward (mean raw reward), reward_std, response_len (mean tokens), response_len_max,
    truncated_ratio, zero_std_ratio (share of prompt groups whose rewards are all equal: no GRPO signal),
    log_prob (mean engine log-prob per response token), and, given the trained batch,
    logprob_abs_diff (|trainer - engine| log-prob per token: should be ~0 on-policy)."""
    rewards = torch.tensor([float(s.reward or 0.0) for s in samples])
    lengths = torch.tensor([float(s.response_length) for s in samples])
    groups: dict[int, list[float]] = defaultdict(list)
    for sample in samples:
        groups[sample.group_index].append(float(sample.reward or 0.0))
    flat_groups = sum(1 for values in groups.values() if max(values) == min(values))
    tokens = sum(len(s.rollout_log_probs) for s in samples)
    metrics = {
        "rollout/reward": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()) if len(samples) > 1 else 0.0,
        "rollout/response_len": float(lengths.mean()),
        "rollout/response_len_max": float(lengths.max()),
        "rollout/truncated_ratio": sum(s.status is SampleStatus.TRUNCATED for s in samples) / len(samples),
        "rollout/zero_std_ratio": flat_groups / len(groups),
        "rollout/log_prob": sum(sum(s.rollout_log_probs) for s in samples) / max(tokens, 1),
        "rollout/weight_version": float(max(s.weight_version for s in samples)),
    }
    if batch is not None and batch.old_log_probs is not None:
        mask = batch.loss_mask
        diff = ((batch.old_log_probs - batch.rollout_log_probs).abs() * mask).sum() / mask.sum().clamp(min=1)
        metrics["rollout/logprob_abs_diff"] = float(diff)
    return metrics
