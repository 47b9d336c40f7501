"""Typed contracts of user hooks (reward, ...) and loading them by dotted path."""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from runtime.types import Sample


class RewardFn(Protocol):
    """`custom-rm-path` target: the reward of one generated sample (None counts as 0)."""

    def __call__(self, sample: Sample) -> float | None: ...


def load_object(dotted_path: str) -> Any:
    """Import ``package.module.attr`` and return the attribute."""
    module_name, _, attr = dotted_path.rpartition(".")
    if not module_name:
        raise ValueError(f"{dotted_path!r} is not a dotted path like 'package.module.function'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None
