"""Built-in rule rewards: doctests, a positive and a negative case per rm-type, boxes, real GSM8K rows."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from typing import Any

import pytest

import runtime.rewards.answers
import runtime.rewards.hooks
import runtime.rewards.model
import runtime.rewards.remote
import runtime.rewards.routing
import runtime.rewards.rules
from runtime.registry import UnknownNameError
from runtime.rewards import RULE_REWARDS, rule_reward
from runtime.rewards.answers import extract_boxed, extract_choice, extract_final_number

GSM8K_ROWS = Path(__file__).parent / "data" / "gsm8k_test_rows.jsonl"  # provenance: data/README.md


@pytest.mark.parametrize(
    "module",
    [
        runtime.rewards.answers,
        runtime.rewards.rules,
        runtime.rewards.remote,
        runtime.rewards.hooks,
        runtime.rewards.routing,
        runtime.rewards.model,
    ],
)
def test_doctests(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


# rm-type -> (response, label, metadata) that scores the maximum, and one that does not.
CASES: dict[str, tuple[tuple[str, Any, dict], tuple[str, Any, dict], float, float]] = {
    "math": ((r"so \boxed{\frac{1}{2}}", "0.5", {}), (r"\boxed{2}", "0.5", {}), 1.0, 0.0),
    "deepscaler": ((r"<think>4?</think> \boxed{4}", "4", {}), (r"\boxed{4}", "4", {}), 1.0, 0.0),
    "dapo": (("so... Answer: 1,000", "1000", {}), ("Answer: 999", "1000", {}), 1.0, -1.0),
    "f1": (("the red fox", "red fox", {}), ("blue whale", "red fox", {}), 1.0, 0.0),
    "random": (("a", None, {}), ("d", None, {}), 1.0, 0.0),
    "dummy": (("anything", "x", {}), ("", None, {}), 0.0, 0.0),
    "gsm8k": (
        ("... The answer is $1,200.", "#### 1200", {}),
        ("The answer is 12", "#### 1200", {}),
        1.0,
        0.0,
    ),
    "exact_match": (("  Paris. ", "paris", {}), ("Paris, France", "Paris", {}), 1.0, 0.0),
    "multiple_choice": (("The answer is (B).", "<answer>B</answer>", {}), ("Answer: C", "B", {}), 1.0, 0.0),
    "gpqa": (
        ("<think>A or C</think>Final answer: C", "6", {"choices": ["4", "5", "6"]}),
        ("Final answer: A", "6", {"choices": ["4", "5", "6"]}),
        1.0,
        0.0,
    ),
    "geo3k": (
        (r"<think>r=3</think> d = \boxed{6}", {"ground_truth": "6"}, {}),
        (r"<think>r=3</think> d = \boxed{5}", {"ground_truth": "6"}, {}),
        1.0,
        0.1,
    ),
    "openr1mm": (
        ("<think>..</think><answer>1/2</answer>", "<answer>0.5</answer>", {}),
        ("<answer>2</answer>", "0.5", {}),
        1.0,
        0.0,
    ),
    "mopd": (("Answer: 42", "#### 42", {"data_source": "gsm8k"}), ("Answer: 41", "#### 42", {}), 1.0, -1.0),
}


def test_every_registered_rule_has_cases() -> None:
    assert sorted(CASES) == RULE_REWARDS.names()


@pytest.mark.parametrize("rm_type", sorted(CASES))
def test_rule_scores_its_positive_and_negative_case(rm_type: str) -> None:
    (good, bad, best, worst) = CASES[rm_type]

    def scalar(case: tuple[str, Any, dict]) -> float:
        value = rule_reward(rm_type, *case)
        return float(value["score"]) if isinstance(value, dict) else float(value)

    assert scalar(good) == pytest.approx(best)
    assert scalar(bad) == pytest.approx(worst)


def test_boxed_extraction_handles_nesting_escapes_and_truncation() -> None:
    assert extract_boxed(r"\boxed{\frac{\sqrt{2}}{2}} then \boxed{\left\{ 1, \{2\} \right\}}") == (
        r"\left\{ 1, \{2\} \right\}"
    )
    assert extract_boxed(r"\boxed{a{b{c}}d} trailing") == "a{b{c}}d"
    assert extract_boxed(r"\fbox{7}") == "7"
    assert extract_boxed(r"\boxed{12") is None  # cut off: no answer rather than a wrong one


@pytest.mark.parametrize(
    ("rm_type", "response", "label", "expected"),
    [
        ("boxed_math", r"\boxed{\dfrac{3}{4}}", "0.75", 1.0),  # math grades the box itself: same as math
        ("boxed_exact_match", r"so the city is \boxed{\text{Paris}} indeed", r"\text{Paris}", 1.0),
        ("boxed_exact_match", r"Paris \boxed{Rome}", "Paris", 0.0),  # only the box is graded
        ("boxed_f1", r"blah \boxed{big {red} fox}", "big red fox", 1.0),
        ("boxed_gsm8k", r"12 apples... \boxed{7}", "7", 1.0),
        ("boxed_multiple_choice", r"A is tempting, but \boxed{(D)}", "D", 1.0),
        ("boxed_exact_match", "no box at all", "no box at all", 0.0),
    ],
)
def test_boxed_prefix_grades_the_last_box(rm_type: str, response: str, label: str, expected: float) -> None:
    assert rule_reward(rm_type, response, label) == expected


def test_unknown_rule_lists_names() -> None:
    with pytest.raises(UnknownNameError, match="gsm8k"):
        rule_reward("nope", "x", "y")


def _gsm8k_rows() -> list[dict[str, str]]:
    return [json.loads(line) for line in GSM8K_ROWS.read_text(encoding="utf-8").splitlines()]


def test_gsm8k_real_rows_final_number_matches_the_label() -> None:
    rows = _gsm8k_rows()
    assert len(rows) == 11
    for row in rows:
        label = row["answer"]
        final = label.rsplit("####", 1)[1].strip()
        steps = label.rsplit("####", 1)[0].strip()  # the worked solution, with its <<a*b=c>> annotations
        assert rule_reward("gsm8k", f"{steps}\nThe answer is {final}.", label) == 1.0, row["question"]
        plain = final.replace(",", "")
        assert rule_reward("gsm8k", f"{steps}\nThe answer is {plain}.<|im_end|>", label) == 1.0
        assert rule_reward("gsm8k", label, label) == 1.0  # a response in the label's own format
        wrong = str(int(plain) + 1)
        assert rule_reward("gsm8k", f"{steps}\nThe answer is {wrong}.", label) == 0.0, row["question"]


def test_gsm8k_extraction_prefers_the_stated_answer_over_the_last_number() -> None:
    assert extract_final_number("The answer is 18. Check: 18 - 2 = 16") == "18"
    assert extract_final_number("Total: 5 + 4 = 9 apples") == "9"
    assert extract_final_number("He owes \u22123 dollars, so the final answer is: -3") == "-3"
    assert rule_reward("gsm8k", "The answer is 2,125.0", "#### 2,125") == 1.0
    assert rule_reward("gsm8k", "The answer is 3/4", "0.75") == 1.0
    assert rule_reward("gsm8k", "I don't know", "#### 3") == 0.0


@pytest.mark.parametrize(
    ("response", "letter"),
    [
        ("<answer>C</answer>", "C"),
        ("<answer>(c) 42</answer>", "C"),
        (r"Therefore \boxed{B}.", "B"),
        ("The correct answer is (J).", "J"),
        ("**Answer:** D", "D"),
        ("Answer: Option A", "A"),
        ("E", "E"),
        ("<think>The answer is A.</think>The answer is B.", "B"),
        ("Among (A) and (B), I pick (B)", "B"),
        ("Answer: (b)", "B"),
        ("**B**", "B"),
        ("I think (A) is wrong; the answer is B", "B"),
        ("A bat and a ball cost $1.10.", None),
        ("The answer is a bit unclear", None),
        ("The answer is K.", None),  # only A-J
    ],
)
def test_multiple_choice_letter_extraction(response: str, letter: str | None) -> None:
    assert extract_choice(response) == letter
