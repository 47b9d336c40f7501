"""The Ray side of elastic rollout (`--autoscaler-config`): the rollout role's engines grow and shrink
between steps. Each engine has a placement group of one device of its own (`placement.engine_group`),
reserved when it starts and released when it stops, so an engine scaled in gives its device back to Ray.

Who decides (`ElasticRollout.after_step`):
- a job the scheduling pass placed follows what the pass granted (`follow`: the rollout role's allocation as
  the platform's answer to the driver's reports carries it, `Reporter.grant`): an engine on a node whose replica
  the pass took back leaves, and an engine starts on each node it granted (`runtime.rollout.elastic.follow_grant`);
  then the driver reports the grant's number (`report_followed`, `Reporter.rollout_followed`), which frees the
  GPUs of the engines it stopped (the pass holds them until then). The driver's thresholds decide what it asks the pass for
  (`Autoscaler.ask`, reported through `report_wish`, `Reporter.rollout_wish`): the pass grows the job into idle
  GPUs up to that, gives back engines above it, and takes engines back for other jobs
  (`scheduler.policy.elastic`);
- a standalone run follows the autoscaler's thresholds (`runtime.rollout.elastic.Autoscaler`), its new
  engines wherever Ray has room.

Scale-out of n engines, all within `--scale-out-timeout` (one deadline for the whole operation):
1. n new engine actors start, each in a new placement group of one device (pinned to the Ray node granted);
2. each must answer `ready` (its device reserved, its model loaded, its server up) before the deadline;
3. under the group's lock (no weight push can come between), each loads the weights the group's engines
   hold now and must report exactly that version (`RolloutGroup.load_current_weights`);
4. `--scale-out-partial-success-policy`: rollback_all stops every new engine if any failed, keep_partial
   keeps those that passed; the kept ones join the group (still under the lock); a stopped one's placement
   group is released.

Scale-in of given engines (the newest first when the autoscaler decides; never the last one):
1. under the lock they leave the group: no new request goes to them;
2. drain: each gets until `--scale-in-drain-timeout` to finish the calls already queued on it (actor calls
   run in order: a `ready` call answers once they are done); past it, an engine server's requests are
   aborted (`abort(abort_all=True)`);
3. shutdown: an engine server is asked to stop (`shutdown`) within `--scale-in-shutdown-timeout`; then
   (or at once, for the built-in in-process engine) its actor is killed and its placement group released.

Each operation is logged with its timings and counted in the step metrics `rollout/engines`,
`rollout/scale_outs`, `rollout/scale_ins`, `rollout/scale_out_failures` (and `rollout/granted_engines`,
`rollout/wished_engines` where the pass decides).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup, remove_placement_group

from runtime.devices import Device
from runtime.report_protocol import Grant
from runtime.roles.placement import Slot, engine_placement_group
from runtime.rollout.elastic import (
    Autoscaler,
    ElasticSettings,
    RolloutWish,
    follow_grant,
    settle_scale_out,
)

if TYPE_CHECKING:
    from runtime.roles.groups import RolloutGroup

log = logging.getLogger("runtime.roles.elastic")


@dataclass(frozen=True)
class EngineHome:
    """Where one engine runs: the name of its own placement group among the role's (None: a bundle of a group
    it shares, which stays reserved when it stops), and the Ray node the pass put it on (None: where Ray
    placed it)."""

    group: str | None = None
    node: str | None = None


@dataclass
class EngineStarter:
    """Starts an engine of the role (its actor class and arguments) in a placement group of one device of its own,
    added to `placement_groups` (the role's, which `Roles.shutdown` releases) and released with the engine."""

    actor_class: type
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    device: Device
    placement_groups: dict[str, PlacementGroup]
    runtime_env: dict[str, Any] | None = None
    _names: Any = field(default_factory=itertools.count, init=False, repr=False)

    def __call__(self, index: int, node: str | None) -> tuple[ActorHandle, EngineHome]:
        """Engine `index`'s actor on a new placement group on Ray node `node` (None: anywhere). The actor is
        created at once; it starts once Ray has reserved the group (a caller bounds that by waiting on
        `ready`). Raises what Ray raises for options it refuses (the group is released then)."""
        name = f"rollout-scaled-{next(self._names)}"
        while name in self.placement_groups:
            name = f"rollout-scaled-{next(self._names)}"
        self.placement_groups[name] = engine_placement_group(self.device, node)
        home = EngineHome(name, node)
        try:
            options = Slot(name, 0, 1.0).ray_options(self.placement_groups, self.device)
            actor = (
                ray.remote(self.actor_class)
                .options(runtime_env=self.runtime_env, **options)
                .remote(*self.args, engine_index=index, **self.kwargs)
            )
        except BaseException:
            self.release(home)
            raise
        return actor, home

    def release(self, home: EngineHome) -> None:
        """Give the engine's device back to Ray (nothing for an engine on a group it shares)."""
        pg = self.placement_groups.pop(home.group, None) if home.group is not None else None
        if pg is None:
            return
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001 - already gone with the cluster
            log.debug("engine placement group already gone", exc_info=True)


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
    """Scales one `RolloutGroup` (see the module docstring). `homes[i]` is where `group.actors[i]` runs (kept in
    step with the list by this class, the only one that changes it). `placed`: the scheduling pass placed the
    job; then `follow` (the engines the pass granted, `Reporter.grant`; None until an answer carried
    them) decides, and without it the role keeps the engines it has; the autoscaler's thresholds decide what it
    asks the pass for, from `base` engines (the spec's count), handed to `report_wish`."""

    group: RolloutGroup
    start_engine: Callable[[int, str | None], tuple[ActorHandle, EngineHome]]
    settings: ElasticSettings
    homes: list[EngineHome] = field(default_factory=list)
    placed: bool = False
    follow: Callable[[], Grant | Sequence[str | None] | None] | None = None
    release_engine: Callable[[EngineHome], None] | None = None
    base: int | None = None
    report_wish: Callable[[RolloutWish], None] | None = None
    report_followed: Callable[[int], None] | None = None
    autoscaler: Autoscaler = field(init=False)
    scale_outs: int = field(default=0, init=False)
    scale_ins: int = field(default=0, init=False)
    scale_out_failures: int = field(default=0, init=False)
    granted: tuple[str | None, ...] | None = field(default=None, init=False)  # the grant last followed
    _failed_grant: tuple[str | None, ...] | None = field(default=None, init=False)
    _held_logged: bool = field(default=False, init=False)
    _followed: int | None = field(default=None, init=False)  # the grant last reported followed

    def __post_init__(self) -> None:
        self.autoscaler = Autoscaler(self.settings.autoscaler, wish=self.base)
        if self.release_engine is None and isinstance(self.start_engine, EngineStarter):
            self.release_engine = self.start_engine.release
        missing = len(self.group.actors) - len(self.homes)
        self.homes = list(self.homes) + [EngineHome()] * max(0, missing)

    # -- between steps ------------------------------------------------------------------------------------------
    def after_step(self, step: int, rollout_s: float, step_s: float) -> dict[str, float]:
        """This step's scaling carried out (what the pass granted, or the autoscaler's decision in a standalone
        run); the step metrics."""
        share = rollout_s / step_s if step_s > 0 else 0.0
        if self.placed:
            self._ask(step, share)
            grant = self.follow() if self.follow is not None else None
            if grant is not None:
                nodes = grant.engines if isinstance(grant, Grant) else tuple(grant)
                self.follow_grant(nodes)
                if isinstance(grant, Grant):
                    self._report_followed(grant)
            elif not self._held_logged and self.follow is None:
                self._held_logged = True
                log.info(
                    "rollout engines held at %d: no grant of the scheduling pass to follow", len(self.homes)
                )
            return self.metrics(share)
        engines = len(self.group.actors)
        target = self.autoscaler.target(step, engines, share)
        if target > engines:
            outcome = self.scale_out(target - engines)
            if outcome.after != outcome.before:
                self.autoscaler.scaled(step)
        elif target < engines:
            self.scale_in(engines - target)
            self.autoscaler.scaled(step)
        return self.metrics(share)

    def _report_followed(self, grant: Grant) -> None:
        """Once the engines run only where `grant` has replicas (every engine the pass took back is stopped; some
        it granted may have failed to start), say so: the platform frees the GPUs of the engines it took back."""
        if grant.number is None or grant.number == self._followed or self.report_followed is None:
            return
        if follow_grant([h.node for h in self.homes], grant.engines).leave:
            return  # an engine still runs where the grant has none (never the last one)
        self._followed = grant.number
        self.report_followed(grant.number)

    def _ask(self, step: int, share: float) -> None:
        """What the thresholds say of this step, as a wish to the scheduling pass when it changes."""
        wish = self.autoscaler.ask(step, len(self.group.actors), share)
        if wish is None:
            return
        threshold = wish["threshold"]
        log.info(
            "rollout: asking the scheduling pass for %d engines (%s)",
            wish["engines"],
            f"rollout {share:.2f} of step {step} {'<' if share < threshold else '>'} {threshold:g}"
            if threshold is not None
            else "within min_engines .. max_engines",
        )
        if self.report_wish is not None:
            self.report_wish(wish)

    def follow_grant(self, grant: Sequence[str | None]) -> ScaleOutcome | None:
        """Stop the engines on nodes whose replicas the pass took back and start one on each node it granted
        (`runtime.rollout.elastic.follow_grant`); None when nothing changes. A scale-out onto a grant that
        failed once is not tried again until the grant changes (each try may cost `--scale-out-timeout`)."""
        grant = tuple(grant)
        self.granted = grant
        plan = follow_grant([h.node for h in self.homes], grant)
        if not plan.changes:
            return None
        if not plan.start and len(plan.leave) >= len(self.homes):
            return None  # never the last engine (a grant always holds one: the gang's floor)
        if plan.start and grant == self._failed_grant:  # tried: only what it takes back
            return self._remove(list(plan.leave), "the pass took them back") if plan.leave else None
        before = len(self.group.actors)
        started = time.perf_counter()
        if plan.keep:  # give GPUs back first: another job may wait for them
            self._remove(list(plan.leave), "the pass took them back")
            added = self._add(list(plan.start), "the pass granted them") if plan.start else None
        else:  # every engine moves: the new ones first, so that one always serves
            added = self._add(list(plan.start), "the pass granted them")
            # indexes are the old engines' still: the new ones were appended after them
            self._remove([i for i in plan.leave if i < len(self.homes)], "the pass took them back")
        self._failed_grant = grant if added is not None and added.failures else None
        return ScaleOutcome(before, len(self.group.actors), seconds=time.perf_counter() - started)

    def metrics(self, share: float | None = None) -> dict[str, float]:
        out = {
            "rollout/engines": float(len(self.group.actors)),
            "rollout/scale_outs": float(self.scale_outs),
            "rollout/scale_ins": float(self.scale_ins),
            "rollout/scale_out_failures": float(self.scale_out_failures),
        }
        if share is not None:
            out["rollout/step_share"] = share
        if self.granted is not None:
            out["rollout/granted_engines"] = float(len(self.granted))
        if self.placed and self.autoscaler.wish is not None:
            out["rollout/wished_engines"] = float(self.autoscaler.wish)
        return out

    # -- scale-out ----------------------------------------------------------------------------------------------
    def scale_out(self, count: int) -> ScaleOutcome:
        """`count` more engines wherever Ray has room (the autoscaler's decision)."""
        return self._add([None] * count, "the autoscaler asked")

    def _add(self, nodes: list[str | None], why: str) -> ScaleOutcome:
        s = self.settings
        count = len(nodes)
        started = time.perf_counter()
        deadline = time.monotonic() + s.scale_out_timeout_s
        before = len(self.group.actors)
        indexes = list(range(before, before + count))
        actors: dict[int, ActorHandle] = {}
        homes: dict[int, EngineHome] = {}
        failures: dict[int, str] = {}
        for index, node in zip(indexes, nodes, strict=True):
            try:
                actors[index], homes[index] = self.start_engine(index, node)
            except Exception as exc:  # noqa: BLE001 - reported as this engine's failure
                failures[index] = f"could not start: {_first_line(exc)}"
        ready: list[int] = []
        pending = {actor.ready.remote(): index for index, actor in actors.items()}
        while pending:
            left = deadline - time.monotonic()
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, left))
            if not done:
                for index in pending.values():
                    where = f" on node {nodes[index - before]}" if nodes[index - before] else ""
                    failures[index] = (
                        f"not ready{where} within --scale-out-timeout={s.scale_out_timeout_s:g} s"
                    )
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
                    self.homes.append(homes[index])
                elif actor is not None:
                    _kill(actor)
                    self._release(homes[index])
        outcome = ScaleOutcome(before, len(self.group.actors), failures, time.perf_counter() - started)
        if failures:
            self.scale_out_failures += 1
            log.warning(
                "rollout scale-out of %d engine(s) (%s) %s in %.1f s (%s): %s",
                count,
                why,
                "rolled back" if outcome.after == before else f"kept {outcome.after - before}",
                outcome.seconds,
                s.partial_success.value,
                "; ".join(f"engine {i}: {why}" for i, why in sorted(failures.items())),
            )
        else:
            log.info(
                "rollout scaled out %d -> %d engines in %.1f s (%s; weights version %d)",
                before,
                outcome.after,
                outcome.seconds,
                why,
                self.group.weight_version,
            )
        if outcome.after > before:
            self.scale_outs += 1
        return outcome

    # -- scale-in -----------------------------------------------------------------------------------------------
    def scale_in(self, count: int) -> ScaleOutcome:
        """The `count` newest engines leave (never the last one)."""
        engines = len(self.group.actors)
        count = min(count, engines - 1)
        return self._remove(list(range(engines - count, engines)), "the autoscaler asked")

    def _remove(self, indexes: list[int], why: str) -> ScaleOutcome:
        s = self.settings
        started = time.perf_counter()
        with self.group.lock:
            before = len(self.group.actors)
            indexes = sorted({i for i in indexes if 0 <= i < before})[: max(0, before - 1)]
            if not indexes:
                return ScaleOutcome(before, before)
            leaving = [self.group.actors[i] for i in indexes]
            gone = [self.homes[i] for i in indexes]
            for i in reversed(indexes):
                del self.group.actors[i]
                del self.homes[i]
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
        for home in gone:  # its device back to Ray (an engine on a shared group keeps its bundle)
            self._release(home)
        self.scale_ins += 1
        outcome = ScaleOutcome(
            before,
            before - len(leaving),
            seconds=time.perf_counter() - started,
            aborted=aborted,
            killed=killed,
        )
        nodes = sorted({h.node for h in gone if h.node})
        log.info(
            "rollout scaled in %d -> %d engines in %.1f s (%s%s; %d drained, %d aborted after "
            "--scale-in-drain-timeout=%g s)",
            before,
            outcome.after,
            outcome.seconds,
            why,
            f", from node(s) {', '.join(nodes)}" if nodes else "",
            len(done),
            aborted,
            s.drain_timeout_s,
        )
        return outcome

    def _release(self, home: EngineHome) -> None:
        if self.release_engine is not None:
            self.release_engine(home)


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
