"""`runtime.rollout.generate.decode_many`: a rollout's responses decoded in one call give exactly the strings
that `tokenizer.decode` gives one by one (the driver decodes every response of every step)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from runtime.rollout.generate import GenerateContext, LengthLimits, advance, decode_many
from runtime.rollout.params import FinishReason, GenerationResult, SamplingParams
from runtime.types import Sample


def _sequences(tokenizer: object, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = len(tokenizer)  # type: ignore[arg-type]
    special = list(tokenizer.all_special_ids)  # type: ignore[attr-defined]
    return [
        [
            rng.choice(special) if rng.random() < 0.1 else rng.randrange(vocab)
            for _ in range(rng.randrange(0, 40))
        ]
        for _ in range(n)
    ]


@pytest.mark.parametrize("skip_special_tokens", [False, True])
@pytest.mark.parametrize("clean_up", [False, True])
def test_the_same_strings_as_decoding_one_by_one(
    tiny_model: Path, skip_special_tokens: bool, clean_up: bool
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.clean_up_tokenization_spaces = clean_up  # True: the one-by-one path (transformers' cleanup)
    sequences = _sequences(tokenizer, 64, seed=int(skip_special_tokens) + 2 * int(clean_up))
    want = [tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) for ids in sequences]
    assert decode_many(tokenizer, sequences, skip_special_tokens) == want
    assert any(want) and len(set(want)) > 32  # the sequences say something, and not the same thing


class _Results:
    """The engine's side of `advance`, given: these results for whatever is asked."""

    def __init__(self, results: list[GenerationResult]) -> None:
        self.results = results

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, budgets: list[int] | None = None
    ) -> list[GenerationResult]:
        assert len(prompts) == len(self.results)
        return self.results


def test_advance_gives_every_sample_its_decoded_response(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    responses = _sequences(tokenizer, 16, seed=7)
    results = [GenerationResult(ids, [-1.0] * len(ids), FinishReason.LENGTH, 3) for ids in responses]
    samples = [Sample(index=i, group_index=i // 4, prompt="p", tokens=[5, 6]) for i in range(16)]
    ctx = GenerateContext(
        engine=_Results(results),
        tokenizer=tokenizer,
        params=SamplingParams(max_new_tokens=64),
        limits=LengthLimits(max_response_len=64),
        rollout_id=0,
    )
    advance(samples, ctx)
    for sample, ids in zip(samples, responses, strict=True):
        assert sample.tokens == [5, 6, *ids] and sample.response_tokens == ids
        assert sample.response == tokenizer.decode(ids)
