"""Prompt datasets: JSONL rows -> `PromptItem`s, prompt rendering, and the resumable epoch-aware prompt cursor."""

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
    tool_key: str | None = "tools"  # `tool-key`: the row's tool list, handed to the chat template
    # `conversation-key-map`: renames message keys (from -> role) and role values (human -> user); only
    # for rows whose input holds a messages list
    conversation_key_map: dict[str, str] = field(default_factory=dict)
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
    tools: list[dict[str, Any]] | None = None  # row[tool-key], when present


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


def remap_conversation(messages: list[dict[str, Any]], key_map: dict[str, str]) -> list[dict[str, Any]]:
    """Apply `conversation-key-map` to a messages list: every key of each message is renamed through the
    map, then only the value of the (renamed) `role` field is; message text is never rewritten.

    >>> remap_conversation([{"from": "human", "value": "hi human"}],
    ...                    {"from": "role", "value": "content", "human": "user"})
    [{'role': 'user', 'content': 'hi human'}]
    """
    if not key_map:
        return messages
    out = []
    for message in messages:
        renamed = {key_map.get(key, key): value for key, value in message.items()}
        role = renamed.get("role")
        if isinstance(role, str):
            renamed["role"] = key_map.get(role, role)
        out.append(renamed)
    return out


def read_prompt_items(path: str | Path, config: DatasetConfig) -> list[PromptItem]:
    """Read `prompt-data`. Every row needs `input-key`; `label-key`, `metadata-key` and `tool-key` are
    optional. A messages-list input goes through `conversation-key-map` when no `label-key` is set."""
    items = []
    for index, row in enumerate(read_jsonl(path)):
        if config.input_key not in row:
            raise ValueError(
                f"{path}: row {index} has no input key {config.input_key!r} (keys: {sorted(row)})"
            )
        label = row.get(config.label_key) if config.label_key else None
        metadata = row.get(config.metadata_key) or {}
        prompt = row[config.input_key]
        if isinstance(prompt, list) and not config.label_key:
            prompt = remap_conversation(prompt, config.conversation_key_map)
        tools = row.get(config.tool_key) if config.tool_key else None
        items.append(
            PromptItem(
                index=index,
                prompt=prompt,
                label=None if label is None else str(label),
                metadata=metadata if isinstance(metadata, dict) else {"value": metadata},
                row=row,
                tools=tools if isinstance(tools, list) and tools else None,
            )
        )
    if not items:
        raise ValueError(f"{path}: no rows")
    return items


def drop_long_prompts(
    items: list[PromptItem], formatter: PromptFormatter, max_prompt_len: int | None
) -> tuple[list[PromptItem], int]:
    """`rollout-max-prompt-len` / `eval-max-prompt-len`: prompts longer than this (in tokens, as rendered)
    are filtered out when the dataset is loaded. Returns (kept, dropped count)."""
    if not max_prompt_len:
        return items, 0
    kept = [item for item in items if len(formatter.encode(item.prompt, item.tools)) <= max_prompt_len]
    if not kept:
        raise ValueError(f"every prompt is longer than max prompt length {max_prompt_len} tokens")
    return kept, len(items) - len(kept)


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

    def render_messages(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The chat template applied to `messages` (tools, when given, go to the template as `tools`)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("the tokenizer of hf-checkpoint has no chat template (needed for messages)")
        kwargs = dict(self.config.apply_chat_template_kwargs)
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def render(self, prompt: Prompt, tools: list[dict[str, Any]] | None = None) -> str:
        if self.config.apply_chat_template:
            return self.render_messages(self.messages(prompt), tools=tools, add_generation_prompt=True)
        if not isinstance(prompt, str):
            raise ValueError("a messages-list prompt needs apply-chat-template")
        return (self.config.system_prompt or "") + prompt

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, prompt: Prompt, tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.encode_text(self.render(prompt, tools))


@dataclass
class DataPosition:
    """Where the data source is; saved in every checkpoint so a resumed job continues with the next prompts."""

    epoch: int = 0
    offset: int = 0  # prompts already served in this epoch
    served: int = 0  # prompts served in total


class PromptCursor:
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
        if count > 0 and not self.items:  # a job without --prompt-data whose hooks still draw from it
            raise ValueError(
                "no prompts to draw: set --prompt-data, or a --data-source-path that makes its own"
            )
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


def split_eval_holdout(
    items: list[PromptItem], eval_size: float, seed: int
) -> tuple[list[PromptItem], list[PromptItem]]:
    """`eval-size`: carve a held-out eval set out of the training rows, once, with `seed`.

    A value < 1 is a fraction of the rows (at least one), a value >= 1 a row count; at least one row stays
    for training. Returns (train, eval), each in file order; they never overlap.

    >>> rows = [PromptItem(i, str(i), None, {}, {}) for i in range(10)]
    >>> train, held = split_eval_holdout(rows, 0.2, seed=0)
    >>> len(train), len(held), set(p.index for p in train) & set(p.index for p in held)
    (8, 2, set())
    """
    n = len(items)
    n_eval = max(1, int(n * eval_size)) if eval_size < 1 else int(eval_size)
    n_eval = min(n_eval, n - 1)
    if n_eval <= 0:
        raise ValueError(f"eval-size={eval_size}: the dataset has {n} row(s), none can be held out")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    held = set(order[:n_eval])
    return [it for i, it in enumerate(items) if i not in held], [
        it for i, it in enumerate(items) if i in held
    ]
