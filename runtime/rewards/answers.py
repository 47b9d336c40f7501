"""Answer extraction and comparison shared by the rule-based rewards (boxed, `Answer:`, numbers)."""

from __future__ import annotations

import re
from fractions import Fraction

_ANSWER_LINE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")
_FRAC = re.compile(r"^\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")


def extract_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``) in `text`, braces balanced; None if absent.

    >>> extract_boxed(r"so \boxed{12} or rather \boxed{\frac{1}{2}}")
    '\\frac{1}{2}'
    >>> extract_boxed("no box here") is None
    True
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0:
        # "\boxed 5" is valid LaTeX: the answer is the next token
        rest = text[start + len("\\boxed") :].strip().split()
        return rest[0] if rest else None
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def extract_answer_line(text: str, tail_chars: int = 300) -> str | None:
    """The text after the last ``Answer:`` within the last `tail_chars` characters.

    >>> extract_answer_line("thinking... Answer: 42")
    '42'
    """
    matches = _ANSWER_LINE.findall(text[-tail_chars:])
    return matches[-1].strip() if matches else None


def normalize_answer(answer: str) -> str:
    r"""Canonical string form: no spaces, ``$``, ``\left``/``\right``, trailing period or thousands commas.

    >>> normalize_answer(r" $1,000.$ ")
    '1000'
    >>> normalize_answer(r"\text{ 7 }")
    '7'
    """
    s = answer.strip()
    s = re.sub(r"\\text\{\s*([^{}]*?)\s*\}", r"\1", s)
    for token in ("$", "\\left", "\\right", "\\!", "\\,", "\\;", " "):
        s = s.replace(token, "")
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def parse_number(answer: str) -> Fraction | None:
    r"""The exact value of a normalized numeric answer (integer, decimal, ``a/b`` or ``\frac{a}{b}``).

    >>> parse_number("0.5") == parse_number(r"\frac{1}{2}") == parse_number("1/2")
    True
    >>> parse_number("x+1") is None
    True
    """
    s = normalize_answer(answer)
    frac = _FRAC.match(s)
    if frac:
        s = f"{frac.group(1)}/{frac.group(2)}"
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(given: str | None, expected: str | None) -> bool:
    r"""Whether two final answers agree: equal as numbers when both parse, else equal as normalized text.

    >>> answers_match("19", "19.0"), answers_match(r"\frac{1}{2}", "0.5"), answers_match("18", "19")
    (True, True, False)
    """
    if given is None or expected is None:
        return False
    a, b = parse_number(given), parse_number(expected)
    if a is not None and b is not None:
        return a == b
    return normalize_answer(given) == normalize_answer(expected) != ""
