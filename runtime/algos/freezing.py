"""Which named parameters train: `only-train-params-name-list` / `freeze-params-name-list` regexes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ParameterSelection:
    """The outcome of the two regex lists, in the order the names came in.

    unmatched_patterns lists the patterns that matched no name: usually a typo, or a name in another
    backend's convention (Megatron's `embedding` / `output_layer` vs Hugging Face's `embed_tokens` /
    `lm_head`); callers should warn about them.
    """

    trainable: tuple[str, ...]
    frozen: tuple[str, ...]
    unmatched_patterns: tuple[str, ...]


def _compile(patterns: Sequence[str], flag: str) -> list[re.Pattern[str]]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ValueError(f"{flag}: {pattern!r} is not a valid regular expression ({exc})") from None
    return compiled


def select_trainable_parameters(
    names: Iterable[str],
    *,
    only_train: Sequence[str] | None = None,
    freeze: Sequence[str] | None = None,
) -> ParameterSelection:
    """Split parameter names into trainable and frozen; a pattern matches a name if `re.search` finds it.

    `only_train` (`only-train-params-name-list`): a name trains iff some pattern matches it.
    `freeze` (`freeze-params-name-list`): a name is frozen iff some pattern matches it.
    Neither: everything trains. Both: ValueError (they are exclusive, as in Relax). Selecting no trainable
    parameter at all is a ValueError too (the optimizer would have nothing to do).
    """
    names = list(names)
    if only_train and freeze:
        raise ValueError("only-train-params-name-list and freeze-params-name-list cannot be used together")
    if not only_train and not freeze:
        return ParameterSelection(trainable=tuple(names), frozen=(), unmatched_patterns=())
    flag = "only-train-params-name-list" if only_train else "freeze-params-name-list"
    patterns = list(only_train or freeze or ())
    compiled = _compile(patterns, flag)
    matched = {name: any(p.search(name) for p in compiled) for name in names}
    trains = matched if only_train else {name: not hit for name, hit in matched.items()}
    unmatched = tuple(
        pat for pat, rx in zip(patterns, compiled, strict=True) if not any(map(rx.search, names))
    )
    trainable = tuple(name for name in names if trains[name])
    if not trainable:
        raise ValueError(f"{flag} {patterns} leaves no parameter to train")
    return ParameterSelection(
        trainable=trainable,
        frozen=tuple(name for name in names if not trains[name]),
        unmatched_patterns=unmatched,
    )


def apply_parameter_selection(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]], selection: ParameterSelection
) -> None:
    """Set `requires_grad` from a selection (build the optimizer afterwards, over the trainable ones)."""
    trainable = set(selection.trainable)
    for name, parameter in named_parameters:
        parameter.requires_grad_(name in trainable)
