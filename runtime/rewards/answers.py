"""Answer extraction and normalisation shared by the rule rewards: boxes, tags, final numbers, letters, text."""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable
from fractions import Fraction

# End-of-sequence markers that a response decoded with special tokens kept may contain; nothing after the
# first one is part of the answer.
STOP_MARKERS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "<eos>")
_STOP = re.compile("|".join(map(re.escape, STOP_MARKERS)))


def strip_stop_markers(text: str) -> str:
    """`text` up to its first end-of-sequence marker, trailing whitespace removed.

    >>> strip_stop_markers("so 42<|im_end|><|endoftext|>")
    'so 42'
    """
    match = _STOP.search(text)
    return (text[: match.start()] if match else text).rstrip()


# ---- boxes and tags ----------------------------------------------------------------------------------------
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)\b")


def extract_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``) in `text`, braces balanced; None if absent.

    >>> extract_boxed(r"so \boxed{12} or rather \boxed{\frac{1}{2}}")
    '\\frac{1}{2}'
    >>> extract_boxed(r"\boxed{\text{(B) } \{1, 2\}}"), extract_boxed(r"it is \boxed 7.")
    ('\\text{(B) } \\{1, 2\\}', '7')
    >>> extract_boxed("no box here") is None, extract_boxed(r"cut off \boxed{12") is None
    (True, True)
    """
    commands = list(_BOX_COMMAND.finditer(text))
    if not commands:
        return None
    start = commands[-1].end()
    rest = text[start:].lstrip()
    if not rest.startswith("{"):
        # "\boxed 7" is valid LaTeX: the argument is the next token
        token = rest.split(maxsplit=1)
        return token[0].rstrip("$.,") or None if token else None
    open_at = len(text) - len(rest)
    depth = 0
    i = open_at
    while i < len(text):
        char = text[i]
        if char == "\\":  # an escaped brace \{ or \} does not open or close a group
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
        i += 1
    return None  # unbalanced: the response was cut off inside the box


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """Stripped content of the last ``<tag>...</tag>`` in `text`, or None.

    >>> extract_tag("<think>hm</think><answer> B </answer>")
    'B'
    """
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None


def after_reasoning(text: str) -> str:
    """The part of `text` after its last ``</think>`` (all of it when there is none).

    >>> after_reasoning("<think>maybe A</think> B")
    ' B'
    """
    return text.rsplit("</think>", 1)[-1]


_ANSWER_LINE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")


def extract_answer_line(text: str, tail_chars: int = 300) -> str | None:
    """The text after the last ``Answer:`` within the last `tail_chars` characters (DAPO's format).

    >>> extract_answer_line("thinking... Answer: 42")
    '42'
    """
    matches = _ANSWER_LINE.findall(text[-tail_chars:])
    return matches[-1].strip() if matches else None


# ---- numbers -----------------------------------------------------------------------------------------------
# An unsigned decimal with optional thousands commas ("1,234.5") or a bare fraction part (".5").
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
# A number standing on its own (not the "3" of "x3" or the "-3" of "16-3"), optionally a fraction a/b.
_NUMBER = re.compile(rf"(?<![\w.])-?(?:{_UNSIGNED})(?:/(?:{_UNSIGNED}))?(?!\d)")
_FRAC = re.compile(r"^(-?)\\frac\{(-?[\d.,]+)\}\{(-?[\d.,]+)\}$")
_THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")
_PLAIN_NUMBER = re.compile(r"-?[\d.]+(?:/-?[\d.]+)?|-?\d+(?:\.\d+)?e-?\d+")


def _clean_for_numbers(text: str) -> str:
    """Currency signs, LaTeX thousands separators and unicode minus signs out of the way of `_NUMBER`."""
    text = strip_stop_markers(text)
    for old, new in (("\u2212", "-"), ("\u2013", "-"), ("{,}", ","), ("\\$", ""), ("$", ""), ("\\!", "")):
        text = text.replace(old, new)
    return text


def find_numbers(text: str) -> list[str]:
    """Every stand-alone number in `text`, in order (subtraction is not a sign; currency is dropped).

    >>> find_numbers("16 - 3 - 4 = 9 eggs, $1,200.50 or -7 and 3/4 of 5km; x2")
    ['16', '3', '4', '9', '1,200.50', '-7', '3/4', '5']
    """
    return _NUMBER.findall(_clean_for_numbers(text))


def parse_number(answer: str) -> Fraction | None:
    r"""The exact value of a numeric answer: integer, decimal, thousands commas, ``a/b``, ``\frac{a}{b}``,
    currency and percent signs; None when it is not a plain number.

    >>> parse_number("0.5") == parse_number(r"\frac{1}{2}") == parse_number("1/2") == parse_number(r"\dfrac12")
    True
    >>> parse_number("$1,200.00"), parse_number("-3"), parse_number(r"50\%")
    (Fraction(1200, 1), Fraction(-3, 1), Fraction(50, 1))
    >>> parse_number("x+1") is None, parse_number("1/0") is None
    (True, True)
    """
    s = normalize_answer(answer)
    frac = _FRAC.match(s)
    if frac:
        sign, num, den = frac.groups()
        s = f"{sign}{num.replace(',', '')}/{den.replace(',', '')}"
    if not _PLAIN_NUMBER.fullmatch(s):
        return None  # keeps Fraction from accepting "inf", "nan", "1_000" and the like
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


# ---- math answers ------------------------------------------------------------------------------------------
_TRAILING_UNIT = re.compile(r"^(.*\d)\s*\\(?:text|mbox|mathrm)\{[^{}]*\}$")
_DEGREES = re.compile(r"\^\{?\\circ\}?")
_SHORT_FRAC = re.compile(r"\\frac(\d)(\d)")
_SHORT_SQRT = re.compile(r"\\sqrt(\d|[a-zA-Z](?![a-zA-Z]))")
_ASSIGNMENT = re.compile(r"[a-zA-Z]=.+")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def normalize_answer(answer: str) -> str:
    r"""Canonical string form of a final math answer: no spaces, ``$``, sizing commands, degree and percent
    signs, trailing units or period; ``\dfrac``/``\tfrac`` -> ``\frac``; ``\frac12`` -> ``\frac{1}{2}``;
    ``x = 5`` -> ``5``; thousands commas removed.

    >>> normalize_answer(r" $1,000.$ "), normalize_answer(r"\text{ 7 }"), normalize_answer(r"10\text{ cm}")
    ('1000', '7', '10')
    >>> normalize_answer(r"x = \dfrac{\sqrt3}{2}"), normalize_answer(r"\left( 1, 2 \right)"), normalize_answer(r"90^\circ")
    ('\\frac{\\sqrt{3}}{2}', '(1,2)', '90')
    """
    s = strip_stop_markers(answer).strip().replace("\n", " ")
    unit = _TRAILING_UNIT.match(s)
    if unit:
        s = unit.group(1)
    s = _TEXT_WRAPPER.sub(r"\1", s)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\$", "$", "\\%", "%"):
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\u2212", "-")
    s = _DEGREES.sub("", s)
    s = "".join(s.split())
    s = _SHORT_FRAC.sub(r"\\frac{\1}{\2}", s)
    s = _SHORT_SQRT.sub(r"\\sqrt{\1}", s)
    if _ASSIGNMENT.fullmatch(s):  # "x=5": the value of a single named variable
        s = s[2:]
    s = s.rstrip(".")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if s.startswith("."):
        s = "0" + s
    elif s.startswith("-."):
        s = "-0" + s[1:]
    return s


def answers_match(given: str | None, expected: str | None) -> bool:
    r"""Whether two final answers agree: equal as numbers when both parse, else equal normalised strings.

    >>> answers_match("19", "19.0"), answers_match(r"\frac{1}{2}", "0.5"), answers_match("18", "19")
    (True, True, False)
    >>> answers_match(r"\dfrac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}"), answers_match(None, "1"), answers_match("", "")
    (True, False, False)
    """
    if given is None or expected is None:
        return False
    if given.strip() == expected.strip() != "":
        return True
    a, b = parse_number(given), parse_number(expected)
    if a is not None and b is not None:
        return a == b
    left, right = normalize_answer(given), normalize_answer(expected)
    return left == right != ""


# ---- GSM8K final numbers -----------------------------------------------------------------------------------
_ANSWER_PHRASE = re.compile(r"(?i)\b(?:final\s+)?answer\s*(?:is|:|=)\s*:?")


def _first_number(text: str) -> str | None:
    numbers = find_numbers(text)
    return numbers[0] if numbers else None


def gsm8k_label_number(label: str) -> str | None:
    """The final number of a GSM8K label: what follows its last ``####``, or the label itself.

    >>> gsm8k_label_number("2 + 3 = <<2+3=5>>5 apples\\n#### 5"), gsm8k_label_number("1,450,000")
    ('5', '1,450,000')
    """
    if "####" in label:
        return _first_number(label.rsplit("####", 1)[1])
    return _first_number(label)


def extract_final_number(response: str) -> str | None:
    r"""The final numeric answer of a free-form solution, first found of: the number after the last
    ``####``; after the last "the (final) answer is" / "answer:"; in the last ``\boxed{}``; the last number.

    >>> extract_final_number("9 eggs * $2 = $18.\nThe answer is $18.<|endoftext|>")
    '18'
    >>> extract_final_number(r"so \boxed{1,200} in total"), extract_final_number("#### -4"), extract_final_number("3 + 4 = 7")
    ('1,200', '-4', '7')
    >>> extract_final_number("no digits") is None
    True
    """
    text = strip_stop_markers(response)
    if "####" in text:
        found = _first_number(text.rsplit("####", 1)[1])
        if found is not None:
            return found
    phrases = list(_ANSWER_PHRASE.finditer(text))
    if phrases:
        found = _first_number(text[phrases[-1].end() :].lstrip().split("\n", 1)[0])
        if found is not None:
            return found
    boxed = extract_boxed(text)
    if boxed is not None:
        found = _first_number(boxed)
        if found is not None:
            return found
    numbers = find_numbers(text)
    return numbers[-1] if numbers else None


# ---- multiple choice ---------------------------------------------------------------------------------------
CHOICE_LETTERS = "ABCDEFGHIJ"
_LETTER_FIELD = re.compile(
    r"^\s*(?:\\text\{\s*)?(?i:option|choice)?\s*[(\[]?\s*([A-Za-z])\s*(?:[)\].:}]|$|\s)", re.DOTALL
)
_LETTER_PHRASE = re.compile(
    r"(?i:\b(?:final\s+)?(?:answer|option|choice)\b(?:\s+is)?(?:\s+option)?)[\s*:]*"
    r"(?:[(\[]\s*([A-Ja-j])\s*[)\]]|(?:\\text\{\s*|\\boxed\{\s*)?([A-J])(?![\w]))"
)
_PAREN_LETTER = re.compile(r"\(([A-J])\)")
_BARE_LETTER = re.compile(r"[\s*]*(?:(?i:option|choice)\s*)?[(\[]?([A-Ja-j])[)\].:]?[\s*]*")


def choice_letter(field: str | None, letters: str = CHOICE_LETTERS) -> str | None:
    """The option letter a short answer field names: ``B``, ``(b)``, ``B)``, ``B. Paris``, ``Option B``.

    >>> choice_letter("(c)"), choice_letter("B. Paris"), choice_letter("Option D"), choice_letter("Paris")
    ('C', 'B', 'D', None)
    """
    if field is None:
        return None
    stripped = field.strip()
    if len(stripped) > 1 and stripped[0].islower() and stripped[1].isalpha():
        return None  # a word ("apple"), not a lowercase letter
    match = _LETTER_FIELD.match(stripped)
    if not match:
        return None
    letter = match.group(1).upper()
    return letter if letter in letters else None


def extract_choice(response: str, letters: str = CHOICE_LETTERS) -> str | None:
    r"""The option letter a response picks, first found of: its last ``<answer>`` tag, its last ``\boxed{}``,
    the last "answer is X" / "Answer: (X)" / "option X" phrase, the whole (short) response, the last "(X)".
    Reasoning before ``</think>`` is ignored.

    >>> extract_choice("<think>A or B?</think>The answer is (B)."), extract_choice(r"... \boxed{C}")
    ('B', 'C')
    >>> extract_choice("Answer: C) 12"), extract_choice("D"), extract_choice("so (E)"), extract_choice("I think so")
    ('C', 'D', 'E', None)
    """
    text = after_reasoning(strip_stop_markers(response))
    for field in (extract_tag(text), extract_boxed(text)):
        letter = choice_letter(field, letters)
        if letter is not None:
            return letter
    phrases = [(m.group(1) or m.group(2)).upper() for m in _LETTER_PHRASE.finditer(text)]
    phrases = [letter for letter in phrases if letter in letters]
    if phrases:
        return phrases[-1]
    bare = _BARE_LETTER.fullmatch(text)  # the whole response is "B", "(b)", "B." or "Option B"
    if bare and bare.group(1).upper() in letters:
        return bare.group(1).upper()
    found = [letter for letter in _PAREN_LETTER.findall(text) if letter in letters]
    return found[-1] if found else None


# ---- free text ---------------------------------------------------------------------------------------------
def normalize_text(text: str) -> str:
    """Exact-match normal form: NFKC, case-folded, whitespace collapsed, surrounding quotes, ``$`` and final
    punctuation removed.

    >>> normalize_text('  "Paris".<|im_end|>'), normalize_text("New\\n  York!")
    ('paris', 'new york')
    """
    s = unicodedata.normalize("NFKC", strip_stop_markers(text)).casefold()
    s = " ".join(s.split())
    s = s.strip().strip("$").strip()
    s = s.rstrip(".!?;,").strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'`":
        s = s[1:-1].strip()
    return s


_PUNCTUATION = set(string.punctuation)


def squad_tokens(text: str) -> list[str]:
    """SQuAD answer normalisation, as tokens: lower case, no punctuation, no articles (a, an, the).

    >>> squad_tokens("The Cat's hat, a red one.")
    ['cats', 'hat', 'red', 'one']
    """
    s = "".join(ch for ch in strip_stop_markers(text).lower() if ch not in _PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return s.split()


def as_answer_list(label: object) -> list[str]:
    """A label as a list of acceptable answers (a list label lists several; None lists none).

    >>> as_answer_list(["x", 3]), as_answer_list("y"), as_answer_list(None)
    (['x', '3'], ['y'], [])
    """
    if label is None:
        return []
    if isinstance(label, str):
        return [label]
    if isinstance(label, Iterable) and not isinstance(label, dict):
        return [str(item) for item in label]
    return [str(label)]
