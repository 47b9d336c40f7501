"""Built-in rule rewards, registered under their `rm-type` names: pure functions of (response, label[, metadata])."""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from runtime.registry import Registry
from runtime.rewards.answers import (
    CHOICE_LETTERS,
    after_reasoning,
    answers_match,
    as_answer_list,
    choice_letter,
    extract_answer_line,
    extract_boxed,
    extract_choice,
    extract_final_number,
    extract_tag,
    gsm8k_label_number,
    normalize_answer,
    normalize_text,
    parse_number,
    squad_tokens,
    strip_stop_markers,
)

# What a reward function may return: a number (bool counts as 0/1), None (scores 0), or a dict of named
# numbers from which `reward-key` picks the scalar (the dict is kept on the sample for logging).
RewardValue = float | int | bool | Mapping[str, Any] | None


class RewardType(StrEnum):
    MATH = "math"  # 1 if the last \boxed{} answer equals the label (as numbers, or normalised LaTeX), else 0
    DEEPSCALER = "deepscaler"  # like math, but only the text after </think> counts; no </think> scores 0
    DAPO = "dapo"  # {"score": +1/-1, "acc", "pred"} from the last "Answer: X" line (DAPO's signed reward)
    F1 = "f1"  # SQuAD token F1 between response and label (best over a list of labels)
    RANDOM = "random"  # 0 or 1, a deterministic hash of the response; for smoke tests only
    DUMMY = "dummy"  # always 0: the real reward comes later (custom-reward-post-process-path)
    GSM8K = "gsm8k"  # 1 if the response's final number equals the label's "#### N" (or bare) number
    EXACT_MATCH = "exact_match"  # 1 if response and label are equal after case/space/punctuation normalising
    MULTIPLE_CHOICE = "multiple_choice"  # 1 if the option letter (A-J) the response picks is the label's
    GPQA = "gpqa"  # multiple choice with the options and correct letter possibly in metadata
    GEO3K = "geo3k"  # 0.9 * math accuracy of the boxed answer + 0.1 * "<think>..</think>..\boxed{}" format
    OPENR1MM = "openr1mm"  # 1 if the <answer> content equals the label's (as math, or as text), else 0
    MOPD = "mopd"  # routes by metadata.data_source to geo3k/openr1mm/dapo/GSM8K scorers, each signed +1/-1


REMOTE_RM = "remote_rm"  # not a rule: POSTs the sample to rm-url (see runtime.rewards.remote)
BOXED_PREFIX = "boxed_"  # rm-type "boxed_<name>": grade only the last \boxed{} content with reward <name>

# Relax rm-types this platform refuses, and why (named in the error a spec or a sample using one gets).
UNSUPPORTED_RM_TYPES: dict[str, str] = {
    "ifbench": (
        "it needs the IFBench instruction checkers and their NLP dependencies (nltk, langdetect, ...), "
        "which the platform does not ship; score it behind rm-url (remote_rm) or with custom-rm-path"
    ),
    "dapo-genrm": (
        "it needs a GenRM engine (a generative judge model served inside the job, --genrm-model-path), "
        "which the platform does not run; serve the judge over HTTP and use rm-type remote_rm with rm-url"
    ),
}


@dataclass(frozen=True)
class RuleReward:
    """A registered rule: `fn(response, label)` or, with `uses_metadata`, `fn(response, label, metadata)`.

    `label_matcher`, when set, says whether a label looks like this rule's (for `rm-type-infer`).
    `grades_box`: the rule reads the response's last box itself, so the ``boxed_`` prefix changes nothing.
    """

    fn: Callable[..., RewardValue]
    uses_metadata: bool = False
    label_matcher: Callable[[Any], bool] | None = None
    grades_box: bool = False

    def __call__(self, response: str, label: Any, metadata: Mapping[str, Any] | None = None) -> RewardValue:
        if self.uses_metadata:
            return self.fn(response, label, dict(metadata or {}))
        return self.fn(response, label)


RULE_REWARDS: Registry[RuleReward] = Registry("rm-type")


def _rule(
    name: RewardType,
    *,
    uses_metadata: bool = False,
    label_matcher: Callable[[Any], bool] | None = None,
    grades_box: bool = False,
) -> Callable[[Callable[..., RewardValue]], Callable[..., RewardValue]]:
    def register(fn: Callable[..., RewardValue]) -> Callable[..., RewardValue]:
        RULE_REWARDS.register(name)(RuleReward(fn, uses_metadata, label_matcher, grades_box))
        return fn

    return register


# ---- label matchers (for rm-type-infer): conservative, a wrong inference trains on the wrong reward ---------
def looks_like_number_label(label: Any) -> bool:
    """A bare integer, decimal or simple fraction (what `math` labels usually are).

    >>> looks_like_number_label("-12"), looks_like_number_label("3/4"), looks_like_number_label("x+1")
    (True, True, False)
    """
    return isinstance(label, str) and re.fullmatch(r"-?\d+(?:\.\d+)?(?:/\d+)?", label.strip()) is not None


def looks_like_choice_label(label: Any) -> bool:
    """A single capital letter in ``<answer>`` tags.

    >>> looks_like_choice_label("<answer>C</answer>"), looks_like_choice_label("C")
    (True, False)
    """
    return isinstance(label, str) and re.fullmatch(r"\s*<answer>\s*[A-Z]\s*</answer>\s*", label) is not None


def looks_like_gsm8k_label(label: Any) -> bool:
    """A worked solution ending in ``#### <number>``.

    >>> looks_like_gsm8k_label("3 + 4 = 7\\n#### 7"), looks_like_gsm8k_label("7")
    (True, False)
    """
    return isinstance(label, str) and re.search(r"####\s*-?[\d,]+(?:\.\d+)?\s*$", label) is not None


# ---- math ---------------------------------------------------------------------------------------------------
def _label_answer(label: Any) -> str | None:
    """A math label's answer: its boxed content when boxed, else the label (dict labels: ground_truth/answer)."""
    if isinstance(label, Mapping):
        label = label.get("ground_truth") or label.get("answer")
    if label is None:
        return None
    text = str(label)
    return extract_boxed(text) if "\\boxed" in text else text


@_rule(RewardType.MATH, label_matcher=looks_like_number_label, grades_box=True)
def math_reward(response: str, label: Any) -> float:
    r"""1.0 when the last boxed answer of `response` equals `label` (itself boxed or bare), else 0.0.

    >>> math_reward(r"3 + 5 = \boxed{8}", "8"), math_reward(r"\boxed{9}", "8"), math_reward("8", "8")
    (1.0, 0.0, 0.0)
    >>> math_reward(r"\boxed{0.5}", r"\boxed{\frac{1}{2}}"), math_reward(r"\boxed{\dfrac{\sqrt3}{2}}", r"\frac{\sqrt{3}}{2}")
    (1.0, 1.0)
    """
    return 1.0 if answers_match(extract_boxed(response), _label_answer(label)) else 0.0


@_rule(RewardType.DEEPSCALER, grades_box=True)
def deepscaler_reward(response: str, label: Any) -> float:
    r"""`math_reward` on the part of `response` after the reasoning (``</think>`` or ``###Response``).

    >>> deepscaler_reward(r"<think>hmm</think> \boxed{4}", "4"), deepscaler_reward(r"\boxed{4}", "4")
    (1.0, 0.0)
    """
    for marker in ("</think>", "###Response"):
        if marker in response:
            return math_reward(response.split(marker)[-1], label)
    return 0.0


@_rule(RewardType.DAPO)
def dapo_reward(response: str, label: Any) -> dict[str, Any]:
    """``score`` +1.0 when the last ``Answer:`` line (in the last 300 characters) matches `label`, else -1.0;
    ``acc`` says whether it matched and ``pred`` is what was read. Relax's dapo reward is this dict too,
    so specs pair it with ``reward-key: score`` (the default key for dicts here).

    >>> dapo_reward("Let me see. Answer: 12", "12")
    {'score': 1.0, 'acc': True, 'pred': '12'}
    >>> dapo_reward("Answer: 13", "12")["score"], dapo_reward("12", "12")["score"]
    (-1.0, -1.0)
    """
    pred = extract_answer_line(strip_stop_markers(response))
    correct = answers_match(pred, _label_answer(label))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred or ""}


# ---- GSM8K, exact match, F1 -----------------------------------------------------------------------------------
@_rule(RewardType.GSM8K, label_matcher=looks_like_gsm8k_label)
def gsm8k_reward(response: str, label: Any) -> float:
    """1.0 when the final number of `response` (see `extract_final_number`) equals the label's final number
    (after ``####`` in a GSM8K solution, or a bare number), else 0.0. Commas, signs, decimals, fractions and
    currency are normalised: 1,200 = 1200.00 = $1200.

    >>> gsm8k_reward("She makes 9 * 2 = 18 dollars.\\nThe answer is 18.", "9 * 2 = <<9*2=18>>18\\n#### 18")
    1.0
    >>> gsm8k_reward("#### 1200.00", "#### 1,200"), gsm8k_reward("The answer is 17", "#### 18"), gsm8k_reward("", "18")
    (1.0, 0.0, 0.0)
    """
    if label is None:
        return 0.0
    expected = gsm8k_label_number(str(label))
    given = extract_final_number(response)
    if expected is None or given is None:
        return 0.0
    a, b = parse_number(given), parse_number(expected)
    return 1.0 if a is not None and a == b else 0.0


@_rule(RewardType.EXACT_MATCH)
def exact_match_reward(response: str, label: Any) -> float:
    """1.0 when `response` equals `label` (or one of a list of labels) after `normalize_text`: case,
    whitespace, surrounding quotes, ``$`` and final punctuation do not matter; anything else does.

    >>> exact_match_reward(" Paris.<|im_end|>", "paris"), exact_match_reward("Paris, France", "Paris")
    (1.0, 0.0)
    >>> exact_match_reward("NYC", ["New York", "nyc"])
    1.0
    """
    given = normalize_text(response)
    return 1.0 if any(given == normalize_text(gold) for gold in as_answer_list(label)) else 0.0


def _token_f1(pred: list[str], gold: list[str]) -> float:
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


@_rule(RewardType.F1)
def f1_reward(response: str, label: Any) -> float:
    """Token-level F1 between `response` and `label` after SQuAD normalisation (lower case, no punctuation,
    no articles); the best over a list of labels.

    >>> f1_reward("The cat sat", "a cat sat down")
    0.8
    >>> f1_reward("dog", "cat"), f1_reward("red fox<|endoftext|>", ["blue", "red fox"])
    (0.0, 1.0)
    """
    pred = squad_tokens(response)
    return max((_token_f1(pred, squad_tokens(gold)) for gold in as_answer_list(label)), default=0.0)


# ---- multiple choice ------------------------------------------------------------------------------------------
@_rule(RewardType.MULTIPLE_CHOICE, label_matcher=looks_like_choice_label)
def multiple_choice_reward(response: str, label: Any) -> float:
    r"""1.0 when the option letter (A-J) the response picks (``<answer>B</answer>``, ``\boxed{B}``, "the answer
    is (B)", "Answer: B", a bare "B") is the label's letter (``B``, ``(B)`` or ``<answer>B</answer>``). A label
    whose ``<answer>`` is not a letter is compared with the response's ``<answer>`` as text (Relax's rule).

    >>> multiple_choice_reward("<think>A? no.</think>The answer is (C).", "<answer>C</answer>")
    1.0
    >>> multiple_choice_reward(r"\boxed{B}", "C"), multiple_choice_reward("<answer>Paris</answer>", "<answer>paris</answer>")
    (0.0, 1.0)
    """
    if label is None:
        return 0.0
    text = str(label)
    expected = choice_letter(extract_tag(text) or text)
    if expected is None:
        given_tag, label_tag = extract_tag(response), extract_tag(text)
        if given_tag is None or label_tag is None:
            return 0.0
        return 1.0 if normalize_text(given_tag) == normalize_text(label_tag) else 0.0
    return 1.0 if extract_choice(response) == expected else 0.0


def _normalized_words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


@_rule(RewardType.GPQA, uses_metadata=True)
def gpqa_reward(response: str, label: Any, metadata: dict[str, Any]) -> float:
    """GPQA-style multiple choice. The correct letter is ``metadata.correct_letter``, else the label as a
    letter, an option index, or an option's text (``metadata.choices``, a list or a letter -> text dict);
    the valid letters are ``metadata.valid_letters``, else one per choice, else A-H. The response's letter
    is read as in `multiple_choice`, falling back to its last stand-alone valid capital letter; a response
    with no letter scores 1.0 when it contains the correct option's text.

    >>> meta = {"choices": ["4", "5", "6", "7"]}
    >>> gpqa_reward("Final answer: B", "5", meta), gpqa_reward("It is C", 1, meta), gpqa_reward("So, 6.", 2, meta)
    (1.0, 0.0, 1.0)
    """
    choices = metadata.get("choices")
    if isinstance(choices, Mapping):
        choices = list(choices.values())
    choices = [str(choice) for choice in choices] if choices else []
    valid = "".join(str(x).upper() for x in metadata.get("valid_letters") or []) or (
        CHOICE_LETTERS[: len(choices)] if choices else "ABCDEFGH"
    )
    correct = str(metadata.get("correct_letter") or "").strip().upper() or None
    if correct is None and isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(valid):
        correct = valid[label]
    label_text = str(label).strip() if isinstance(label, str) else None
    if correct is None and label_text:
        correct = choice_letter(label_text, valid) if len(label_text) <= 3 else None
        if correct is None:
            wanted = _normalized_words(label_text)
            correct = next((valid[i] for i, c in enumerate(choices) if _normalized_words(c) == wanted), None)
    text = after_reasoning(strip_stop_markers(response))
    given = extract_choice(text, valid)
    if given is None:
        standalone = [x for x in re.findall(r"\b([A-Z])\b", text) if x in valid]
        given = standalone[-1] if standalone else None
    if given is not None and correct is not None:
        return 1.0 if given == correct else 0.0
    position = valid.find(correct) if correct else -1
    targets = [choices[position]] if 0 <= position < len(choices) else []
    targets += [str(metadata[k]) for k in ("correct_answer", "answer_text") if metadata.get(k)]
    haystack = _normalized_words(text)
    return (
        1.0 if any(t and _normalized_words(t) in haystack for t in targets if _normalized_words(t)) else 0.0
    )


# ---- Relax's multimodal / mixed-source math rewards, without their sympy/math_verify graders -------------------
@_rule(RewardType.GEO3K, grades_box=True)
def geo3k_reward(response: str, label: Any) -> float:
    r"""0.9 x (boxed answer equals the label's ground truth) + 0.1 x (the response has the shape
    ``<think>...</think>...\boxed{...}``). Equivalence is `answers_match`, not Relax's mathruler grader.

    >>> geo3k_reward(r"<think>r = 3</think> so \boxed{6}", {"ground_truth": "6"}), geo3k_reward(r"\boxed{6}", "6")
    (1.0, 0.9)
    """
    truth = _label_answer(label)
    if not truth:
        return 0.0
    accurate = answers_match(extract_boxed(response), truth)
    well_formed = re.fullmatch(r"<think>.*</think>.*\\boxed\{.*\}.*", response.strip(), re.DOTALL) is not None
    return 0.9 * accurate + 0.1 * well_formed


@_rule(RewardType.OPENR1MM)
def openr1mm_reward(response: str, label: Any) -> float:
    """1.0 when the response's ``<answer>`` content (or the whole response) equals the label's (or the whole
    label) as math (`answers_match`, boxed content when boxed) or as stripped text; responses with more than
    one ``</think>`` or ``<answer>`` score 0 (repeating blocks is a known reward hack).

    >>> openr1mm_reward("<think>..</think><answer>x = 12</answer>", "<answer>12</answer>")
    1.0
    >>> openr1mm_reward("<answer>1</answer><answer>12</answer>", "12")
    0.0
    """
    if label is None or any(response.count(tag) > 1 for tag in ("</think>", "<answer>", "</answer>")):
        return 0.0
    text = str(label)
    truth = extract_tag(text) or text.strip()
    given = extract_tag(response) or strip_stop_markers(response).strip()
    if given == truth:
        return 1.0
    unbox = lambda s: extract_boxed(s) if "\\boxed" in s else s  # noqa: E731
    return 1.0 if answers_match(unbox(given), unbox(truth)) else 0.0


def _signed_gsm8k(response: str, label: Any) -> float:
    """Relax's hardened GSM8K scorer of `mopd`: +1/-1, more than five ``####`` is a hack (-1), the tail
    300 characters hold the answer (``Answer:``, then ``####``, then a box, then the last number)."""
    text = strip_stop_markers(response)
    if text.count("####") > 5:
        return -1.0
    tail = text[-300:]
    line = extract_answer_line(tail)
    given = line if line is not None and parse_number(normalize_answer(line)) is not None else None
    given = given or extract_final_number(tail)
    truth = _label_answer(label)
    expected = gsm8k_label_number(truth) if truth else None
    return 1.0 if answers_match(given, expected) else -1.0


@_rule(RewardType.MOPD, uses_metadata=True)
def mopd_reward(response: str, label: Any, metadata: dict[str, Any]) -> float:
    r"""Per-source routing by ``metadata.data_source`` (Relax's multi-domain reward): geometry3k/geo3k ->
    boxed math +1/-1; multimodal-open-r1/openr1mm -> `openr1mm_reward`; dapo -> `dapo_reward` score; anything
    else -> a GSM8K scorer, +1/-1.

    >>> mopd_reward(r"\boxed{2}", "2", {"data_source": "geo3k"}), mopd_reward("Answer: 7", "#### 7", {})
    (1.0, 1.0)
    >>> mopd_reward("#### 1 " * 6, "1", {"data_source": "gsm8k"})
    -1.0
    """
    source = str(metadata.get("data_source", "")).lower()
    if "geometry3k" in source or "geo3k" in source:
        return 1.0 if math_reward(response, label) else -1.0
    if "multimodal-open-r1" in source or "openr1mm" in source:
        return openr1mm_reward(response, label)
    if "dapo" in source:
        return float(dapo_reward(response, label)["score"])
    return _signed_gsm8k(response, label)


# ---- no grading -------------------------------------------------------------------------------------------------
@_rule(RewardType.RANDOM)
def random_reward(response: str, label: Any) -> float:
    """0.0 or 1.0 from a hash of `response` (deterministic, so runs are reproducible).

    >>> random_reward("abc", None) in (0.0, 1.0)
    True
    """
    return float(zlib.crc32(response.encode("utf-8")) % 2)


@_rule(RewardType.DUMMY)
def dummy_reward(response: str, label: Any) -> float:
    """Always 0.0: for jobs whose real reward is computed by `custom-reward-post-process-path`.

    >>> dummy_reward("anything", "x")
    0.0
    """
    return 0.0


# ---- dispatch -------------------------------------------------------------------------------------------------
def split_boxed(rm_type: str) -> tuple[str, bool]:
    """``"boxed_math"`` -> ``("math", True)``; other names -> ``(name, False)``.

    >>> split_boxed("boxed_f1"), split_boxed("math")
    (('f1', True), ('math', False))
    """
    name = rm_type.strip()
    if name.startswith(BOXED_PREFIX):
        return name[len(BOXED_PREFIX) :], True
    return name, False


def rule_reward(
    rm_type: str, response: str, label: Any, metadata: Mapping[str, Any] | None = None
) -> RewardValue:
    r"""Score with the rule named `rm_type`, honouring the ``boxed_`` prefix (only the last box is graded;
    no box scores as an empty response; rules that grade the box themselves, like math, ignore the prefix).

    >>> rule_reward("boxed_f1", r"it is \boxed{blue sky}", "blue sky"), rule_reward("boxed_exact_match", "Paris", "Paris")
    (1.0, 0.0)
    """
    name, boxed = split_boxed(rm_type)
    rule = RULE_REWARDS.get(name)
    return rule(boxed_response(response) if boxed and not rule.grades_box else response, label, metadata)


def boxed_response(response: str) -> str:
    """What a ``boxed_`` rm-type grades: the last box's content ("" when there is none)."""
    return extract_boxed(response) or ""
