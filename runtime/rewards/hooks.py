"""User reward hooks: their typed contracts, the read-only `args` they receive, and loading them by dotted path."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from runtime.plugins import load_object
from runtime.rewards.rules import REMOTE_RM, RewardValue
from runtime.types import Sample


# ---- contracts ---------------------------------------------------------------------------------------------
class SampleRewardFn(Protocol):
    """`custom-rm-path` without `group-rm` (Relax's signature): the reward of one sample; sync or async.
    ``def fn(sample) -> float`` (no `args`) is accepted too."""

    def __call__(self, args: SpecArgs, sample: Sample) -> RewardValue | Awaitable[RewardValue]: ...


class GroupRewardFn(Protocol):
    """`custom-rm-path` with `group-rm`: the rewards of one prompt's samples, one per sample, in order."""

    def __call__(
        self, args: SpecArgs, samples: list[Sample]
    ) -> Sequence[RewardValue] | Awaitable[Sequence[RewardValue]]: ...


class RewardPostProcessFn(Protocol):
    """`custom-reward-post-process-path`: the rewards the advantage estimator gets, one per sample, given the
    scored batch; Relax's ``(raw_rewards, rewards)`` tuple is accepted (its second list is used)."""

    def __call__(
        self, args: SpecArgs, samples: list[Sample]
    ) -> Sequence[float] | tuple[Sequence[float], Sequence[float]]: ...


class RewardHookError(RuntimeError):
    """A user reward hook failed to load or to run; the message names its path (and the samples)."""


# ---- args --------------------------------------------------------------------------------------------------
class SpecArgs:
    """The read-only `args` a hook receives: the job's spec values as attributes, underscore names
    (``args.rm_url``, ``args.n_samples_per_prompt``), plus Relax's positive spellings of the two
    normalisation switches (``rewards_normalization``, ``grpo_std_normalization``). Setting raises.

    >>> args = SpecArgs({"reward_key": "acc", "disable_rewards_normalization": True})
    >>> args.reward_key, args.rewards_normalization, getattr(args, "missing", None)
    ('acc', False, None)
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        merged = dict(values)
        for relax_name, our_name in (
            ("rewards_normalization", "disable_rewards_normalization"),
            ("grpo_std_normalization", "disable_grpo_std_normalization"),
        ):
            if our_name in merged and relax_name not in merged:
                merged[relax_name] = not merged[our_name]
        object.__setattr__(self, "_values", MappingProxyType(merged))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"the spec has no parameter {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"args is read-only (tried to set {name!r}); keep hook state elsewhere")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"args is read-only (tried to delete {name!r})")

    def __reduce__(self) -> tuple[type[SpecArgs], tuple[dict[str, Any]]]:
        return (SpecArgs, (dict(self._values),))

    def __repr__(self) -> str:
        return f"SpecArgs({len(self._values)} parameters)"

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


# ---- loading -----------------------------------------------------------------------------------------------
# Relax's own reward entry points, when a Relax config names them as hooks, mean "the built-in behaviour":
# they resolve to ours instead of importing Relax.
BUILTIN_ROUTING = "builtin"  # score by rm-type routing, as if custom-rm-path were unset
RELAX_CUSTOM_RM_ALIASES: dict[str, str] = {
    "relax.engine.rewards.async_rm": BUILTIN_ROUTING,
    "relax.engine.rewards.batched_async_rm": BUILTIN_ROUTING,
    "relax.engine.rewards.remote_rm": REMOTE_RM,  # every sample goes to rm-url
}
# Relax's default post-process (group normalisation) is what our advantage estimator already does.
RELAX_DEFAULT_POST_PROCESS_PATHS = frozenset({"relax.utils.utils.post_process_rewards"})


def takes_args_first(fn: Callable[..., Any]) -> bool:
    """Whether `fn` wants Relax's ``(args, sample_or_samples)`` rather than just ``(sample_or_samples)``:
    two or more required positional parameters, or none (``*args``).

    >>> takes_args_first(lambda args, sample: 1.0), takes_args_first(lambda sample, scale=2.0: 1.0)
    (True, False)
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables: assume Relax's form
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [
        p
        for p in signature.parameters.values()
        if p.kind in positional and p.default is inspect.Parameter.empty
    ]
    return len(required) != 1


@dataclass(frozen=True)
class LoadedHook:
    """A user function with the calling convention its signature asked for."""

    path: str
    fn: Callable[..., Any]
    args_first: bool

    async def call(self, args: SpecArgs, target: Any) -> Any:
        """Call with (args, target) or (target); await the result when the function is async."""
        result = self.fn(args, target) if self.args_first else self.fn(target)
        if inspect.isawaitable(result):
            result = await result
        return result


def load_hook(path: str, *, parameter: str) -> LoadedHook:
    """Import the callable at dotted `path` (named after its spec `parameter` in errors)."""
    try:
        fn = load_object(path)
    except (ImportError, ValueError) as exc:
        raise RewardHookError(f"{parameter} {path!r} cannot be loaded: {exc}") from exc
    if not callable(fn):
        raise RewardHookError(f"{parameter} {path!r} is a {type(fn).__name__}, not a function")
    return LoadedHook(path, fn, takes_args_first(fn))
