"""Where a training step's rollout comes from: generated now, loaded from saved debug data, or generated
ahead of the trainer on a background thread (fully-async mode, bounded by `max-staleness`).

Every source hands out `RolloutOutput`s in rollout-id order, each with the data source's state as of
that rollout (`data_state`), which is what the checkpoint after training it records.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from runtime.rollout.context import RolloutContext, RolloutOutput
from runtime.types import Sample

log = logging.getLogger(__name__)

ROLLOUT_ID_PLACEHOLDER = "{rollout_id}"


class RolloutSource(Protocol):
    def start(self, first_rollout_id: int) -> None: ...

    def collect(self, rollout_id: int) -> RolloutOutput: ...

    def trained(self, steps_done: int) -> None:
        """The trainer has finished `steps_done` steps (fully-async sources may run further ahead)."""

    def close(self) -> None: ...


RolloutFnCall = Callable[[RolloutContext, int], RolloutOutput]


def debug_data_path(template: str, rollout_id: int) -> Path:
    return Path(template.replace(ROLLOUT_ID_PLACEHOLDER, str(rollout_id)))


def save_debug_rollout(template: str, rollout_id: int, output: RolloutOutput) -> Path:
    """`save-debug-rollout-data`: the step's scored groups (every sample field) and rollout metrics."""
    path = debug_data_path(template, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "rollout_id": rollout_id,
        "groups": [[s.to_state() for s in group] for group in output.groups],
        "metrics": dict(output.metrics),
    }
    torch.save(payload, path)
    return path


def load_debug_rollout(
    template: str, rollout_id: int, *, subsample: float | None, seed: int
) -> RolloutOutput:
    """`load-debug-rollout-data` (+ `load-debug-rollout-data-subsample`: a seeded fraction of the groups)."""
    path = debug_data_path(template, rollout_id)
    if not path.is_file():
        raise FileNotFoundError(
            f"load-debug-rollout-data: no rollout data for rollout {rollout_id} at {path}"
        )
    payload = torch.load(path, weights_only=True)
    groups = [[Sample.from_state(s) for s in group] for group in payload["groups"]]
    if subsample is not None and 0 < subsample < 1:
        keep = max(1, math.ceil(len(groups) * subsample))
        picked = sorted(random.Random(seed * 1_000_003 + rollout_id).sample(range(len(groups)), keep))
        groups = [groups[i] for i in picked]
    return RolloutOutput(groups=groups, metrics=dict(payload.get("metrics", {})))


class LiveRollout:
    """Generate each step when the trainer asks for it (synchronous RL)."""

    def __init__(
        self, ctx: RolloutContext, rollout_fn: RolloutFnCall, *, save_debug: str | None = None
    ) -> None:
        self.ctx = ctx
        self.rollout_fn = rollout_fn
        self.save_debug = save_debug

    def start(self, first_rollout_id: int) -> None:
        pass

    def collect(self, rollout_id: int) -> RolloutOutput:
        output = self.rollout_fn(self.ctx, rollout_id)
        if not output.groups:
            raise RuntimeError(f"the rollout function returned no sample groups for rollout {rollout_id}")
        output.data_state = self.ctx.data.state_dict()
        if self.save_debug:
            save_debug_rollout(self.save_debug, rollout_id, output)
        return output

    def trained(self, steps_done: int) -> None:
        pass

    def close(self) -> None:
        pass


class LoadedRollout:
    """`load-debug-rollout-data`: replay saved rollouts, no engines."""

    def __init__(self, template: str, *, subsample: float | None, seed: int) -> None:
        self.template = template
        self.subsample = subsample
        self.seed = seed

    def start(self, first_rollout_id: int) -> None:
        pass

    def collect(self, rollout_id: int) -> RolloutOutput:
        return load_debug_rollout(self.template, rollout_id, subsample=self.subsample, seed=self.seed)

    def trained(self, steps_done: int) -> None:
        pass

    def close(self) -> None:
        pass


class StalenessGate:
    """Fully-async bookkeeping: rollout `r` may start generating once the trainer has finished
    `r - max_staleness` steps, so its samples are at most `max_staleness` weight updates older than the
    policy that trains on them.

    >>> gate = StalenessGate(max_staleness=2, trained=0)
    >>> [gate.may_start(r) for r in range(4)]
    [True, True, True, False]
    >>> gate.trained = 1
    >>> gate.may_start(3)
    True
    """

    def __init__(self, max_staleness: int, trained: int) -> None:
        if max_staleness < 0:
            raise ValueError("max-staleness must be >= 0")
        self.max_staleness = max_staleness
        self.trained = trained

    def may_start(self, rollout_id: int) -> bool:
        return rollout_id - self.trained <= self.max_staleness


class AheadRollout:
    """Fully-async mode: a background thread runs the rollout function for the next ids while the trainer
    trains, never more than `max-staleness` steps ahead of it (`StalenessGate`). Weight updates reach the
    engines between two generate calls, so a rollout can mix versions; samples record theirs."""

    def __init__(self, inner: LiveRollout, *, max_staleness: int, last_rollout_id: int) -> None:
        self.inner = inner
        self.last_rollout_id = last_rollout_id
        self.gate = StalenessGate(max_staleness, trained=0)
        self._cond = threading.Condition()
        self._ready: dict[int, RolloutOutput] = {}
        self._error: BaseException | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self, first_rollout_id: int) -> None:
        self.gate.trained = first_rollout_id
        self._thread = threading.Thread(
            target=self._run, args=(first_rollout_id,), name="rollout-ahead", daemon=True
        )
        self._thread.start()

    def _run(self, rollout_id: int) -> None:
        try:
            while rollout_id < self.last_rollout_id:
                with self._cond:
                    while not (self._stopping or self.gate.may_start(rollout_id)):
                        self._cond.wait()
                    if self._stopping:
                        return
                output = self.inner.collect(rollout_id)
                output.metrics["rollout/ahead_of_trainer"] = float(rollout_id - self.gate.trained)
                with self._cond:
                    self._ready[rollout_id] = output
                    self._cond.notify_all()
                rollout_id += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the driver thread by collect()
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def collect(self, rollout_id: int) -> RolloutOutput:
        with self._cond:
            while rollout_id not in self._ready:
                if self._error is not None:
                    raise RuntimeError(f"fully-async rollout failed: {self._error}") from self._error
                self._cond.wait(timeout=1.0)
            return self._ready.pop(rollout_id)

    def trained(self, steps_done: int) -> None:
        with self._cond:
            self.gate.trained = steps_done
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            deadline = time.monotonic() + 60
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
