"""Rule-based rewards: doctests, dispatch by rm-type, precedence."""

from __future__ import annotations

import doctest

import pytest

import runtime.rewards.answers
import runtime.rewards.rules
from runtime.registry import UnknownNameError
from runtime.rewards import RewardScorer
from runtime.types import Sample


@pytest.mark.parametrize("module", [runtime.rewards.answers, runtime.rewards.rules])
def test_doctests(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def _sample(response: str, label: str | None, **metadata) -> Sample:
    return Sample(index=0, group_index=0, prompt="q", label=label, response=response, metadata=metadata)


def test_math_reward_grades_the_boxed_answer() -> None:
    scorer = RewardScorer("math")
    samples = [_sample(r"\boxed{19}<|endoftext|>", "19"), _sample(r"\boxed{18}", "19"), _sample("19", "19")]
    assert scorer.score(samples) == [1.0, 0.0, 0.0]
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0]


def test_boxed_prefix_and_metadata_override() -> None:
    assert RewardScorer("boxed_f1").score([_sample(r"x \boxed{red fox}", "red fox")]) == [1.0]
    # the sample's own rm_type wins over the spec's
    assert RewardScorer("math").score([_sample("Answer: 7", "7", rm_type="dapo")]) == [1.0]


def test_unknown_rm_type_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError, match="math"):
        RewardScorer("nope")


def test_custom_reward_path_takes_precedence() -> None:
    scorer = RewardScorer("math", custom_rm_path="tests.unit.runtime.test_rewards.length_reward")
    assert scorer.score([_sample("abcd", "x")]) == [4.0]


def length_reward(sample: Sample) -> float:
    return float(len(sample.response))
