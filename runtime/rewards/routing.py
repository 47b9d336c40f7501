"""Which reward scores a sample: its metadata ``rm_type``, else `rm-type`, else inference, else the fallback."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runtime.registry import UnknownNameError
from runtime.rewards.rules import BOXED_PREFIX, REMOTE_RM, RULE_REWARDS, UNSUPPORTED_RM_TYPES, split_boxed
from runtime.types import Sample

log = logging.getLogger(__name__)

ZERO_FALLBACK = "zero"  # rm-type-fallback value: score unresolvable samples 0 (with a warning)


class UnsupportedRewardType(ValueError):
    """A Relax rm-type this platform does not provide; the message says why and what to use instead."""


class MissingRewardType(ValueError):
    """A sample that no reward applies to (no metadata rm_type, rm-type, inference or fallback)."""


def known_rm_types() -> list[str]:
    """Every rm-type name that can score (each also with the ``boxed_`` prefix)."""
    return sorted([*RULE_REWARDS.names(), REMOTE_RM])


def check_rm_type(name: str, *, parameter: str = "rm-type") -> tuple[str, bool]:
    """(base name, boxed) of a valid rm-type; raises `UnsupportedRewardType` or `UnknownNameError`.

    >>> check_rm_type("boxed_gsm8k")
    ('gsm8k', True)
    """
    base, boxed = split_boxed(name)
    if base in UNSUPPORTED_RM_TYPES:
        raise UnsupportedRewardType(
            f"{parameter} {name!r} is not supported on this platform: {UNSUPPORTED_RM_TYPES[base]}"
        )
    if base != REMOTE_RM and base not in RULE_REWARDS:
        raise UnknownNameError(
            f"unknown {parameter} {name!r}; valid names: {', '.join(known_rm_types())} "
            f"(each also as {BOXED_PREFIX}<name>), or set custom-rm-path"
        )
    return base, boxed


@dataclass(frozen=True)
class Route:
    """How to score one sample: with `rm_type` (None: a zero from the ``zero`` fallback), on the last
    ``\\boxed{}`` of the response only when `boxed`."""

    rm_type: str | None
    boxed: bool = False


class RewardRouter:
    """Resolves each sample's reward with Relax's precedence:

    1. the explicit type: the sample's ``metadata["rm_type"]``, else `rm-type`. An unsupported Relax type
       raises; an unknown one goes to the fallback when one is set, else raises;
    2. with `rm-type-infer` and no explicit type, the one rule whose label matcher accepts the label
       (math: a bare number; multiple_choice: ``<answer>X</answer>``; gsm8k: ``... #### N``). An inference that
       disagrees with an explicit type only warns: the explicit type wins;
    3. `rm-type-fallback`: ``zero`` scores 0, a registered name scores with that reward; both warn.
    4. otherwise `MissingRewardType`.

    Warnings are logged once per distinct case and counted in `degradations`.
    """

    def __init__(self, rm_type: str | None, *, fallback: str | None = None, infer: bool = False) -> None:
        self.rm_type = (rm_type or "").strip() or None
        self.fallback = (fallback or "").strip() or None
        self.infer = infer
        self.degradations: dict[tuple[str, str], int] = {}
        if self.fallback is not None and self.fallback != ZERO_FALLBACK:
            check_rm_type(self.fallback, parameter="rm-type-fallback")
        if self.rm_type is not None:
            try:
                check_rm_type(self.rm_type)
            except UnknownNameError:
                if self.fallback is None:
                    raise
                log.warning(
                    "rm-type %r is unknown: every sample goes to rm-type-fallback %r", rm_type, fallback
                )

    def uses(self, rm_type: str) -> bool:
        """Whether the spec's own types (rm-type, fallback) name `rm_type` (boxed or not)."""
        return any(split_boxed(name)[0] == rm_type for name in (self.rm_type, self.fallback) if name)

    def route(self, sample: Sample) -> Route:
        metadata = sample.metadata if isinstance(sample.metadata, Mapping) else {}
        explicit = str(metadata.get("rm_type") or self.rm_type or "").strip()
        inferred = self._infer(sample.label, sample.index) if self.infer else None
        if explicit:
            base, boxed = split_boxed(explicit)
            if base in UNSUPPORTED_RM_TYPES:
                raise UnsupportedRewardType(
                    f"sample {sample.index}: rm_type {explicit!r} is not supported on this platform: "
                    f"{UNSUPPORTED_RM_TYPES[base]}"
                )
            if base == REMOTE_RM or base in RULE_REWARDS:
                if inferred is not None and inferred != base:
                    self._note(
                        "conflict", f"{base} (explicit) vs {inferred} (label)", "using the explicit type"
                    )
                return Route(base, boxed)
            if self.fallback is None:
                check_rm_type(explicit, parameter=f"sample {sample.index}: rm_type")  # raises, listing names
            self._note("unknown", explicit, f"using rm-type-fallback {self.fallback!r}")
            return self._fallback_route()
        if inferred is not None:
            return Route(inferred)
        if self.fallback is not None:
            self._note("missing", "", f"using rm-type-fallback {self.fallback!r}")
            return self._fallback_route()
        raise MissingRewardType(
            f"sample {sample.index} has no reward type: set rm-type (or metadata.rm_type on the samples), "
            "custom-rm-path, rm-type-infer or rm-type-fallback"
        )

    def _infer(self, label: Any, index: int) -> str | None:
        matches = [
            name
            for name in RULE_REWARDS.names()
            if (matcher := RULE_REWARDS.get(name).label_matcher) is not None and _safe_match(matcher, label)
        ]
        if len(matches) > 1:
            self._note("ambiguous inference", ", ".join(matches), "inferring nothing")
        return matches[0] if len(matches) == 1 else None

    def _fallback_route(self) -> Route:
        assert self.fallback is not None
        if self.fallback == ZERO_FALLBACK:
            return Route(None)
        base, boxed = split_boxed(self.fallback)
        return Route(base, boxed)

    def _note(self, reason: str, value: str, action: str) -> None:
        key = (reason, value)
        self.degradations[key] = self.degradations.get(key, 0) + 1
        if self.degradations[key] == 1:
            log.warning("reward routing: %s rm_type %r: %s (logged once)", reason, value, action)


def _safe_match(matcher: Any, label: Any) -> bool:
    try:
        return bool(matcher(label))
    except Exception:  # a matcher must never fail scoring; a non-match only means "no inference"
        return False
