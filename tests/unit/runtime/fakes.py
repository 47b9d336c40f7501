"""Test doubles for the rollout: a scripted engine and a character tokenizer (no model, no Ray)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.rollout.engine import FinishReason, GenerationResult, SamplingParams
from runtime.types import Sample

EOS = 0


class CharTokenizer:
    """Token id = ord(char); 0 is EOS/pad and decodes to nothing."""

    pad_token_id = EOS
    eos_token_id = EOS

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids if i != EOS)


class ScriptedEngine:
    """Answers each request with a scripted response, `step_tokens` at a time like a real engine would
    under a budget: `script(prompt_ids) -> full response ids` (EOS-terminated to complete)."""

    def __init__(self, script: Callable[[list[int]], list[int]]) -> None:
        self.script = script
        self.calls: list[tuple[int, list[int]]] = []  # (requests, budgets)
        self.weight_version = 0

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, budgets: list[int] | None = None
    ) -> list[GenerationResult]:
        budgets = budgets or [params.max_new_tokens] * len(prompts)
        self.calls.append((len(prompts), list(budgets)))
        results = []
        for tokens, budget in zip(prompts, budgets, strict=True):
            prompt_len = next(i for i, t in enumerate(tokens) if t == ord("|")) + 1
            already = tokens[prompt_len:]
            full = self.script(tokens[:prompt_len])
            rest = full[len(already) :]
            out = rest[:budget]
            done = len(out) == len(rest) and bool(rest) and rest[-1] == EOS
            results.append(
                GenerationResult(
                    out,
                    [-0.5] * len(out),
                    FinishReason.STOP if done else FinishReason.LENGTH,
                    self.weight_version,
                )
            )
        return results


class LabelReward:
    """1 when the response equals the label, else 0."""

    def __init__(self) -> None:
        self.scored: list[int] = []

    def score(self, samples: list[Sample], **_: Any) -> list[float]:
        for s in samples:
            s.reward = float(s.response == s.label)
            self.scored.append(s.index)
        return [float(s.reward) for s in samples]
