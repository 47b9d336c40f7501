"""Rollout data sources: prompt groups of pending samples, epoch after epoch, with Relax's buffer.

`RolloutDataSourceWithBuffer` (Relax's default `data-source-path`) serves groups from its buffer first
(through `buffer-filter-path`, default `pop_first`) and tops up from the prompt set. Groups come back to
the buffer from over-sampling (complete, scored surplus) and partial rollout (interrupted samples).
The buffer is part of the saved state, so a resumed job sees exactly the groups an uninterrupted one would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.data.prompts import PromptCursor, PromptFormatter, PromptItem
from runtime.types import Sample

log = logging.getLogger(__name__)

Group = list[Sample]  # the samples of one prompt: `n-samples-per-prompt` of them


@dataclass(frozen=True)
class DataSourceInit:
    """What a `data-source-path` class is built from."""

    items: list[PromptItem]
    formatter: PromptFormatter
    n_samples_per_prompt: int
    shuffle: bool
    seed: int
    buffer_filter: Callable[[list[Group], int], list[Group]] | None = None


def pop_first(buffer: list[Group], num_groups: int) -> list[Group]:
    """The default buffer filter: the oldest groups first.

    >>> buf = [[Sample(0, 0, "a")], [Sample(1, 1, "b")], [Sample(2, 2, "c")]]
    >>> [g[0].prompt for g in pop_first(buf, 2)], [g[0].prompt for g in buf]
    (['a', 'b'], ['c'])
    """
    taken = buffer[:num_groups]
    del buffer[:num_groups]
    return taken


class RolloutDataSource:
    """Prompt groups in dataset order (shuffled per epoch with `rollout-shuffle`); read-only.

    Every group gets a fresh `group_index` and each sample a fresh `index`, counting from 0 over the whole
    job (both are saved), so ids never repeat across steps. Prompt token ids are rendered once per row.
    """

    def __init__(self, init: DataSourceInit) -> None:
        self.init = init
        self.cursor = PromptCursor(init.items, shuffle=init.shuffle, seed=init.seed)
        self.next_group_index = 0
        self.next_sample_index = 0
        self._encoded: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.init.items)

    def get_groups(self, num_groups: int) -> list[Group]:
        return [self._new_group(item) for item in self.cursor.next_prompts(num_groups)]

    def add_groups(self, groups: list[Group]) -> None:
        if groups:
            raise RuntimeError(
                f"{type(self).__name__} is read-only: over-sampling surplus and partial rollout need "
                "a data source with a buffer (RolloutDataSourceWithBuffer)"
            )

    def _new_group(self, item: PromptItem) -> Group:
        if item.index not in self._encoded:
            self._encoded[item.index] = self.init.formatter.encode(item.prompt, item.tools)
        prompt_ids = self._encoded[item.index]
        group = []
        for _ in range(self.init.n_samples_per_prompt):
            group.append(
                Sample(
                    index=self.next_sample_index,
                    group_index=self.next_group_index,
                    prompt=item.prompt,
                    label=item.label,
                    metadata=dict(item.metadata),
                    tokens=list(prompt_ids),
                )
            )
            self.next_sample_index += 1
        self.next_group_index += 1
        return group

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.cursor.state_dict(),
            "next_group_index": self.next_group_index,
            "next_sample_index": self.next_sample_index,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor.load_state_dict(state)
        self.next_group_index = int(state.get("next_group_index", 0))
        self.next_sample_index = int(state.get("next_sample_index", 0))


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """Relax's default data source: buffer first (through the buffer filter), then the prompt set."""

    def __init__(self, init: DataSourceInit) -> None:
        super().__init__(init)
        self.buffer: list[Group] = []
        self.buffer_filter = init.buffer_filter or pop_first

    def get_groups(self, num_groups: int) -> list[Group]:
        groups = self.buffer_filter(self.buffer, num_groups) if self.buffer else []
        if len(groups) > num_groups:
            raise ValueError(f"buffer filter returned {len(groups)} groups, asked for {num_groups}")
        return groups + super().get_groups(num_groups - len(groups))

    def add_groups(self, groups: list[Group]) -> None:
        for group in groups:
            if len(group) != self.init.n_samples_per_prompt:
                raise ValueError(
                    f"a group of {len(group)} samples cannot go back to the buffer "
                    f"(n-samples-per-prompt is {self.init.n_samples_per_prompt})"
                )
        self.buffer.extend(groups)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "buffer": [[sample.to_state() for sample in group] for group in self.buffer],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.buffer = [[Sample.from_state(s) for s in group] for group in state.get("buffer", [])]
