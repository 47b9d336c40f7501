"""Built-in rule-based rewards, registered under their Relax `rm-type` names; pure functions of text."""

from __future__ import annotations

import re
import string
import zlib
from collections import Counter
from enum import StrEnum

from runtime.registry import Registry
from runtime.rewards.answers import answers_match, extract_answer_line, extract_boxed


class RewardType(StrEnum):
    MATH = (
        "math"  # 1 if the last \boxed{} answer equals the label (numerically when both are numbers), else 0
    )
    DEEPSCALER = "deepscaler"  # like math, but only the text after </think> counts; no </think> scores 0
    DAPO = "dapo"  # +1 if the last "Answer: X" line matches the label, else -1 (DAPO's signed reward)
    F1 = "f1"  # token-level F1 between response and label (SQuAD normalization)
    RANDOM = "random"  # 0 or 1, a deterministic hash of the response; for smoke tests only


BOXED_PREFIX = "boxed_"  # rm-type "boxed_<name>": grade only the \boxed{} content with reward <name>

RULE_REWARDS: Registry = Registry("rm-type")


@RULE_REWARDS.register(RewardType.MATH)
def math_reward(response: str, label: str | None) -> float:
    r"""1.0 when the last boxed answer of `response` equals `label` (itself boxed or bare), else 0.0.

    >>> math_reward(r"3 + 5 = \boxed{8}", "8"), math_reward(r"\boxed{9}", "8"), math_reward("8", "8")
    (1.0, 0.0, 0.0)
    >>> math_reward(r"\boxed{0.5}", r"\boxed{\frac{1}{2}}")
    1.0
    """
    if label is None:
        return 0.0
    expected = extract_boxed(label) if "\\boxed" in label else label
    return 1.0 if answers_match(extract_boxed(response), expected) else 0.0


@RULE_REWARDS.register(RewardType.DEEPSCALER)
def deepscaler_reward(response: str, label: str | None) -> float:
    r"""`math_reward` on the part of `response` after the reasoning (``</think>`` or ``###Response``).

    >>> deepscaler_reward(r"<think>hmm</think> \boxed{4}", "4"), deepscaler_reward(r"\boxed{4}", "4")
    (1.0, 0.0)
    """
    for marker in ("</think>", "###Response"):
        if marker in response:
            return math_reward(response.split(marker)[-1], label)
    return 0.0


@RULE_REWARDS.register(RewardType.DAPO)
def dapo_reward(response: str, label: str | None) -> float:
    """+1.0 when the last ``Answer:`` line matches `label`, else -1.0.

    >>> dapo_reward("Let me see. Answer: 12", "12"), dapo_reward("Answer: 13", "12"), dapo_reward("12", "12")
    (1.0, -1.0, -1.0)
    """
    return 1.0 if answers_match(extract_answer_line(response), label) else -1.0


def _f1_tokens(text: str) -> list[str]:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return text.split()


@RULE_REWARDS.register(RewardType.F1)
def f1_reward(response: str, label: str | None) -> float:
    """Token-level F1 between `response` and `label` after lowercasing and dropping punctuation/articles.

    >>> f1_reward("The cat sat", "a cat sat down")
    0.8
    >>> f1_reward("dog", "cat")
    0.0
    """
    pred, gold = _f1_tokens(response), _f1_tokens(label or "")
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


@RULE_REWARDS.register(RewardType.RANDOM)
def random_reward(response: str, label: str | None) -> float:
    """0.0 or 1.0 from a hash of `response` (deterministic, so runs are reproducible).

    >>> random_reward("abc", None) in (0.0, 1.0)
    True
    """
    return float(zlib.crc32(response.encode("utf-8")) % 2)


def rule_reward(rm_type: str, response: str, label: str | None) -> float:
    """Dispatch on an rm-type name, honouring the ``boxed_`` prefix.

    >>> rule_reward("boxed_f1", r"it is \\boxed{blue sky}", "blue sky")
    1.0
    """
    if rm_type.startswith(BOXED_PREFIX):
        response = extract_boxed(response) or ""
        rm_type = rm_type[len(BOXED_PREFIX) :]
    return float(RULE_REWARDS.get(rm_type)(response, label))
