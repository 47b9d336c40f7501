"""The Ray side of `--use-health-check` for the job's own rollout engine servers (`EngineKind.HTTP`).

`EngineSupervisor` runs a thread in the driver: after the first wait, every interval it probes each
engine's `/health_generate` with the timeout (`runtime.rollout.health`). An engine that does not answer,
refuses, or whose actor died (a request to it raised `RayActorError`) is condemned: requests that were in
flight on it are given to the other engines by `RolloutGroup.generate`, and the thread replaces it:

1. counts the replacement against `--max-global-restart` (past it: the job fails, naming the engine);
2. kills the old actor, and its server process on its node (a stopped process outlives its actor);
3. starts a new actor with the same arguments on the engine's placement-group bundle, or, when the
   bundle's node is gone, wherever the pool has free capacity of the same shape;
4. loads the weights the other engines hold (the group's current object-store reference and version) and
   checks the new server reports exactly that version;
5. puts it in the group under the group's lock, so no weight push can fall between 4 and 5.

Each replacement is a warning in the driver's log (which reaches the job's logs through the reporter) and
counted in the step metrics `rollout/engine_replacements` and `rollout/healthy_engines`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from runtime.rollout.health import HealthCheckConfig, HealthMonitor, RestartBudgetExceeded, Verdict, probe

if TYPE_CHECKING:
    from runtime.roles.groups import RolloutGroup

log = logging.getLogger("runtime.roles.engine_health")


@dataclass
class EngineFactory:
    """How to start engine `index` of the role again: its actor class and arguments, and the Ray options
    of its slot (its placement-group bundle) and of the same shape anywhere in the pool."""

    actor_class: type
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    slot_options: list[dict[str, Any]]
    runtime_env: dict[str, Any] | None = None
    ready_timeout_s: float = 300.0

    def bundle_node(self, index: int) -> str | None:
        """The Ray node engine `index`'s placement-group bundle is reserved on now (None: unplaced, or
        no placement group). Ray moves the bundles of a lost node to live nodes where it can."""
        strategy = self.slot_options[index].get("scheduling_strategy")
        pg = getattr(strategy, "placement_group", None)
        if pg is None:
            return None
        table = ray.util.placement_group_table(pg)
        bundle = getattr(strategy, "placement_group_bundle_index", 0)
        node = (table.get("bundles_to_node_id") or {}).get(max(0, bundle))
        return str(node) if node else None

    def start(self, index: int, *, on_bundle: bool) -> ActorHandle:
        options = dict(self.slot_options[index])
        if not on_bundle:  # the bundle's node is gone: the same resources wherever they are free
            options.pop("scheduling_strategy", None)
        return (
            ray.remote(self.actor_class)
            .options(runtime_env=self.runtime_env, **options)
            .remote(*self.args, engine_index=index, **self.kwargs)
        )


@ray.remote(num_cpus=0)
def _reap_server(pid: int, port: int) -> bool:  # pragma: no cover - runs on the engine's node
    """SIGKILL the engine's server process if it is still there (a SIGSTOPped one is, after its actor is
    killed): only a process whose command line names the server's port, never a recycled pid."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    if b"--port" not in argv or str(port).encode() not in argv:
        return False
    os.kill(pid, signal.SIGKILL)
    return True


@ray.remote(num_cpus=0)
def _settled(box: list[ray.ObjectRef]) -> bool:  # pragma: no cover - runs in a Ray worker
    """Waits for one engine's call; False (not an error) when the engine died meanwhile: the supervisor
    replaces it and the replacement gets the current weights, so a weight push never fails on it."""
    try:
        ray.get(box[0])
        return True
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
        return False


def settled(ref: ray.ObjectRef) -> ray.ObjectRef:
    return _settled.remote([ref])


@dataclass
class EngineSupervisor:
    """Watches and replaces the engines of one `RolloutGroup` (see the module docstring)."""

    group: RolloutGroup
    factory: EngineFactory
    config: HealthCheckConfig
    infos: list[dict[str, Any]]  # each engine's ready() answer: address, node_id, server_pid
    api_key: str | None = None
    clock: Callable[[], float] = time.monotonic
    monitor: HealthMonitor = field(init=False)
    failed: dict[int, str] = field(default_factory=dict, init=False)  # index -> why, until replaced
    fatal: BaseException | None = field(default=None, init=False)
    _wake: threading.Condition = field(default_factory=threading.Condition, init=False)
    _stop: bool = field(default=False, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _replacing: set[int] = field(default_factory=set, init=False)  # condemned engines being replaced now
    _workers: list[threading.Thread] = field(default_factory=list, init=False)
    _starting: dict[int, ActorHandle] = field(default_factory=dict, init=False)  # replacements not yet in

    def __post_init__(self) -> None:
        self.monitor = HealthMonitor(self.config, started_at=self.clock())

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rollout-health", daemon=True)
        self._thread.start()
        log.info(
            "rollout health check on %d engine(s): first after %.1f s, every %.1f s, timeout %.1f s, at most "
            "%d replacement(s)",
            len(self.infos),
            self.config.first_wait_s,
            self.config.interval_s,
            self.config.timeout_s,
            self.config.max_restarts,
        )

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
            starting = list(self._starting.values())
        for actor in starting:  # a replacement still loading is not the group's: nobody else stops it
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        for thread in [self._thread, *self._workers]:
            if thread is not None:
                thread.join(timeout=30)

    # -- what the group asks --------------------------------------------------------------------------------------
    def healthy(self) -> list[int]:
        with self._wake:
            return [i for i in range(len(self.infos)) if i not in self.failed]

    def raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    def raise_if_stopped(self) -> None:
        """A generation waiting for replacements must not outlive the check (the job is closing)."""
        self.raise_if_fatal()
        if self._stop:
            raise RuntimeError("the rollout engines are shutting down: no replacement will come")

    def condemn(self, index: int, actor: ActorHandle | None, reason: str) -> None:
        """Mark engine `index` for replacement (once; a report about an actor already replaced is stale)."""
        with self._wake:
            if actor is not None and self.group.actors[index] is not actor:
                return
            if index not in self.failed:
                self.failed[index] = reason
                log.warning("rollout engine %d (%s): %s", index, self.infos[index].get("address"), reason)
            self._wake.notify_all()

    def check(self, index: int) -> Verdict:
        """Probe engine `index` now (a request to it failed: is the engine at fault, or the request?)."""
        address = self.infos[index].get("address")
        if not address:
            return Verdict.DEAD
        return probe(address, api_key=self.api_key, timeout_s=self.config.timeout_s)

    def metrics(self) -> dict[str, float]:
        self.raise_if_fatal()
        return {
            "rollout/engine_replacements": float(self.monitor.replacements),
            "rollout/healthy_engines": float(len(self.healthy())),
        }

    # -- the thread -----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        pool = ThreadPoolExecutor(max_workers=max(1, len(self.infos)), thread_name_prefix="health-probe")
        try:
            while True:
                with self._wake:
                    if self._stop or self.fatal is not None:
                        return
                    pending = sorted(set(self.failed) - self._replacing)
                    if not pending and not self.monitor.due(self.clock()):
                        self._wake.wait(timeout=max(0.05, self.monitor.next_round_at() - self.clock()))
                        continue
                for index in pending:  # each in a thread of its own: probing goes on meanwhile
                    try:
                        number = self.monitor.charge(index, self.failed[index])
                    except RestartBudgetExceeded as exc:
                        log.error("%s", exc)
                        self.fatal = exc
                        return
                    with self._wake:
                        self._replacing.add(index)
                    thread = threading.Thread(
                        target=self._replace,
                        args=(index, number),
                        name=f"engine-{index}-replacement",
                        daemon=True,
                    )
                    self._workers.append(thread)
                    thread.start()
                if self.monitor.due(self.clock()):
                    self._round(pool)
        except BaseException as exc:  # noqa: BLE001 - the step must hear of it, not wait
            log.exception("rollout health check failed")
            self.fatal = exc
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            with self._wake:
                self._wake.notify_all()

    def _round(self, pool: ThreadPoolExecutor) -> None:
        self.monitor.round_started(self.clock())
        actors = list(self.group.actors)
        indexes = [i for i in range(len(actors)) if i not in self.failed]
        futures = {i: pool.submit(self.check, i) for i in indexes}
        verdicts = {i: f.result() for i, f in futures.items()}
        for index, verdict in self.monitor.condemned(verdicts).items():
            self.condemn(index, actors[index], f"{verdict.value}: {self._why(verdict)}")

    def _why(self, verdict: Verdict) -> str:
        if verdict is Verdict.HUNG:
            return f"/health_generate gave no answer within {self.config.timeout_s:g} s"
        if verdict is Verdict.DEAD:
            return "/health_generate: connection refused or reset (its server, actor or node is gone)"
        return "/health_generate answered an error status"

    def _replace(self, index: int, number: int) -> None:
        reason = self.failed[index]
        old, info = self.group.actors[index], self.infos[index]
        log.warning(
            "replacing rollout engine %d (%s, node %s): %s; replacement %d of at most %d",
            index,
            info.get("address"),
            str(info.get("node_id") or "?")[:12],
            reason,
            number,
            self.config.max_restarts,
        )
        started = time.perf_counter()
        self._kill(old, info)
        on_bundle = self._bundle_usable(index, info.get("node_id"))
        new = self.factory.start(index, on_bundle=on_bundle)
        with self._wake:
            self._starting[index] = new
        try:
            ready = ray.get(new.ready.remote(), timeout=self.factory.ready_timeout_s)
            if self._stop:
                raise RuntimeError("the job is closing")
            with self.group.lock:
                version = self.group.load_current_weights(new, self.factory.ready_timeout_s)
                with self._wake:
                    self.group.actors[index] = new
                    self.infos[index] = ready
                    self.failed.pop(index, None)
                    self._replacing.discard(index)
                    self._wake.notify_all()
        except Exception as exc:  # noqa: BLE001 - this attempt is lost; the next one counts again
            try:
                ray.kill(new, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
            with self._wake:
                if not self._stop:
                    log.warning("replacement of rollout engine %d failed: %s", index, exc)
                    self.failed[index] = f"{reason}; its replacement failed: {exc}"
                self._replacing.discard(index)
                self._wake.notify_all()
            return
        finally:
            with self._wake:
                self._starting.pop(index, None)
        log.warning(
            "rollout engine %d replaced in %.1f s: %s on %s (weights version %s); replacement %d of at most %d",
            index,
            time.perf_counter() - started,
            ready.get("address"),
            "its placement-group bundle" if on_bundle else "free capacity in the pool (its node is gone)",
            version,
            number,
            self.config.max_restarts,
        )

    def _bundle_usable(self, index: int, node_id: str | None, wait_s: float = 15.0) -> bool:
        """The engine's bundle, while its node lives, or once Ray has moved it to a live node; else (the
        bundle pinned to the lost node, or no room for it) free capacity elsewhere in the pool."""
        if _node_alive(node_id):
            return True
        deadline = time.monotonic() + wait_s
        while not self._stop:
            try:
                node = self.factory.bundle_node(index)
            except Exception:  # noqa: BLE001 - no table: treat as unplaced
                node = None
            if node and node != node_id and _node_alive(node):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)
        return False

    def _kill(self, actor: ActorHandle, info: dict[str, Any]) -> None:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            log.debug("engine actor already gone", exc_info=True)
        pid, address, node = info.get("server_pid"), str(info.get("address") or ""), info.get("node_id")
        if not pid or not node or ":" not in address or not _node_alive(node):
            return
        try:
            port = int(address.rsplit(":", 1)[1])
            ref = _reap_server.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(int(pid), port)
            ray.get(ref, timeout=30)
        except Exception:  # noqa: BLE001 - best effort: the server also exits once it sees its actor gone
            log.debug("could not reap the server of an engine", exc_info=True)


def _node_alive(node_id: str | None) -> bool:
    if not node_id:
        return True  # unknown: try the bundle
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return bool(node.get("Alive"))
    return False
