"""Dynamic sampling filters (`dynamic-sampling-filter-path`): keep or drop a scored prompt group."""

from __future__ import annotations

import numpy as np

from runtime.plugins import DynamicSamplingFilterFn, FilterVerdict
from runtime.types import Sample


def check_reward_nonzero_std(group: list[Sample]) -> FilterVerdict:
    """Drop groups whose rewards are all equal (no GRPO signal, as in DAPO): the reason is
    `zero_std_<reward rounded to 0.1>`, counted as `rollout/dynamic_filter/drop_zero_std_<r>`.

    Rewards are compared in float32, where `min == max` and `std == 0` agree.

    >>> g = [Sample(0, 0, "p", reward=1.0), Sample(1, 0, "p", reward=1.0)]
    >>> check_reward_nonzero_std(g)
    FilterVerdict(keep=False, reason='zero_std_1.0')
    >>> g[1].reward = 0.0
    >>> check_reward_nonzero_std(g).keep
    True
    """
    rewards = np.asarray([float(s.reward or 0.0) for s in group], dtype=np.float32)
    if rewards.size and rewards.min() != rewards.max():
        return FilterVerdict(keep=True)
    return FilterVerdict(keep=False, reason=f"zero_std_{round(float(rewards[0]), 1)}")


def apply_filter(fn: DynamicSamplingFilterFn | None, group: list[Sample]) -> FilterVerdict:
    """Run a filter; a bare bool (the legacy form) becomes a verdict without a reason."""
    if fn is None:
        return FilterVerdict(keep=True)
    verdict = fn(group)
    return verdict if isinstance(verdict, FilterVerdict) else FilterVerdict(keep=bool(verdict))
