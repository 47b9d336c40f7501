"""Reward stage: built-in rule rewards by `rm-type`, a remote reward model over HTTP, and user hooks by path.

The pipeline builds one `RewardModel.from_spec(spec)` per job and calls ``.score(samples, eval_mode=...)``.
"""

from __future__ import annotations

from runtime.rewards.hooks import RewardHookError, SpecArgs
from runtime.rewards.model import (
    REWARD_DETAIL_KEY,
    RewardConfig,
    RewardModel,
    RewardScorer,
    RewardValueError,
    reward_scalar,
)
from runtime.rewards.remote import RemoteRewardError, RetryPolicy
from runtime.rewards.routing import MissingRewardType, UnsupportedRewardType, known_rm_types
from runtime.rewards.rules import (
    BOXED_PREFIX,
    REMOTE_RM,
    RULE_REWARDS,
    UNSUPPORTED_RM_TYPES,
    RewardType,
    RewardValue,
    rule_reward,
)

# The spec parameters this package implements (for the capability table).
REWARD_PARAMETERS = frozenset(RewardConfig.__dataclass_fields__)

__all__ = [
    "BOXED_PREFIX",
    "REMOTE_RM",
    "REWARD_DETAIL_KEY",
    "REWARD_PARAMETERS",
    "RULE_REWARDS",
    "UNSUPPORTED_RM_TYPES",
    "MissingRewardType",
    "RemoteRewardError",
    "RetryPolicy",
    "RewardConfig",
    "RewardHookError",
    "RewardModel",
    "RewardScorer",
    "RewardType",
    "RewardValue",
    "RewardValueError",
    "SpecArgs",
    "UnsupportedRewardType",
    "known_rm_types",
    "reward_scalar",
    "rule_reward",
]
