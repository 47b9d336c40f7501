"""The reward stage's entry point: `RewardModel.from_spec(spec).score(samples)` fills `sample.reward`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import math
import threading
import weakref
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from runtime.rewards.hooks import (
    BUILTIN_ROUTING,
    RELAX_CUSTOM_RM_ALIASES,
    RELAX_DEFAULT_POST_PROCESS_PATHS,
    LoadedHook,
    RewardHookError,
    SpecArgs,
    load_hook,
)
from runtime.rewards.remote import RemoteRewardModel, RetryPolicy, open_remote
from runtime.rewards.routing import RewardRouter
from runtime.rewards.rules import REMOTE_RM, RULE_REWARDS, RewardValue, boxed_response
from runtime.types import Sample

log = logging.getLogger(__name__)
T = TypeVar("T")

REWARD_DETAIL_KEY = "reward_detail"  # metadata key keeping a reward function's dict answer, for logging
DEFAULT_DICT_KEYS = ("score", "reward")  # picked from a dict reward, in order, when no reward-key is set


class RewardValueError(ValueError):
    """A reward function's answer that is not a usable scalar (missing key, not a number, NaN)."""


@dataclass(frozen=True)
class RewardConfig:
    """The reward parameters of a spec (Relax names, underscored; Relax defaults)."""

    rm_type: str | None = None
    rm_type_fallback: str | None = None  # "zero", or an rm-type for unknown/missing types
    rm_type_infer: bool = False  # infer the type from the label when none is given
    custom_rm_path: str | None = None
    reward_max_concurrency: int = 64  # in-flight remote requests / custom calls (a group call counts once)
    reward_num_workers: int = 16  # Relax's sync-reward Ray actors; unused here (sync rewards run inline)
    reward_key: str | None = None
    eval_reward_key: str | None = None  # None: reward_key
    group_rm: bool = False
    rm_url: str | None = None
    custom_reward_post_process_path: str | None = None

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> RewardConfig:
        """From flat spec values; keys may be dashed or underscored; other keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        picked = {}
        for raw_key, value in values.items():
            key = str(raw_key).lstrip("-").replace("-", "_")
            if key in names and value is not None:
                picked[key] = value
        config = cls(**picked)
        if config.reward_max_concurrency < 1:
            raise ValueError("reward-max-concurrency must be at least 1")
        return config

    def key_for(self, eval_mode: bool) -> str | None:
        return (self.eval_reward_key or self.reward_key) if eval_mode else self.reward_key

    def values(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def reward_scalar(value: RewardValue, key: str | None) -> float:
    """The float a reward function's answer stands for. Numbers (and bools) are used as they are, also when
    a key is set; None is 0; a dict gives ``value[key]``, or with no key its ``score`` or ``reward``.

    >>> reward_scalar(True, None), reward_scalar({"acc": 1, "score": -1.0}, "acc"), reward_scalar({"score": 0.5}, None)
    (1.0, 1.0, 0.5)
    """
    if value is None:
        return 0.0
    if isinstance(value, Mapping):
        if key is not None:
            if key not in value:
                raise RewardValueError(
                    f"reward-key {key!r} is not in the reward dict (keys: {sorted(value)})"
                )
            return reward_scalar(value[key], None)
        for default_key in DEFAULT_DICT_KEYS:
            if default_key in value:
                return reward_scalar(value[default_key], None)
        raise RewardValueError(f"the reward is a dict (keys: {sorted(value)}); set reward-key to pick one")
    if isinstance(value, bool | int | float) or hasattr(value, "__float__"):
        number = float(value)  # type: ignore[arg-type]
        if not math.isfinite(number):
            raise RewardValueError(f"the reward is {number}, not a finite number")
        return number
    raise RewardValueError(f"the reward is a {type(value).__name__} ({value!r:.80}), not a number or a dict")


class PrivateEventLoop:
    """An event loop kept for the life of a `RewardModel`, so loop-bound state of async hooks (a client session
    cached by a Relax-style reward function) survives from one step to the next. Coroutines run in the
    calling thread (sync hooks then run there too: signal-based timeouts need the main thread), or in a
    helper thread when the calling thread already runs an event loop (an async Ray actor)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._lock = threading.RLock()
        self._finalizer = weakref.finalize(self, self._loop.close)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return self._loop.run_until_complete(coroutine)
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                return pool.submit(self._loop.run_until_complete, coroutine).result()

    def close(self) -> None:
        with self._lock:
            self._finalizer()


async def _gather_or_cancel(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """`asyncio.gather`, but the first failure cancels the rest and is raised as it is."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def group_samples(samples: Sequence[Sample]) -> list[list[Sample]]:
    """Samples grouped by `group_index`, groups in order of first appearance, samples in batch order."""
    groups: dict[int, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.group_index, []).append(sample)
    return list(groups.values())


class RewardModel:
    """Scores batches of samples in place; build it once per job with `from_spec`.

    Precedence per sample: `custom-rm-path` (bypasses routing) > ``metadata["rm_type"]`` > `rm-type` >
    `rm-type-infer` > `rm-type-fallback` (see `RewardRouter`). `score` fills ``sample.reward`` with a float;
    when the reward function answered a dict, the dict is kept in ``sample.metadata["reward_detail"]`` and
    `reward-key` (`eval-reward-key` in eval mode) picks the float.
    """

    def __init__(
        self,
        config: RewardConfig,
        *,
        args: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.config = config
        self.retry = retry or RetryPolicy()
        self.args = SpecArgs({**config.values(), **(args or {})})
        self.custom: LoadedHook | None = None
        forced_type: str | None = None
        path = config.custom_rm_path
        if path in RELAX_CUSTOM_RM_ALIASES:
            alias = RELAX_CUSTOM_RM_ALIASES[path]
            forced_type = None if alias == BUILTIN_ROUTING else alias
        elif path:
            self.custom = load_hook(path, parameter="custom-rm-path")
        self.router: RewardRouter | None = None
        if self.custom is None:
            self.router = RewardRouter(
                forced_type or config.rm_type, fallback=config.rm_type_fallback, infer=config.rm_type_infer
            )
            if self.router.uses(REMOTE_RM) and not config.rm_url:
                raise ValueError("rm-type remote_rm needs rm-url (the reward model's HTTP endpoint)")
        self._loop = PrivateEventLoop()
        self.post_process_hook: LoadedHook | None = None
        post_path = config.custom_reward_post_process_path
        if post_path and post_path not in RELAX_DEFAULT_POST_PROCESS_PATHS:
            self.post_process_hook = load_hook(post_path, parameter="custom-reward-post-process-path")

    @classmethod
    def from_spec(cls, spec: Any, *, retry: RetryPolicy | None = None) -> RewardModel:
        """From a `RuntimeSpec` (its fields and `extra`) or a flat mapping of spec values. Every spec value is
        also what hooks see as `args`."""
        values = dict(spec) if isinstance(spec, Mapping) else dict(spec.values())
        values = {str(k).lstrip("-").replace("-", "_"): v for k, v in values.items()}
        return cls(RewardConfig.from_values(values), args=values, retry=retry)

    # -- scoring ----------------------------------------------------------------------------------------------
    def score(self, samples: list[Sample], *, eval_mode: bool = False) -> list[float]:
        """Score `samples` in place and return their rewards (floats, in order). Blocking."""
        return self._loop.run(self.ascore(samples, eval_mode=eval_mode))

    async def ascore(self, samples: list[Sample], *, eval_mode: bool = False) -> list[float]:
        """`score` for callers that run an event loop."""
        if not samples:
            return []
        key = self.config.key_for(eval_mode)
        if self.custom is not None:
            values, sources = await self._score_custom(samples)
        else:
            values, sources = await self._score_routed(samples)
        for sample, value, source in zip(samples, values, sources, strict=True):
            if isinstance(value, Mapping):
                sample.metadata[REWARD_DETAIL_KEY] = dict(value)
            try:
                sample.reward = reward_scalar(value, key)
            except RewardValueError as exc:
                raise RewardValueError(f"sample {sample.index} ({source}): {exc}") from None
        return [float(s.reward) for s in samples]  # type: ignore[arg-type]

    async def _score_custom(self, samples: list[Sample]) -> tuple[list[Any], list[str]]:
        assert self.custom is not None
        hook = self.custom
        limit = asyncio.Semaphore(self.config.reward_max_concurrency)
        source = f"custom-rm-path {hook.path!r}"

        async def one(target: Sample | list[Sample]) -> Any:
            async with limit:
                try:
                    return await hook.call(self.args, target)
                except Exception as exc:
                    where = (
                        f"group {target[0].group_index} ({len(target)} samples)"
                        if isinstance(target, list)
                        else f"sample {target.index} (group {target.group_index})"
                    )
                    raise RewardHookError(f"{source} failed on {where}: {type(exc).__name__}: {exc}") from exc

        if not self.config.group_rm:
            return await _gather_or_cancel([one(s) for s in samples]), [source] * len(samples)
        groups = group_samples(samples)
        answers = await _gather_or_cancel([one(group) for group in groups])
        by_sample: dict[int, Any] = {}
        for group, answer in zip(groups, answers, strict=True):
            if hasattr(answer, "tolist"):
                answer = answer.tolist()
            if not isinstance(answer, Sequence) or isinstance(answer, str) or len(answer) != len(group):
                got = f"{len(answer)} values" if isinstance(answer, Sequence) else type(answer).__name__
                raise RewardHookError(
                    f"{source} with group-rm must return one reward per sample: group "
                    f"{group[0].group_index} has {len(group)} samples, it returned {got}"
                )
            for sample, value in zip(group, answer, strict=True):
                by_sample[id(sample)] = value
        return [by_sample[id(s)] for s in samples], [source] * len(samples)

    async def _score_routed(self, samples: list[Sample]) -> tuple[list[Any], list[str]]:
        assert self.router is not None
        values: list[Any] = [None] * len(samples)
        sources: list[str] = [""] * len(samples)
        remote: list[tuple[int, str | None]] = []  # (position, response override for boxed_remote_rm)
        for position, sample in enumerate(samples):
            route = self.router.route(sample)
            sources[position] = f"rm-type {'boxed_' if route.boxed else ''}{route.rm_type or 'zero fallback'}"
            if route.rm_type is None:
                values[position] = 0.0
            elif route.rm_type == REMOTE_RM:
                remote.append((position, boxed_response(sample.response) if route.boxed else None))
            else:
                rule = RULE_REWARDS.get(route.rm_type)
                boxed = route.boxed and not rule.grades_box
                response = boxed_response(sample.response) if boxed else sample.response
                try:
                    values[position] = rule(response, sample.label, sample.metadata)
                except Exception as exc:
                    raise RuntimeError(
                        f"sample {sample.index}: {sources[position]} failed: {type(exc).__name__}: {exc}"
                    ) from exc
        if remote:
            if not self.config.rm_url:
                index = samples[remote[0][0]].index
                raise ValueError(f"sample {index} asks for rm_type remote_rm but rm-url is not set")
            concurrency = self.config.reward_max_concurrency
            async with open_remote(self.config.rm_url, concurrency=concurrency, policy=self.retry) as client:
                answers = await self._score_remote(client, samples, remote)
            for (position, _), answer in zip(remote, answers, strict=True):
                values[position] = answer
        return values, sources

    async def _score_remote(
        self, client: RemoteRewardModel, samples: list[Sample], remote: list[tuple[int, str | None]]
    ) -> list[Any]:
        if not self.config.group_rm:
            return await _gather_or_cancel([client.score(samples[p], response) for p, response in remote])
        override = dict(remote)
        groups = group_samples([samples[p] for p, _ in remote])
        position_of = {id(samples[p]): p for p, _ in remote}
        answers = await _gather_or_cancel(
            [client.score_group(g, [override[position_of[id(s)]] for s in g]) for g in groups]
        )
        by_position = {
            position_of[id(s)]: value
            for group, values in zip(groups, answers, strict=True)
            for s, value in zip(group, values, strict=True)
        }
        return [by_position[p] for p, _ in remote]

    def close(self) -> None:
        """Close the private event loop (also done when the model is garbage-collected)."""
        self._loop.close()

    def __getstate__(self) -> dict[str, Any]:  # picklable for Ray: the copy gets an event loop of its own
        state = dict(self.__dict__)
        del state["_loop"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._loop = PrivateEventLoop()

    # -- rewards for the advantage estimator ---------------------------------------------------------------------
    @property
    def replaces_reward_normalization(self) -> bool:
        """True when `custom-reward-post-process-path` is set: in Relax it replaces the default GRPO group
        normalisation, so the advantage estimator must not normalise its output again."""
        return self.post_process_hook is not None

    def post_process(self, samples: list[Sample]) -> list[float]:
        """The rewards the advantage estimator gets, one per scored sample: the raw rewards (the estimator
        normalises them per group), or the custom post-process function's answer."""
        if self.post_process_hook is None:
            return [float(s.reward or 0.0) for s in samples]
        hook = self.post_process_hook
        try:
            answer = self._loop.run(hook.call(self.args, samples))
        except Exception as exc:
            raise RewardHookError(
                f"custom-reward-post-process-path {hook.path!r} failed on {len(samples)} samples: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(answer, tuple) and len(answer) == 2:  # Relax's (raw_rewards, rewards)
            answer = answer[1]
        if hasattr(answer, "tolist"):
            answer = answer.tolist()
        if not isinstance(answer, Sequence) or len(answer) != len(samples):
            got = f"{len(answer)} values" if isinstance(answer, Sequence) else type(answer).__name__
            raise RewardHookError(
                f"custom-reward-post-process-path {hook.path!r} must return one reward per sample "
                f"({len(samples)}); it returned {got}"
            )
        return [reward_scalar(value, None) for value in answer]


class RewardScorer(RewardModel):
    """The reward stage's first constructor, kept so ``RewardScorer(spec.rm_type, spec.custom_rm_path)`` still
    works; new code calls `RewardModel.from_spec(spec)`, which also reads the other reward parameters."""

    def __init__(self, rm_type: str | None, custom_rm_path: str | None = None) -> None:
        super().__init__(RewardConfig(rm_type=rm_type, custom_rm_path=custom_rm_path))
