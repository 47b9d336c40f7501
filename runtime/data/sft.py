"""SFT examples: a dataset row -> a `Sample` whose loss mask covers the assistant's tokens only.

Row shapes, as in Relax:

- `label-key` set: the prompt is `row[input-key]`, the target text `row[label-key]`;
- `label-key` unset: `row[input-key]` is a conversation (OpenAI messages, or any shape that
  `conversation-key-map` maps to one); every assistant turn is trained, everything else is context.

Conversations always go through the tokenizer's chat template, with the system prompt added as a system
message when the conversation has none and `row[tool-key]` passed as the template's `tools`.
Each turn is rendered and tokenized apart and the pieces concatenated, exactly as an RL rollout produces
tokens (prompt, then the sampled response), so a warm-started policy sees the same token boundaries.

Samples longer than the token capacity (`max-tokens-per-gpu`) are handled by `sft-oversize-strategy`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from runtime.data.prompts import PromptFormatter, PromptItem
from runtime.types import Sample, SampleStatus

log = logging.getLogger(__name__)


class OversizeStrategy(StrEnum):
    SKIP = "skip"  # drop the sample
    KEEP = "keep"  # train on it whole (a micro-batch of its own)
    TRUNCATE_LEFT = "truncate_left"  # keep the last `capacity` tokens
    TRUNCATE_RIGHT = "truncate_right"  # keep the first `capacity` tokens
    CUSTOM = "custom"  # `sft-oversize-custom-function-path`


OversizeFn = Callable[[list[int], list[int], int, int], "tuple[list[int], list[int]] | None"]


def truncate_left(
    tokens: list[int], loss_mask: list[int], capacity: int, idx: int
) -> tuple[list[int], list[int]]:
    """Keep the last `capacity` tokens.

    >>> truncate_left([1, 2, 3, 4], [0, 0, 1, 1], 3, 0)
    ([2, 3, 4], [0, 1, 1])
    """
    return tokens[-capacity:], loss_mask[-capacity:]


def truncate_right(
    tokens: list[int], loss_mask: list[int], capacity: int, idx: int
) -> tuple[list[int], list[int]]:
    """Keep the first `capacity` tokens.

    >>> truncate_right([1, 2, 3, 4], [0, 0, 1, 1], 3, 0)
    ([1, 2, 3], [0, 0, 1])
    """
    return tokens[:capacity], loss_mask[:capacity]


@dataclass(frozen=True)
class OversizePolicy:
    """What to do with samples of more than `capacity` tokens (None: no limit)."""

    capacity: int | None = None
    strategy: OversizeStrategy = OversizeStrategy.KEEP
    custom: OversizeFn | None = None

    def apply(self, tokens: list[int], mask: list[int], idx: int) -> tuple[list[int], list[int]] | None:
        if self.capacity is None or len(tokens) <= self.capacity:
            return tokens, mask
        log.warning(
            "SFT sample %d has %d tokens > capacity %d: %s", idx, len(tokens), self.capacity, self.strategy
        )
        if self.strategy is OversizeStrategy.SKIP:
            return None
        if self.strategy is OversizeStrategy.KEEP:
            return tokens, mask
        if self.strategy is OversizeStrategy.TRUNCATE_LEFT:
            return truncate_left(tokens, mask, self.capacity, idx)
        if self.strategy is OversizeStrategy.TRUNCATE_RIGHT:
            return truncate_right(tokens, mask, self.capacity, idx)
        if self.custom is None:
            raise ValueError("sft-oversize-strategy custom needs sft-oversize-custom-function-path")
        result = self.custom(list(tokens), list(mask), self.capacity, idx)
        if result is None:
            return None
        new_tokens, new_mask = list(result[0]), list(result[1])
        if len(new_tokens) != len(new_mask):
            raise ValueError(
                f"sft-oversize-custom-function-path returned {len(new_tokens)} tokens but "
                f"{len(new_mask)} loss-mask entries"
            )
        return new_tokens, new_mask


@dataclass(frozen=True)
class SFTPrompt:
    """One row split for generation (SFT predictions): the prompt text and the reference answer."""

    messages: list[dict[str, Any]] | None  # the conversation up to the last assistant turn, or None
    prompt_text: str
    reference: str


class SFTExampleBuilder:
    def __init__(
        self, formatter: PromptFormatter, *, label_key: str | None, oversize: OversizePolicy | None = None
    ) -> None:
        self.formatter = formatter
        self.label_key = label_key
        self.oversize = oversize or OversizePolicy()
        self.eos_token_id: int = formatter.tokenizer.eos_token_id

    # -- training samples ----------------------------------------------------------------------------------
    def build(self, item: PromptItem, index: int) -> Sample | None:
        """The training sample of a row, or None when the oversize strategy drops it."""
        tokens, mask = self._tokens_and_mask(item)
        kept = self.oversize.apply(tokens, mask, item.index)
        if kept is None:
            return None
        tokens, mask = kept
        # The "response" starts at the first trained token; context turns after it stay in with mask 0.
        start = next((i for i, m in enumerate(mask) if m), len(mask))
        target = self._reference(item)
        return Sample(
            index=index,
            group_index=index,
            prompt=item.prompt,
            label=target,
            metadata=item.metadata,
            tokens=tokens,
            response_length=len(tokens) - start,
            response=self.formatter.tokenizer.decode(tokens[start:]),
            loss_mask=mask[start:],
            status=SampleStatus.COMPLETED,
        )

    def build_all(self, items: list[PromptItem]) -> list[Sample]:
        samples = []
        for item in items:
            sample = self.build(item, len(samples))
            if sample is not None:
                samples.append(sample)
        return samples

    def _tokens_and_mask(self, item: PromptItem) -> tuple[list[int], list[int]]:
        if self.label_key:
            return self._pair(item)
        return self._conversation(item)

    def _pair(self, item: PromptItem) -> tuple[list[int], list[int]]:
        if self.label_key not in item.row:
            raise ValueError(f"SFT row {item.index} has no label key {self.label_key!r}")
        target = str(item.row[self.label_key])
        prompt_ids = self.formatter.encode(item.prompt, item.tools)
        if self.formatter.config.apply_chat_template:
            messages = self.formatter.messages(item.prompt)
            before = self.formatter.render_messages(messages, tools=item.tools, add_generation_prompt=True)
            after = self.formatter.render_messages(
                messages + [{"role": "assistant", "content": target}], tools=item.tools
            )
            if not after.startswith(before):
                raise ValueError("chat template renders the prompt differently with and without the answer")
            response_ids = self.formatter.encode_text(after[len(before) :])
        else:
            response_ids = self.formatter.encode_text(target) + [self.eos_token_id]
        return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)

    def _conversation(self, item: PromptItem) -> tuple[list[int], list[int]]:
        messages = self._messages(item)
        if not any(m.get("role") == "assistant" for m in messages):
            raise ValueError(f"SFT row {item.index}: the conversation has no assistant turn to learn")
        tokens: list[int] = []
        mask: list[int] = []
        rendered = ""
        for turn, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self.formatter.render_messages(
                messages[:turn], tools=item.tools, add_generation_prompt=True
            )
            after = self.formatter.render_messages(messages[: turn + 1], tools=item.tools)
            if not (before.startswith(rendered) and after.startswith(before)):
                raise ValueError(
                    f"SFT row {item.index}: the chat template does not render turns as prefixes of each "
                    "other, so the assistant tokens cannot be located"
                )
            context = self.formatter.encode_text(before[len(rendered) :])
            answer = self.formatter.encode_text(after[len(before) :])
            tokens += context + answer
            mask += [0] * len(context) + [1] * len(answer)
            rendered = after
        full = self.formatter.render_messages(messages, tools=item.tools)
        if full.startswith(rendered) and len(full) > len(rendered):  # trailing non-assistant turns
            tail = self.formatter.encode_text(full[len(rendered) :])
            tokens += tail
            mask += [0] * len(tail)
        return tokens, mask

    def _messages(self, item: PromptItem) -> list[dict[str, Any]]:
        if not isinstance(item.prompt, list):
            raise ValueError(
                f"SFT row {item.index}: without label-key, input-key must hold a conversation (a list of "
                "messages); set label-key for prompt/answer rows"
            )
        return self.formatter.messages(item.prompt)

    # -- prediction prompts ----------------------------------------------------------------------------------
    def _reference(self, item: PromptItem) -> str:
        if self.label_key:
            return str(item.row.get(self.label_key, ""))
        messages = item.prompt if isinstance(item.prompt, list) else []
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        return "" if last is None else str(last.get("content", ""))

    def prediction_prompt(self, item: PromptItem) -> SFTPrompt:
        """The row without its (last) answer, rendered as generation sees it, and that answer."""
        if self.label_key:
            return SFTPrompt(None, self.formatter.render(item.prompt, item.tools), self._reference(item))
        messages = self._messages(item)
        last = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
        context = messages[:last]
        text = self.formatter.render_messages(context, tools=item.tools, add_generation_prompt=True)
        return SFTPrompt(context, text, str(messages[last].get("content", "")))
