"""Typed contracts of every user hook, and loading hooks by dotted path (Relax's default paths resolve here).

| spec parameter | contract | start with |
| --- | --- | --- |
| `custom-rm-path` | `RewardFn` | `runtime.rewards` rules |
| `rollout-function-path`, `eval-function-path` | `RolloutFn` | `runtime.rollout.loop.generate_rollout` |
| `custom-generate-function-path` | `GenerateFn` | `runtime.rollout.generate.generate_one` |
| `rollout-data-postprocess-path` | `DataPostprocessFn` | (none: a no-op by default) |
| `dynamic-sampling-filter-path` | `DynamicSamplingFilterFn` | `runtime.rollout.filters.check_reward_nonzero_std` |
| `buffer-filter-path` | `BufferFilterFn` | `runtime.data.source.pop_first` |
| `data-source-path` | `DataSourceFactory` | `runtime.data.source.RolloutDataSourceWithBuffer` |
| `sft-oversize-custom-function-path` | `OversizeFn` | `runtime.data.sft.truncate_right` |

Hooks take typed inputs, never Relax's `args` namespace: a function written for Relax needs a small
adapter (its `Sample` is not ours either).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from runtime.types import RolloutBatch, Sample

if TYPE_CHECKING:
    from runtime.data.source import DataSourceInit
    from runtime.rollout.context import GenerateContext, RolloutContext, RolloutOutput


class RewardFn(Protocol):
    """`custom-rm-path` target: the reward of one generated sample (None counts as 0)."""

    def __call__(self, sample: Sample) -> float | None: ...


class GenerateFn(Protocol):
    """`custom-generate-function-path`: produce the response of one pending (or aborted) sample.

    Call `ctx.engine.generate(...)` as often as needed (multi-turn, tool calls), append to
    `sample.tokens`/`response`/`rollout_log_probs`, keep `response_length` and `loss_mask` (0 on tokens the
    policy did not produce) in step, set `status`, and return the sample (or several, e.g. one per turn).
    """

    def __call__(self, sample: Sample, ctx: GenerateContext) -> Sample | list[Sample]: ...


class RolloutFn(Protocol):
    """`rollout-function-path` / `eval-function-path`: one rollout step.

    Training (`evaluation=False`): return `RolloutOutput(groups=...)`, `rollout-batch-size` groups of
    `n-samples-per-prompt` scored samples, drawing prompts from `ctx.data`. Evaluation: return
    `RolloutOutput(datasets={name: samples})`.
    """

    def __call__(
        self, ctx: RolloutContext, rollout_id: int, *, evaluation: bool = False
    ) -> RolloutOutput: ...


class DataPostprocessFn(Protocol):
    """`rollout-data-postprocess-path`: called once log-probs are in `batch`; may edit `batch.loss_mask`
    (or anything else) in place, or return a replacement batch."""

    def __call__(self, samples: list[Sample], batch: RolloutBatch) -> RolloutBatch | None: ...


@dataclass(frozen=True)
class FilterVerdict:
    """What a dynamic sampling filter says about one prompt group; `reason` names the drop metric
    (`rollout/dynamic_filter/drop_<reason>`)."""

    keep: bool
    reason: str | None = None


class DynamicSamplingFilterFn(Protocol):
    """`dynamic-sampling-filter-path`: keep or drop one scored prompt group (a bare bool works too)."""

    def __call__(self, group: list[Sample]) -> FilterVerdict | bool: ...


class BufferFilterFn(Protocol):
    """`buffer-filter-path`: take up to `num_groups` groups out of `buffer` (remove them from it) and
    return them; groups come back to the buffer from over-sampling and partial rollout."""

    def __call__(self, buffer: list[list[Sample]], num_groups: int) -> list[list[Sample]]: ...


class DataSource(Protocol):
    """What the rollout draws prompt groups from; its state goes into every checkpoint."""

    def get_groups(self, num_groups: int) -> list[list[Sample]]: ...

    def add_groups(self, groups: list[list[Sample]]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def __len__(self) -> int: ...


class DataSourceFactory(Protocol):
    """`data-source-path`: a class (or function) building the data source from the prompt set."""

    def __call__(self, init: DataSourceInit) -> DataSource: ...


class OversizeFn(Protocol):
    """`sft-oversize-custom-function-path` (Relax's signature): trim one SFT sample to `capacity` tokens.
    `loss_mask` has one entry per token; return None to drop the sample."""

    def __call__(
        self, tokens: list[int], loss_mask: list[int], capacity: int, idx: int
    ) -> tuple[list[int], list[int]] | None: ...


# Relax's dotted paths -> this runtime's implementations, so unchanged Relax configs run here.
RELAX_ALIASES: dict[str, str] = {
    "relax.engine.rollout.sglang_rollout.generate_rollout": "runtime.rollout.loop.generate_rollout",
    "relax.engine.rollout.sglang_rollout.eval_rollout": "runtime.rollout.loop.generate_rollout",
    "relax.engine.rollout.sglang_rollout.generate": "runtime.rollout.generate.generate_one",
    "relax.engine.filters.dynamic_sampling_filters.check_reward_nonzero_std": (
        "runtime.rollout.filters.check_reward_nonzero_std"
    ),
    "relax.engine.rollout.data_source.RolloutDataSourceWithBuffer": (
        "runtime.data.source.RolloutDataSourceWithBuffer"
    ),
    "relax.engine.rollout.data_source.RolloutDataSource": "runtime.data.source.RolloutDataSource",
    "relax.engine.rollout.data_source.pop_first": "runtime.data.source.pop_first",
}


def resolve_path(dotted_path: str) -> str:
    """The module path a spec's dotted path really loads (Relax defaults map to ours)."""
    return RELAX_ALIASES.get(dotted_path, dotted_path)


def load_object(dotted_path: str) -> Any:
    """Import ``package.module.attr`` (after mapping Relax's defaults) and return the attribute."""
    module_name, _, attr = resolve_path(dotted_path).rpartition(".")
    if not module_name:
        raise ValueError(f"{dotted_path!r} is not a dotted path like 'package.module.function'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None


def load_hook(dotted_path: str | None, parameter: str) -> Callable[..., Any] | None:
    """Load the hook a parameter names; errors say which parameter held the bad path."""
    if not dotted_path:
        return None
    try:
        hook = load_object(dotted_path)
    except (ImportError, ValueError) as exc:
        raise ValueError(f"{parameter}={dotted_path!r}: {exc}") from exc
    if not callable(hook):
        raise ValueError(f"{parameter}={dotted_path!r} is not callable")
    return hook
