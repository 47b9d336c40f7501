"""Prompt datasets: JSONL rows -> `PromptItem`s, prompt rendering, and the resumable epoch-aware data source."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.types import Prompt


@dataclass(frozen=True)
class DatasetConfig:
    """The spec fields that say how to read a row and render its prompt."""

    input_key: str = "input"
    label_key: str | None = None
    metadata_key: str = "metadata"
    apply_chat_template: bool = False
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None


@dataclass(frozen=True)
class PromptItem:
    index: int  # row number in the file (0-based)
    prompt: Prompt
    label: str | None
    metadata: dict[str, Any]
    row: dict[str, Any]  # the whole row, for SFT and custom hooks


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    with Path(path).open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{line_no}: not JSON ({exc.msg})") from None
    return rows


def read_prompt_items(path: str | Path, config: DatasetConfig) -> list[PromptItem]:
    """Read `prompt-data`. Every row needs `input-key`; `label-key` and `metadata-key` are optional."""
    items = []
    for index, row in enumerate(read_jsonl(path)):
        if config.input_key not in row:
            raise ValueError(
                f"{path}: row {index} has no input key {config.input_key!r} (keys: {sorted(row)})"
            )
        label = row.get(config.label_key) if config.label_key else None
        metadata = row.get(config.metadata_key) or {}
        items.append(
            PromptItem(
                index=index,
                prompt=row[config.input_key],
                label=None if label is None else str(label),
                metadata=metadata if isinstance(metadata, dict) else {"value": metadata},
                row=row,
            )
        )
    if not items:
        raise ValueError(f"{path}: no rows")
    return items


class PromptFormatter:
    """Renders a dataset prompt to the text the model sees, and to token ids.

    Without a chat template the text is `system_prompt + prompt` (Relax's rule); with `apply-chat-template`
    a string prompt becomes one user message, the system prompt a system message.
    """

    def __init__(self, tokenizer: Any, config: DatasetConfig) -> None:
        self.tokenizer = tokenizer
        self.config = config

    def messages(self, prompt: Prompt) -> list[dict[str, Any]]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.config.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        return messages

    def render(self, prompt: Prompt) -> str:
        if self.config.apply_chat_template:
            return self.tokenizer.apply_chat_template(
                self.messages(prompt),
                tokenize=False,
                add_generation_prompt=True,
                **self.config.apply_chat_template_kwargs,
            )
        if not isinstance(prompt, str):
            raise ValueError("a messages-list prompt needs apply-chat-template")
        return (self.config.system_prompt or "") + prompt

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, prompt: Prompt) -> list[int]:
        return self.encode_text(self.render(prompt))


@dataclass
class DataPosition:
    """Where the data source is; saved in every checkpoint so a resumed job continues with the next prompts."""

    epoch: int = 0
    offset: int = 0  # prompts already served in this epoch
    served: int = 0  # prompts served in total


class RolloutDataSource:
    """Serves prompts in order, epoch after epoch; with `rollout-shuffle` each epoch is a fresh permutation
    seeded by `rollout-seed` + epoch, so the order is the same after a resume."""

    def __init__(self, items: list[PromptItem], *, shuffle: bool, seed: int) -> None:
        self.items = items
        self.shuffle = shuffle
        self.seed = seed
        self.position = DataPosition()
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def __len__(self) -> int:
        return len(self.items)

    def next_prompts(self, count: int) -> list[PromptItem]:
        picked = []
        while len(picked) < count:
            if self.position.offset >= len(self._order):
                self.position.epoch += 1
                self.position.offset = 0
                self._order = self._epoch_order(self.position.epoch)
            take = min(count - len(picked), len(self._order) - self.position.offset)
            start = self.position.offset
            picked.extend(self.items[i] for i in self._order[start : start + take])
            self.position.offset += take
            self.position.served += take
        return picked

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.position.epoch, "offset": self.position.offset, "served": self.position.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = DataPosition(
            **{k: int(v) for k, v in state.items() if k in ("epoch", "offset", "served")}
        )
        self._order = self._epoch_order(self.position.epoch)
