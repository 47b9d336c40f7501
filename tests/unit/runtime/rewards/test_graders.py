"""The rewards of OpenAI's graders (runtime/rewards/graders.py), loaded by the paths the fine-tuning API puts in
`custom-rm-path` (scheduler/services/fine_tuning.py GRADER_REWARDS) and scored through the real reward stage."""

from __future__ import annotations

import pytest

from runtime.rewards import RewardModel
from runtime.types import Sample
from scheduler.services.fine_tuning import GRADER_REWARDS


def _scores(path: str, pairs: list[tuple[str, str]]) -> list[float]:
    model = RewardModel.from_spec({"custom_rm_path": path})
    samples = [
        Sample(index=i, group_index=0, prompt="q", response=r, label=label)
        for i, (r, label) in enumerate(pairs)
    ]
    return model.score(samples)


PAIRS = [("Paris", "Paris"), ("paris", "Paris"), ("It is Paris.", "Paris"), ("Rome", "Paris")]


@pytest.mark.parametrize(
    ("operation", "expected"),
    [
        ("eq", [1.0, 0.0, 0.0, 0.0]),
        ("ne", [0.0, 1.0, 1.0, 1.0]),
        ("like", [1.0, 0.0, 1.0, 0.0]),
        ("ilike", [1.0, 1.0, 1.0, 0.0]),
    ],
)
def test_string_check(operation: str, expected: list[float]) -> None:
    assert _scores(GRADER_REWARDS[("string_check", operation)], PAIRS) == expected


def test_fuzzy_match_is_a_similarity_between_0_and_1() -> None:
    same, close, far = _scores(
        GRADER_REWARDS[("text_similarity", "fuzzy_match")],
        [("Paris", "Paris"), ("Pariss", "Paris"), ("xyz", "Paris")],
    )
    assert same == 1.0 and 0.8 < close < 1.0 and far == 0.0
