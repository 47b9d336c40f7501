"""The Ray side of elastic rollout (`--autoscaler-config`): the rollout role's engines grow and shrink
between steps (`runtime.rollout.elastic` decides when, and holds the settings).

Scale-out of n engines, all within `--scale-out-timeout` (one deadline for the whole operation):
1. n new engine actors start: engine i on the role's placement-group bundle i while there is one (the
   engines the job's `resource` asks for: their GPUs stay the job's while they are scaled in), beyond
   that with one engine's resources wherever the pool has them free, which only a job that Ray places
   itself may do (a standalone run): where the scheduling pass placed the job (`RolePlan.gpu_nodes`),
   engines beyond the bundles would take GPUs the pass did not give it, so the role stays within them;
2. each must answer `ready` (its model loaded, its server up) before the deadline;
3. under the group's lock (no weight push can come between), each loads the weights the group's engines
   hold now and must report exactly that version (`RolloutGroup.load_current_weights`);
4. `--scale-out-partial-success-policy`: rollback_all kills every new engine if any failed, keep_partial
   keeps those that passed; the kept ones join the group (still under the lock).

Scale-in of n engines (the newest first, never below one):
1. under the lock they leave the group: no new request goes to them;
2. drain: each gets until `--scale-in-drain-timeout` to finish the calls already queued on it (actor calls
   run in order: a `ready` call answers once they are done); past it, an engine server's requests are
   aborted (`abort(abort_all=True)`);
3. shutdown: an engine server is asked to stop (`shutdown`) within `--scale-in-shutdown-timeout`; then
   (or at once, for the built-in in-process engine) its actor is killed.

Each operation is logged with its timings and counted in the step metrics `rollout/engines`,
`rollout/scale_outs`, `rollout/scale_ins`, `rollout/scale_out_failures`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.actor import ActorHandle

from runtime.rollout.elastic import Autoscaler, ElasticSettings, settle_scale_out

if TYPE_CHECKING:
    from runtime.roles.groups import RolloutGroup

log = logging.getLogger("runtime.roles.elastic")


@dataclass
class ScaleOutcome:
    """What one scale operation did: engines before and after, the failures (index -> why), seconds."""

    before: int
    after: int
    failures: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0
    aborted: int = 0  # scale-in: engines whose in-flight requests were aborted after the drain timeout
    killed: int = 0  # scale-in: engine servers that did not stop within the shutdown timeout (then killed)


@dataclass
class ElasticRollout:
    """Scales one `RolloutGroup` (see the module docstring). `start_engine(index)` starts engine `index`
    (an actor of the role's class and arguments, off the placement group)."""

    group: RolloutGroup
    start_engine: Callable[[int], ActorHandle]
    settings: ElasticSettings
    # the most engines it may run (the bundles of the role's placement group where the scheduler placed the
    # job); None: the autoscaler's max_engines
    limit: int | None = None
    autoscaler: Autoscaler = field(init=False)
    scale_outs: int = field(default=0, init=False)
    scale_ins: int = field(default=0, init=False)
    scale_out_failures: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.autoscaler = Autoscaler(self.settings.autoscaler)

    # -- between steps ------------------------------------------------------------------------------------------
    def after_step(self, step: int, rollout_s: float, step_s: float) -> dict[str, float]:
        """The autoscaler's decision for this step, carried out; the step metrics."""
        engines = len(self.group.actors)
        share = rollout_s / step_s if step_s > 0 else 0.0
        target = self.autoscaler.target(step, engines, share)
        if self.limit is not None and target > max(self.limit, engines):
            log.info(
                "rollout scale-out to %d engines held at %d: engines beyond the role's placement group "
                "need GPUs the scheduling pass grants (not yet)",
                target,
                max(self.limit, engines),
            )
            target = max(self.limit, engines)
        if target > engines:
            outcome = self.scale_out(target - engines)
            if outcome.after != outcome.before:
                self.autoscaler.scaled(step)
        elif target < engines:
            self.scale_in(engines - target)
            self.autoscaler.scaled(step)
        return self.metrics(share)

    def metrics(self, share: float | None = None) -> dict[str, float]:
        out = {
            "rollout/engines": float(len(self.group.actors)),
            "rollout/scale_outs": float(self.scale_outs),
            "rollout/scale_ins": float(self.scale_ins),
            "rollout/scale_out_failures": float(self.scale_out_failures),
        }
        if share is not None:
            out["rollout/step_share"] = share
        return out

    # -- scale-out ----------------------------------------------------------------------------------------------
    def scale_out(self, count: int) -> ScaleOutcome:
        s = self.settings
        started = time.perf_counter()
        deadline = time.monotonic() + s.scale_out_timeout_s
        before = len(self.group.actors)
        indexes = list(range(before, before + count))
        actors: dict[int, ActorHandle] = {}
        failures: dict[int, str] = {}
        for index in indexes:
            try:
                actors[index] = self.start_engine(index)
            except Exception as exc:  # noqa: BLE001 - reported as this engine's failure
                failures[index] = f"could not start: {_first_line(exc)}"
        ready: list[int] = []
        pending = {actor.ready.remote(): index for index, actor in actors.items()}
        while pending:
            left = deadline - time.monotonic()
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, left))
            if not done:
                for index in pending.values():
                    failures[index] = f"not ready within --scale-out-timeout={s.scale_out_timeout_s:g} s"
                break
            index = pending.pop(done[0])
            try:
                ray.get(done[0])
                ready.append(index)
            except Exception as exc:  # noqa: BLE001
                failures[index] = f"failed to start: {_first_line(exc)}"
        with self.group.lock:
            for index in sorted(ready):
                left = deadline - time.monotonic()
                try:
                    if left <= 0:
                        raise TimeoutError(f"no time left of --scale-out-timeout={s.scale_out_timeout_s:g} s")
                    self.group.load_current_weights(actors[index], left)
                except Exception as exc:  # noqa: BLE001
                    failures[index] = f"weight sync failed: {_first_line(exc)}"
            keep = settle_scale_out([i not in failures for i in indexes], s.partial_success)
            for index, kept in zip(indexes, keep, strict=True):
                actor = actors.get(index)
                if kept and actor is not None:
                    self.group.actors.append(actor)
                elif actor is not None:
                    _kill(actor)
        outcome = ScaleOutcome(before, len(self.group.actors), failures, time.perf_counter() - started)
        if failures:
            self.scale_out_failures += 1
            log.warning(
                "rollout scale-out of %d engine(s) %s in %.1f s (%s): %s",
                count,
                "rolled back" if outcome.after == before else f"kept {outcome.after - before}",
                outcome.seconds,
                s.partial_success.value,
                "; ".join(f"engine {i}: {why}" for i, why in sorted(failures.items())),
            )
        else:
            log.info(
                "rollout scaled out %d -> %d engines in %.1f s (weights version %d)",
                before,
                outcome.after,
                outcome.seconds,
                self.group.weight_version,
            )
        if outcome.after > before:
            self.scale_outs += 1
        return outcome

    # -- scale-in -----------------------------------------------------------------------------------------------
    def scale_in(self, count: int) -> ScaleOutcome:
        s = self.settings
        started = time.perf_counter()
        with self.group.lock:
            before = len(self.group.actors)
            count = min(count, before - 1)
            if count <= 0:
                return ScaleOutcome(before, before)
            leaving = self.group.actors[before - count :]
            del self.group.actors[before - count :]
        drained = {a.ready.remote(): a for a in leaving}
        done, not_done = ray.wait(list(drained), num_returns=len(drained), timeout=s.drain_timeout_s)
        aborted = 0
        for ref in not_done:  # past the drain timeout: abort what it still runs
            actor = drained[ref]
            if _has(actor, "abort"):
                try:
                    ray.get(actor.abort.remote(abort_all=True), timeout=s.shutdown_timeout_s)
                except Exception:  # noqa: BLE001 - it is killed below in any case
                    log.debug("abort on a leaving engine failed", exc_info=True)
            aborted += 1
        killed = 0
        graceful = [a.shutdown.remote() for a in leaving if _has(a, "shutdown")]
        if graceful:
            _, late = ray.wait(graceful, num_returns=len(graceful), timeout=s.shutdown_timeout_s)
            killed = len(late)
        for actor in leaving:  # the built-in engine has no server to stop: its actor goes at once
            _kill(actor)
        self.scale_ins += 1
        outcome = ScaleOutcome(
            before, before - count, seconds=time.perf_counter() - started, aborted=aborted, killed=killed
        )
        log.info(
            "rollout scaled in %d -> %d engines in %.1f s (%d drained, %d aborted after "
            "--scale-in-drain-timeout=%g s)",
            before,
            outcome.after,
            outcome.seconds,
            len(done),
            aborted,
            s.drain_timeout_s,
        )
        return outcome


def _has(actor: ActorHandle, method: str) -> bool:
    return hasattr(actor, method)  # an actor handle has an attribute for each method of its class


def _kill(actor: ActorHandle) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        log.debug("engine actor already gone", exc_info=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def engine_starter(
    actor_class: type,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    slots: list[dict[str, Any]],
    runtime_env: dict[str, Any] | None = None,
) -> Callable[[int], ActorHandle]:
    """Starts engine `index` of the role with the role's class and arguments: on its placement-group bundle
    (`slots[index]`, each engine's Ray options) while there is one, else with one engine's resources
    wherever they are free (the options without the placement group)."""
    free = {k: v for k, v in slots[0].items() if k != "scheduling_strategy"}

    def start(index: int) -> ActorHandle:
        options = slots[index] if index < len(slots) else free
        return (
            ray.remote(actor_class)
            .options(runtime_env=runtime_env, **options)
            .remote(*args, engine_index=index, **kwargs)
        )

    return start
