"""SFT examples: a dataset row -> a `Sample` whose loss mask covers only the response tokens."""

from __future__ import annotations

from typing import Any

from runtime.data.prompts import PromptFormatter, PromptItem
from runtime.types import Sample, SampleStatus


class SFTExampleBuilder:
    """Two row shapes, as in Relax:

    - `label-key` set: the prompt is `row[input-key]`, the target text `row[label-key]`;
    - `label-key` unset: `row[input-key]` is a messages list whose last message is the assistant's target.

    Prompt and response are tokenized apart and concatenated, exactly as an RL rollout produces them, so a
    warm-started policy sees the same token boundary at generation time. Without a chat template the
    response ends with the EOS token; with one, the template's end-of-turn marks the end.
    """

    def __init__(self, formatter: PromptFormatter, *, label_key: str | None) -> None:
        self.formatter = formatter
        self.label_key = label_key
        self.eos_token_id: int = formatter.tokenizer.eos_token_id

    def build(self, item: PromptItem, index: int) -> Sample:
        prompt, target = self._split(item)
        prompt_ids = self.formatter.encode(prompt)
        if self.formatter.config.apply_chat_template:
            prompt_text = self.formatter.render(prompt)
            full_text = self.formatter.tokenizer.apply_chat_template(
                self.formatter.messages(prompt) + [{"role": "assistant", "content": target}],
                tokenize=False,
                **self.formatter.config.apply_chat_template_kwargs,
            )
            if not full_text.startswith(prompt_text):
                raise ValueError("chat template renders the prompt differently with and without the answer")
            response_text = full_text[len(prompt_text) :]
            response_ids = self.formatter.encode_text(response_text)
        else:
            response_text = target
            response_ids = self.formatter.encode_text(target) + [self.eos_token_id]
        return Sample(
            index=index,
            group_index=index,
            prompt=prompt,
            label=target,
            metadata=item.metadata,
            tokens=prompt_ids + response_ids,
            response_length=len(response_ids),
            response=response_text,
            status=SampleStatus.COMPLETED,
        )

    def _split(self, item: PromptItem) -> tuple[Any, str]:
        if self.label_key:
            if self.label_key not in item.row:
                raise ValueError(f"SFT row {item.index} has no label key {self.label_key!r}")
            return item.prompt, str(item.row[self.label_key])
        messages = item.prompt
        if not isinstance(messages, list) or not messages or messages[-1].get("role") != "assistant":
            raise ValueError(
                f"SFT row {item.index}: without label-key, input-key must hold messages ending with an assistant turn"
            )
        return messages[:-1], str(messages[-1]["content"])
