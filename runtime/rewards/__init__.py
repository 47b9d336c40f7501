"""Reward stage: scores samples with the built-in rule by `rm-type`, or a user function by dotted path."""

from __future__ import annotations

from runtime.plugins import RewardFn, load_object
from runtime.rewards.rules import BOXED_PREFIX, RULE_REWARDS, RewardType, rule_reward
from runtime.types import Sample

__all__ = ["BOXED_PREFIX", "RULE_REWARDS", "RewardScorer", "RewardType", "rule_reward"]


class RewardScorer:
    """Scores samples in place. Precedence: `custom-rm-path` > the sample's metadata ``rm_type`` > `rm-type`."""

    def __init__(self, rm_type: str | None, custom_rm_path: str | None = None) -> None:
        self.rm_type = rm_type
        self.custom: RewardFn | None = load_object(custom_rm_path) if custom_rm_path else None
        if self.custom is None and rm_type:
            self._check(rm_type)

    @staticmethod
    def _check(rm_type: str) -> None:
        RULE_REWARDS.get(rm_type.removeprefix(BOXED_PREFIX))  # raises with the valid names

    def score(self, samples: list[Sample]) -> list[float]:
        for sample in samples:
            sample.reward = self._score_one(sample)
        return [float(s.reward) for s in samples]  # type: ignore[arg-type]

    def _score_one(self, sample: Sample) -> float:
        if self.custom is not None:
            value = self.custom(sample)
            return float(value) if value is not None else 0.0
        rm_type = (
            sample.metadata.get("rm_type") if isinstance(sample.metadata, dict) else None
        ) or self.rm_type
        if not rm_type:
            raise ValueError("no reward: set rm-type (or custom-rm-path, or metadata.rm_type on the samples)")
        return rule_reward(rm_type, sample.response, sample.label)
