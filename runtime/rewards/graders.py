"""Rewards for the graders of OpenAI's reinforcement fine-tuning method (`/v1/fine_tuning/jobs`,
docs/reference/fine-tuning.md), loaded by `custom-rm-path`: the sample's response is the grader's
`{{sample.output_text}}`, its label the row's reference (`{{item.<label-key>}}`).

- `string_check`: `eq` / `ne` compare the whole strings exactly; `like` / `ilike` say whether the reference
  is contained in the response (`ilike`: ignoring case). 1.0 or 0.0.
- `text_similarity` with `fuzzy_match`: the similarity ratio of the two strings (difflib's
  `SequenceMatcher.ratio`, 0.0 to 1.0).

>>> from runtime.types import Sample
>>> string_check_eq(Sample(index=0, group_index=0, prompt="", response="Paris", label="Paris"))
1.0
>>> string_check_ilike(Sample(index=0, group_index=0, prompt="", response="It is PARIS.", label="paris"))
1.0
>>> string_check_ne(Sample(index=0, group_index=0, prompt="", response="Paris", label="Paris"))
0.0
>>> round(fuzzy_match(Sample(index=0, group_index=0, prompt="", response="kitten", label="sitting")), 3)
0.615
"""

from __future__ import annotations

from difflib import SequenceMatcher

from runtime.types import Sample


def _pair(sample: Sample) -> tuple[str, str]:
    return sample.response or "", "" if sample.label is None else str(sample.label)


def string_check_eq(sample: Sample) -> float:
    response, reference = _pair(sample)
    return float(response == reference)


def string_check_ne(sample: Sample) -> float:
    response, reference = _pair(sample)
    return float(response != reference)


def string_check_like(sample: Sample) -> float:
    response, reference = _pair(sample)
    return float(reference in response)


def string_check_ilike(sample: Sample) -> float:
    response, reference = _pair(sample)
    return float(reference.casefold() in response.casefold())


def fuzzy_match(sample: Sample) -> float:
    response, reference = _pair(sample)
    if not response and not reference:
        return 1.0
    return SequenceMatcher(None, response, reference, autojunk=False).ratio()
