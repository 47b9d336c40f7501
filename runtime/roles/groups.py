"""Driver-side handles on the role actors. Plain methods block and return values; `async_*` return ObjectRefs."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import ray
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup

from runtime.devices import Device
from runtime.models.page_cache import WARM_ENV
from runtime.roles.actors import (
    CriticActor,
    ForwardActor,
    HttpEngineActor,
    RolloutEngineActor,
    TrainActor,
    free_loopback_port,
)
from runtime.roles.colocated import ColocatedActor, hosted_batch_size
from runtime.roles.elastic import ElasticRollout, EngineHome, EngineStarter
from runtime.roles.engine_health import EngineFactory, EngineSupervisor, settled
from runtime.roles.logs import start_log_sink
from runtime.roles.placement import Role, Topology, plan_topology, release, reserve, spec_engines
from runtime.rollout.backend import BACKEND_ENV, backend_from_env
from runtime.rollout.elastic import ElasticSettings
from runtime.rollout.health import HealthCheckConfig, Verdict
from runtime.rollout.params import GenerationResult, SamplingParams
from runtime.rollout.sglang.engine_actor import engine_secret, external_engine_actors
from runtime.train.checkpoint import CheckpointRecord
from runtime.train.critic import CriticConfig
from runtime.train.torch_backend import TrainConfig
from runtime.types import RolloutBatch, split_evenly

if TYPE_CHECKING:
    from jobspec.demand import ResourceDemand

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankCall:
    """One call in flight on every rank of a group: `get()` waits for all of them (a failing rank fails
    it) and answers rank 0's result."""

    refs: list[ray.ObjectRef]

    def get(self) -> Any:
        return ray.get(self.refs)[0]


class RankGroup:
    """The actor(s) of a role that runs SPMD: one, or one per rank of a multi-rank backend (megatron).

    Every call goes to every rank with the same arguments (a batch is put in the object store once and
    each rank reads the same object, taking its data-parallel share itself), and the group answers with
    rank 0's result; it waits for all ranks, so a failing rank fails the call. The driver never addresses
    ranks itself."""

    def __init__(self, actors: list[ActorHandle]) -> None:
        self.actors = actors
        self.leader = actors[0]
        # The ranks' calls meet in collectives, so every rank must see the calls in the same order: a call
        # is submitted to all ranks at once (Ray keeps one caller's submission order per actor), even when
        # two driver threads use the group (fully-async: weight pushes from the rollout thread).
        self._submit = threading.Lock()

    @property
    def world_size(self) -> int:
        return len(self.actors)

    def _all(self, method: str, *args: Any) -> list[ray.ObjectRef]:
        with self._submit:
            return [getattr(actor, method).remote(*args) for actor in self.actors]

    def _leader_answer(self, method: str, *args: Any) -> Any:
        return RankCall(self._all(method, *args)).get()


class TrainGroup(RankGroup):
    """The trainer actor(s): one for the torch backend, one per rank for a multi-rank backend (megatron)."""

    # Batches go to the object store first: Ray 2.60 passes an argument holding torch tensors inline
    # ~100x slower than a reference to the same object (measured: 180 ms vs 8 ms for a few KB).
    def compute_log_probs(self, batch: RolloutBatch, *, old: bool = True, ref: bool = True) -> RolloutBatch:
        return self._leader_answer("compute_log_probs", ray.put(batch), old, ref)

    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        return self._leader_answer("train_step", ray.put(batch))

    def evaluate_nll(self, batch: RolloutBatch) -> tuple[float, int]:
        return self._leader_answer("evaluate_nll", ray.put(batch))

    def update_reference(self) -> None:
        self._leader_answer("update_reference")

    def async_named_weights(self) -> ray.ObjectRef:
        """The weights (Hugging Face names, gathered on rank 0) as one object in Ray's object store (the
        trainer's copy is untouched). Every rank takes part in the gather; rank 0's object is the answer."""
        refs = self._all("named_weights")
        return refs[0]

    def parameter_checksum(self) -> float:
        return self._leader_answer("parameter_checksum")

    def offload(self) -> None:
        ray.get(self._all("offload"))

    def onload(self) -> None:
        ray.get(self._all("onload"))

    def save_checkpoint(
        self, save_dir: str, iteration: int, extra_state: dict[str, Any], *, blocking: bool = True
    ) -> CheckpointRecord | None:
        return self._leader_answer("save_checkpoint", save_dir, iteration, extra_state, blocking)

    def finished_saves(self, *, wait: bool = False) -> list[CheckpointRecord]:
        return self._leader_answer("finished_saves", wait)

    def load_checkpoint(self, load_dir: str) -> tuple[int, dict[str, Any]] | None:
        return self._leader_answer("load_checkpoint", load_dir)

    def export_hf(self, out_dir: str, step: int) -> CheckpointRecord:
        return self._leader_answer("export_hf", out_dir, step)

    # -- ranks that host their rollout engine (`EngineKind.IN_TRAINER`, `runtime.roles.colocated`) ----------
    def async_push_in_place(self, version: int, expected: int) -> list[ray.ObjectRef]:
        """Every rank copies its weights into its own engine (a collective where the weights are gathered
        over tensor-parallel ranks, so it goes to all ranks at once, in order)."""
        return self._all("push_weights_in_place", version, expected)

    def use_for_rollout(self) -> None:
        ray.get(self._all("use_for_rollout"))

    def use_for_training(self) -> None:
        ray.get(self._all("use_for_training"))

    def engine_weight_mismatch(self) -> float:
        """The largest |trainer - engine| weight difference over the ranks (0.0: exactly equal)."""
        return max(ray.get(self._all("engine_weight_mismatch")))

    def memory_calls(self) -> list[list[str]]:
        """Each rank's releases and resumes so far, in order."""
        return ray.get(self._all("memory_calls"))

    # -- collective weight sync (`runtime.weight_sync.collective`): rank 0 serves the group and sends ---------
    def open_weight_group(self, group_name: str, timeout_s: float) -> tuple[str, int, str]:
        """(host, port, backend) of a new weight-update group's store, opened by rank 0."""
        return tuple(ray.get(self.leader.weight_group_open.remote(group_name, timeout_s)))  # type: ignore[return-value]

    def join_weight_group(self, world_size: int) -> None:
        """Rank 0 joins on its sender thread; returns at once."""
        ray.get(self.leader.weight_group_join.remote(world_size))

    def prepare_weight_push(self, push_id: int, bucket_bytes: int) -> list[Any]:
        """Every rank gathers (a collective under megatron); rank 0 keeps the weights and answers the
        push's metadata, in buckets."""
        return self._leader_answer("weight_push_prepare", push_id, bucket_bytes)

    def send_weight_push(
        self, push_id: int, members: list[str], ready_timeout_s: float, load_format: str | None
    ) -> None:
        """Rank 0 queues the broadcast (it starts once every engine is ready); returns at once."""
        ray.get(self.leader.weight_push_send.remote(push_id, members, ready_timeout_s, load_format))

    def weight_push_error(self, push_id: int, timeout_s: float) -> str | None:
        return ray.get(self.leader.weight_push_error.remote(push_id, timeout_s))

    def close_weight_group(self) -> None:
        self.leader.weight_group_close.remote()  # not awaited: rank 0 may be busy training


class RolloutGroup:
    """The rollout engines. `generate` splits the requests into contiguous shares, one per engine, and
    returns the results in request order; engine i samples with seed + i.

    With a `supervisor` (`--use-health-check`, `runtime.roles.engine_health`), an engine may be replaced
    while the job runs: a share whose engine is condemned (hung, dead) is generated again, whole, on a
    healthy engine (same seed), and only the answer of the share's current dispatch is kept, so a batch
    never loses or doubles a sample; weight pushes and offload/onload do not fail on a dying engine (its
    replacement gets the current weights and state)."""

    def __init__(self, actors: list[ActorHandle], *, in_trainer: bool = False) -> None:
        self.actors = actors
        # the engines live in the trainer's rank actors (`runtime.roles.colocated`): weights are pushed in
        # place (`async_push_in_place`), turns are the trainer's (`Roles.use_for_rollout`)
        self.in_trainer = in_trainer
        self._weight_version = 0
        self._weights_ref: ray.ObjectRef | None = None  # kept only under a supervisor, for replacements
        self._offloaded = False
        self.lock = threading.RLock()  # a replacement's weight load and swap vs. a weight push
        self.supervisor: EngineSupervisor | None = None
        self.elastic: ElasticRollout | None = None  # `--autoscaler-config`: engines added and removed

    @property
    def weight_version(self) -> int:
        return self._weight_version

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, budgets: list[int] | None = None
    ) -> list[GenerationResult]:
        if self.supervisor is not None:
            return self._generate_supervised(prompts, params, budgets, self.supervisor)
        shares = split_evenly(len(prompts), len(self.actors))
        refs, start = [], 0
        for index, (actor, size) in enumerate(zip(self.actors, shares, strict=True)):
            if size:
                seed = None if params.seed is None else params.seed + index
                part = None if budgets is None else budgets[start : start + size]
                refs.append(
                    actor.generate.remote(
                        prompts[start : start + size], dataclasses.replace(params, seed=seed), part
                    )
                )
            start += size
        return [result for part in ray.get(refs) for result in part]

    def _generate_supervised(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        budgets: list[int] | None,
        supervisor: EngineSupervisor,
    ) -> list[GenerationResult]:
        supervisor.raise_if_fatal()
        shares: list[tuple[int, int, int]] = []  # (start, size, seed offset): each answered exactly once
        start = 0
        for index, size in enumerate(split_evenly(len(prompts), len(self.actors))):
            if size:
                shares.append((start, size, index))
            start += size
        answers: dict[int, list[GenerationResult]] = {}
        pending: dict[ray.ObjectRef, tuple[int, int, ActorHandle]] = {}  # ref -> (share, engine, actor)
        waiting = list(range(len(shares)))  # shares with no live dispatch
        load: dict[int, int] = {}

        def dispatch(share: int) -> bool:
            healthy = supervisor.healthy()
            if not healthy:
                return False
            first, size, offset = shares[share]
            preferred = offset if offset in healthy else min(healthy, key=lambda i: (load.get(i, 0), i))
            actor = self.actors[preferred]
            seed = None if params.seed is None else params.seed + offset
            part = None if budgets is None else budgets[first : first + size]
            ref = actor.generate.remote(
                prompts[first : first + size], dataclasses.replace(params, seed=seed), part
            )
            pending[ref] = (share, preferred, actor)
            load[preferred] = load.get(preferred, 0) + 1
            return True

        while len(answers) < len(shares):
            supervisor.raise_if_stopped()
            waiting = [share for share in waiting if not dispatch(share)]
            for ref, (share, engine, actor) in list(pending.items()):
                if engine in supervisor.failed or self.actors[engine] is not actor:  # condemned meanwhile
                    del pending[ref]
                    load[engine] -= 1
                    waiting.append(share)
                    log.warning("rollout share %d moved off engine %d: it is being replaced", share, engine)
            if not pending:
                time.sleep(0.1)  # every engine is being replaced
                continue
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            for ref in done:
                share, engine, actor = pending.pop(ref)
                load[engine] -= 1
                try:
                    answers[share] = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                    supervisor.condemn(
                        engine, actor, f"dead: its actor died during a request ({_first_line(exc)})"
                    )
                    waiting.append(share)
                except ray.exceptions.RayTaskError as exc:
                    verdict = supervisor.check(engine)
                    if verdict is Verdict.HEALTHY:
                        raise  # the request, not the engine: the job's own error
                    supervisor.condemn(
                        engine, actor, f"{verdict.value}: a request to it failed ({_first_line(exc)})"
                    )
                    waiting.append(share)
        return [result for share in range(len(shares)) for result in answers[share]]

    def load_current_weights(self, actor: ActorHandle, timeout_s: float = 300.0) -> int:
        """A replacement engine takes the weights the others hold (call with `lock` held): the current
        object-store reference, as version `weight_version`, which the engine must then report. None
        pushed yet: the engine keeps the checkpoint it loaded (version 0, as the others). Each call is
        bounded by `timeout_s` (the lock holds weight pushes back meanwhile)."""
        version = self._weight_version
        if self._weights_ref is not None:
            loaded = ray.get(actor.load_weights.remote(self._weights_ref, version), timeout=timeout_s)
            if int(loaded) != version:
                raise RuntimeError(f"the new engine loaded weight version {loaded}, expected {version}")
            if not hasattr(actor, "server_info"):  # the built-in in-process engine: no server to ask
                return version if not self._offloaded else self._offload_new(actor, timeout_s)
            reported = ray.get(actor.server_info.remote(), timeout=timeout_s).get("weight_version")
            if str(reported) != str(version):
                raise RuntimeError(
                    f"the new engine's server reports weight version {reported!r}, expected {version}"
                )
        return self._offload_new(actor, timeout_s) if self._offloaded else version

    def _offload_new(self, actor: ActorHandle, timeout_s: float) -> int:
        ray.get(actor.offload.remote(), timeout=timeout_s)
        return self._weight_version

    def async_load_weights(self, weights_ref: ray.ObjectRef, version: int) -> list[ray.ObjectRef]:
        """Every engine reads the same stored object; Ray resolves the ref inside each engine process.
        An engine applies it after the generate calls already queued on it (actor calls run in order)."""
        with self.lock:
            self._weight_version = version
            if self.supervisor is None:
                if self.elastic is not None:  # an engine added later loads the current weights
                    self._weights_ref = weights_ref
                return [a.load_weights.remote(weights_ref, version) for a in self.actors]
            self._weights_ref = weights_ref
            return [settled(a.load_weights.remote(weights_ref, version)) for a in self.actors]

    def load_weights(self, weights_ref: ray.ObjectRef, version: int) -> None:
        ray.get(self.async_load_weights(weights_ref, version))

    def async_push_in_place(self, train: TrainGroup, version: int) -> list[ray.ObjectRef]:
        """Engines hosted by the trainer's ranks take `version` in place; each must hold the version this
        group last gave it (else the push fails, naming both)."""
        if not self.in_trainer:
            raise RuntimeError("in-place weight push to engines that are actors of their own")
        with self.lock:
            expected, self._weight_version = self._weight_version, version
            return train.async_push_in_place(version, expected)

    def collective_push(
        self, version: int, push: Callable[[list[ActorHandle], int], list[ray.ObjectRef]]
    ) -> list[ray.ObjectRef] | None:
        """The collective weight sync's push (`runtime.weight_sync.collective`): `push(actors, expected)`
        sends `version` to these engines, which must hold `expected` (the version this group last gave
        them). None where the engines take weights through the object store instead: hosted by the
        trainer, or replaced or added while the job runs (a supervisor or an autoscaler loads a new engine
        from the stored object)."""
        if self.in_trainer or self.supervisor is not None or self.elastic is not None:
            return None
        with self.lock:
            refs = push(self.actors, self._weight_version)
            self._weight_version = version
            return refs

    def offload(self) -> None:
        self._call_all("offload", offloaded=True)

    def onload(self) -> None:
        self._call_all("onload", offloaded=False)

    def _call_all(self, call: str, *, offloaded: bool) -> None:
        """`call` (`offload` / `onload`) on every engine, waited for (under a supervisor, an engine that dies
        meanwhile is not an error: the supervisor replaces it)."""
        if self.in_trainer:  # the actor's own offload/onload are the trainer's
            raise RuntimeError(f"{call}: the engines live in the trainer's ranks; use Roles.use_for_rollout")
        with self.lock:
            self._offloaded = offloaded
            refs = [getattr(a, call).remote() for a in self.actors]
            ray.get(refs if self.supervisor is None else [settled(r) for r in refs])

    def after_step(self, step: int, rollout_s: float, step_s: float) -> dict[str, float]:
        """`--autoscaler-config`: the engines scaled as the step's timings say (`runtime.roles.elastic`);
        the step metrics `rollout/engines`, `rollout/scale_*`. Nothing without it."""
        return {} if self.elastic is None else self.elastic.after_step(step, rollout_s, step_s)

    def health_metrics(self) -> dict[str, float]:
        """`rollout/engine_replacements` (so far in this run) and `rollout/healthy_engines` under a
        supervisor (raises the error that ended it, e.g. `--max-global-restart` exceeded); else nothing."""
        return {} if self.supervisor is None else self.supervisor.metrics()

    def close(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()


def _first_line(exc: BaseException) -> str:
    """Ray's errors run to many lines (the actor's id, pid, the usual causes): the first says what."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


class CriticGroup(RankGroup):
    """PPO's critic actor(s), one per rank as the trainer's (`RankGroup`): values at rollout time, and its
    training step (which runs while the policy trains: `async_train_step`). Rank 0's answers are the
    critic's: every rank holds the values (gathered from the last pipeline stage of each data-parallel
    replica) and the metrics (reduced over the ranks), and rank 0 writes the checkpoint's record."""

    def compute_values(self, batch: RolloutBatch) -> Any:
        return self._leader_answer("compute_values", ray.put(batch))

    def async_train_step(self, batch: RolloutBatch) -> RankCall:
        return RankCall(self._all("train_step", ray.put(batch)))

    def save_checkpoint(self, root: str, iteration: int) -> CheckpointRecord:
        return self._leader_answer("save_checkpoint", root, iteration)

    def load_checkpoint(self, root: str) -> int | None:
        return self._leader_answer("load_checkpoint", root)


class ForwardGroup:
    """A forward-only role (`reference`, `actor_fwd`) on devices of its own."""

    def __init__(self, role: Role, actors: list[ActorHandle]) -> None:
        self.role = role
        self.actors = actors

    def log_probs(self, batch: RolloutBatch) -> Any:
        return ray.get(self.actors[0].log_probs.remote(ray.put(batch)))

    def async_load_weights(self, weights_ref: ray.ObjectRef, version: int) -> list[ray.ObjectRef]:
        return [a.load_weights.remote(weights_ref, version) for a in self.actors]


@dataclass
class Roles:
    """The running roles of one job. Colocated roles take turns on their slots: `use_for_rollout` and
    `use_for_training` are the explicit offload/onload points (no-ops when not colocated)."""

    topology: Topology
    placement_groups: dict[str, PlacementGroup]
    train: TrainGroup | None
    rollout: RolloutGroup | None
    forward: dict[Role, ForwardGroup] = field(default_factory=dict)
    critic: CriticGroup | None = None
    log_sink: ActorHandle | None = None
    infos: list[dict[str, Any]] = field(default_factory=list)
    # `colocate` with external engines: the servers hold no slot of ours (the topology is not colocated),
    # but they share the trainer's devices, so the roles still take turns (offload/onload = release/resume)
    external_colocated: bool = False
    # the rollout engines live in the trainer's rank actors (`EngineKind.IN_TRAINER`): `rollout.actors` are
    # `train.actors`, weights go in place, and each actor takes its own turns
    engines_in_trainer: bool = False
    # `--offload-train` / `--offload-rollout`: which side releases its memory during the other's turn
    offload_train: bool = True
    offload_rollout: bool = True

    @property
    def takes_turns(self) -> bool:
        return (
            self.rollout is not None
            and self.train is not None
            and (self.topology.colocate or self.external_colocated)
        )

    @property
    def reference(self) -> ForwardGroup | None:
        return self.forward.get(Role.REFERENCE)

    @property
    def actor_fwd(self) -> ForwardGroup | None:
        return self.forward.get(Role.ACTOR_FWD)

    def use_for_rollout(self) -> None:
        if self.engines_in_trainer:
            assert self.train is not None
            self.train.use_for_rollout()  # per `--offload-train` / `--offload-rollout`
        elif self.takes_turns:
            assert self.train is not None and self.rollout is not None
            if self.offload_train:
                self.train.offload()
            if self.offload_rollout:
                self.rollout.onload()

    def use_for_training(self) -> None:
        if self.engines_in_trainer:
            assert self.train is not None
            self.train.use_for_training()
        elif self.takes_turns:
            assert self.train is not None and self.rollout is not None
            if self.offload_rollout:
                self.rollout.offload()
            if self.offload_train:
                self.train.onload()

    def before_engine_push(self) -> None:
        """Before the engines take new weights: engines of their own take them in their turn (onloaded,
        the trainer offloaded); engines the trainer hosts take them with both sides resident, and the
        push itself hands the device to the rollout."""
        if not self.engines_in_trainer:
            self.use_for_rollout()

    def all_actors(self) -> list[ActorHandle]:
        actors = list(self.train.actors) if self.train else []
        actors += self.rollout.actors if self.rollout and not self.engines_in_trainer else []
        for group in self.forward.values():
            actors += group.actors
        return actors + (self.critic.actors if self.critic else [])

    def shutdown(self) -> None:
        if self.rollout is not None:
            self.rollout.close()  # before the actors go: a health check must not replace them
        for actor in self.all_actors() + ([self.log_sink] if self.log_sink is not None else []):
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                log.debug("actor already gone", exc_info=True)
        release(self.placement_groups)


class EngineKind(StrEnum):
    """How the job's own rollout engines run (`RELAX_ROLLOUT_ENGINE`; unset: `IN_TRAINER` for a colocated RL
    job that can host them, else `DEFAULT_ENGINE_KIND`, as `pipeline.plans.engine_kind` decides). Which
    model code an HTTP engine's server runs (fastgen or HF generate) is `RELAX_ROLLOUT_BACKEND`
    (runtime/rollout/backend.py), passed from the driver's environment to the actors and their servers."""

    # a server speaking SGLang's HTTP protocol, driven through the SGLang client: real SGLang where it
    # imports and CUDA is present, else the built-in engine's server (runtime.rollout.sglang.server)
    HTTP = "http"
    IN_PROCESS = "in-process"  # the built-in torch engine inside a rollout actor of its own, called directly
    # colocated jobs: the built-in engine (fastgen on CUDA, else HF) inside each trainer rank's actor, its
    # weights copied in place after every step (`runtime.roles.colocated`); the default where it applies
    # (`pipeline.plans.engine_kind`)
    IN_TRAINER = "in-trainer"


ENGINE_KIND_ENV = "RELAX_ROLLOUT_ENGINE"
DEFAULT_ENGINE_KIND = EngineKind.HTTP


def engine_kind_from_env() -> EngineKind:
    return explicit_engine_kind() or DEFAULT_ENGINE_KIND


def explicit_engine_kind() -> EngineKind | None:
    """`$RELAX_ROLLOUT_ENGINE` as a kind; None when unset (the job's layout decides)."""
    value = os.environ.get(ENGINE_KIND_ENV, "").strip()
    try:
        return EngineKind(value) if value else None
    except ValueError:
        raise ValueError(
            f"{ENGINE_KIND_ENV}={value!r}: use one of {', '.join(k.value for k in EngineKind)}"
        ) from None


_ENGINE_ACTORS: dict[EngineKind, type] = {
    EngineKind.HTTP: HttpEngineActor,
    EngineKind.IN_PROCESS: RolloutEngineActor,
}


@dataclass(frozen=True)
class CriticPlan:
    """PPO's critic: its initial weights (the policy's initial checkpoint), its training config, and the train
    backend that runs it (`torch`: `TorchCriticBackend`; `megatron`: `MegatronCriticBackend`, with the
    architecture from `hf_checkpoint`'s config and the spec's `values`). `world`: a multi-rank backend's
    critic ranks (`placement.critic_world_size`; 1: one rank with the model-parallel sizes set to 1); None:
    the torch backend's one process."""

    model_path: str
    config: CriticConfig
    backend: str = "torch"
    hf_checkpoint: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    world: int | None = None


@dataclass(frozen=True)
class RolePlan:
    """Which roles a job starts and how (from the spec, by `pipeline.role_plan`)."""

    backend: str
    hf_checkpoint: str
    train_config: TrainConfig
    resource: dict[str, Any] | None
    colocate: bool
    with_train: bool = True
    with_rollout: bool = True
    need_ref: bool = False  # the trainer holds the reference model (colocated, or no reference role)
    separate: dict[Role, str] = field(default_factory=dict)  # forward-only role -> its initial weights
    log_probs_temperature: float = 1.0
    engine_kind: EngineKind = DEFAULT_ENGINE_KIND
    # a multi-rank backend's trainer ranks (`placement.train_world_size`); None: the torch backend's one
    train_world: int | None = None
    # the normalized spec's values, for a backend that reads its own parameters there (megatron)
    values: dict[str, Any] = field(default_factory=dict)
    # the job's SGLang server arguments (`--sglang-*`, `rollout.sglang.passthrough.server_argv`): on the
    # command line of each engine server the job starts (EngineKind.HTTP)
    engine_args: tuple[str, ...] = ()
    # `rollout-external-engine-addrs`: drive these running servers instead of starting engines
    external_engines: tuple[str, ...] = ()
    critic: CriticPlan | None = None
    # `--warm-hf-checkpoint-page-cache`: the folders every role's process reads into the page cache first
    warm_page_cache: tuple[str, ...] = ()
    # the job spec's resource demand (`jobspec.demand`), which lays out the colocated roles as the scheduler
    # placed them; None: computed from `resource` alone (`placement.resource_demand`)
    demand: ResourceDemand | None = None
    # role -> the Ray node id of each of its GPUs, as the scheduling pass allocated them (`jobspec.demand.
    # gpu_nodes`): each placement-group bundle is pinned there; empty: Ray places them (standalone runs)
    gpu_nodes: dict[str, list[str | None]] = field(default_factory=dict)
    # `--use-health-check`: the rollout engines are probed and replaced when hung or dead (the job's own
    # HTTP engines only: `runtime.roles.engine_health`); None: no health check
    health: HealthCheckConfig | None = None
    # `--offload-train` / `--offload-rollout`, as the engines hosted in the trainer's ranks honour them
    # (EngineKind.IN_TRAINER): the idle side releases its device memory during the other's turn
    offload_train: bool = True
    offload_rollout: bool = True
    # the samples one rollout asks for (prompts x `--n-samples-per-prompt`): the engines hosted in the
    # trainer's ranks keep a KV slot for each of their share (`colocated.hosted_batch_size`)
    rollout_samples: int = 256
    # `--autoscaler-config`: the job's own engines (actors of their own) are scaled out and in between
    # steps (`runtime.roles.elastic`); None: a fixed number of engines
    elastic: ElasticSettings | None = None


def hosts_engines(topology: Topology) -> str | None:
    """Why the trainer's rank actors cannot host the rollout engines in this layout (None: they can):
    each rank must sit alone on its device, with the one engine that device runs."""
    ranks = [slot.bundle_index for slot in topology.role_slots(Role.ACTOR)]
    engines = [slot.bundle_index for slot in topology.role_slots(Role.ROLLOUT)]
    if not topology.colocate:
        return "the roles are not colocated"
    if sorted(ranks) != sorted(engines) or len(set(ranks)) != len(ranks):
        return f"trainer ranks on devices {ranks}, engines on {engines}: not one engine per rank's device"
    return None


def start_roles(plan: RolePlan, *, device: Device, env_vars: dict[str, str] | None = None) -> Roles:
    """Reserve the placement groups, start every actor in parallel and wait until each has loaded its model."""
    topology = plan_topology(
        plan.resource,
        colocate=plan.colocate,
        with_rollout=plan.with_rollout and not plan.external_engines,  # external engines take no slot
        with_train=plan.with_train,
        device=device,
        separate_roles=tuple(plan.separate),
        with_critic=plan.critic is not None,
        train_world=plan.train_world,
        critic_world=plan.critic.world if plan.critic is not None else None,
        demand=plan.demand,
        # `--autoscaler-config`: an engine's device is its own placement group, and a job the pass placed starts
        # the engines its allocation holds now (the pass may have resized it since admission)
        elastic_engines=plan.elastic is not None,
        rollout_engines=len(plan.gpu_nodes.get(str(Role.ROLLOUT)) or ()) or None if plan.elastic else None,
    )
    kind = plan.engine_kind
    in_trainer = (
        kind is EngineKind.IN_TRAINER and plan.with_train and plan.with_rollout and not plan.external_engines
    )
    if kind is EngineKind.IN_TRAINER:
        why = hosts_engines(topology) if in_trainer else "no trainer or no engines of the job's own"
        if why is not None:
            if in_trainer:
                log.warning("rollout engines stay out of the trainer's ranks (%s): engine servers", why)
            in_trainer, kind = False, DEFAULT_ENGINE_KIND
    pgs = reserve(topology, nodes=plan.gpu_nodes)
    if os.environ.get(BACKEND_ENV, "").strip():  # which model code the engine servers run: they inherit it
        env_vars = {**(env_vars or {}), BACKEND_ENV: backend_from_env().value}
    if plan.warm_page_cache:
        env_vars = {**(env_vars or {}), WARM_ENV: os.pathsep.join(plan.warm_page_cache)}
    runtime_env = {"env_vars": env_vars} if env_vars else None
    started: list[ActorHandle] = []
    sink = None
    factory: EngineFactory | None = None
    starter: EngineStarter | None = None
    rollout: RolloutGroup | None = None

    def start(actor_class: type, role: Role, *args: Any, **kwargs: Any) -> list[ActorHandle]:
        actors = [
            ray.remote(actor_class)
            .options(runtime_env=runtime_env, **slot.ray_options(pgs, device))
            .remote(*args, **_per_actor(role, index), **kwargs)
            for index, slot in enumerate(topology.role_slots(role))
        ]
        started.extend(actors)
        return actors

    def _per_actor(role: Role, index: int) -> dict[str, Any]:
        if role is Role.ROLLOUT:
            return {"engine_index": index}
        hosted = {"engine_index": index} if role is Role.ACTOR and in_trainer else {}
        if role is Role.CRITIC or (role is Role.ACTOR and plan.train_world is not None):
            return {"rank": index, **hosted}
        return hosted

    def rendezvous(role: Role, avoid: tuple[int, ...] = ()) -> tuple[str, int]:
        """A port for the role's process group, picked on its rank 0's node before any rank starts (and
        not one already handed to another group of this job: those are not bound yet). Where that node is
        the driver's own, here: a task there would first wait for a worker process of its own to start
        (1-2 s before any rank could start, on a busy machine more)."""
        first = topology.role_slots(role)[0]
        bundles = ray.util.placement_group_table(pgs[first.group]).get("bundles_to_node_id") or {}
        if bundles.get(first.bundle_index) == ray.get_runtime_context().get_node_id():
            return free_loopback_port(avoid)
        return ray.get(
            ray.remote(free_loopback_port)
            .options(num_cpus=0, scheduling_strategy=first.ray_options(pgs, device)["scheduling_strategy"])
            .remote(avoid)
        )

    try:
        sink = start_log_sink()
        common = {"num_threads": 1, "log_sink": sink}
        ranks: dict[str, Any] = {}
        taken: tuple[int, ...] = ()
        if plan.with_train and plan.train_world is not None:
            master_addr, master_port = rendezvous(Role.ACTOR)
            taken = (master_port,)
            ranks = {
                "world_size": plan.train_world,
                "master_addr": master_addr,
                "master_port": master_port,
                "values": plan.values,
            }
        hosted = (
            {
                "offload_train": plan.offload_train,
                "offload_rollout": plan.offload_rollout,
                "max_batch_size": hosted_batch_size(
                    plan.rollout_samples, len(topology.role_slots(Role.ACTOR))
                ),
            }
            if in_trainer
            else {}
        )
        train_actors = start(
            ColocatedActor if in_trainer else TrainActor, Role.ACTOR, plan.backend, plan.hf_checkpoint,
            plan.train_config, need_ref=plan.need_ref, **ranks, **hosted, **common,
        )  # fmt: skip
        if plan.engine_args and plan.with_rollout and (plan.external_engines or kind is not EngineKind.HTTP):
            log.warning(
                "the job's SGLang server arguments are not used (%s): %s",
                "external engines are already running"
                if plan.external_engines
                else f"{ENGINE_KIND_ENV}={kind.value}",
                " ".join(plan.engine_args),
            )
        if in_trainer:
            engine_actors = list(train_actors)  # the same actors: each rank's engine
        elif plan.with_rollout and plan.external_engines:
            engine_actors = external_engine_actors(plan.external_engines, runtime_env=runtime_env)
            started.extend(engine_actors)
        else:
            # The job's engine secret: new at every driver start (so per attempt), handed to the engine
            # actors as an argument (through Ray, which wants its own token), never put in an environment.
            http = (
                {"api_key": engine_secret(), "server_args": plan.engine_args}
                if kind is EngineKind.HTTP
                else {}
            )
            engine_actors = start(_ENGINE_ACTORS[kind], Role.ROLLOUT, plan.hf_checkpoint, **common, **http)
            if plan.elastic is not None and engine_actors:
                starter = EngineStarter(
                    _ENGINE_ACTORS[kind], (plan.hf_checkpoint,), {**common, **http}, device, pgs, runtime_env
                )
            if plan.health is not None and engine_actors and kind is EngineKind.HTTP:
                factory = EngineFactory(
                    _ENGINE_ACTORS[kind],
                    (plan.hf_checkpoint,),
                    {**common, **http},
                    [slot.ray_options(pgs, device) for slot in topology.role_slots(Role.ROLLOUT)],
                    runtime_env=runtime_env,
                )
        critic_actors: list[ActorHandle] = []
        if plan.critic is not None:
            critic_ranks: dict[str, Any] = {}
            if plan.critic.world is not None:
                critic_addr, critic_port = rendezvous(Role.CRITIC, taken)
                critic_ranks = {
                    "world_size": plan.critic.world,
                    "master_addr": critic_addr,
                    "master_port": critic_port,
                }
            critic_actors = start(
                CriticActor,
                Role.CRITIC,
                plan.critic.model_path,
                plan.critic.config,
                backend=plan.critic.backend,
                hf_checkpoint=plan.critic.hf_checkpoint,
                values=plan.critic.values,
                **critic_ranks,
                **common,
            )
        forward = {
            role: ForwardGroup(
                role,
                start(ForwardActor, role, str(role), path, temperature=plan.log_probs_temperature, **common),
            )
            for role, path in plan.separate.items()
        }
        infos = ray.get([a.ready.remote() for a in started])
        rollout = RolloutGroup(engine_actors, in_trainer=in_trainer) if engine_actors else None
        if rollout is not None and plan.elastic is not None:
            if starter is None:
                log.warning(
                    "--autoscaler-config: only the job's own engines on devices of their own are scaled "
                    "(%s here): a fixed number of engines",
                    "external engines" if plan.external_engines else "engines in the trainer's ranks",
                )
            else:
                nodes = plan.gpu_nodes.get(str(Role.ROLLOUT)) or []
                homes = [
                    EngineHome(slot.group, nodes[i] if i < len(nodes) else None)
                    for i, slot in enumerate(topology.role_slots(Role.ROLLOUT))
                ]
                # placed by the scheduling pass: the engines follow what it grants (`ElasticRollout.follow`), and
                # the driver asks it for engines from the count its spec asks for
                rollout.elastic = ElasticRollout(
                    rollout,
                    starter,
                    plan.elastic,
                    homes=homes,
                    placed=bool(plan.gpu_nodes),
                    base=spec_engines(plan.resource),
                )
        if rollout is not None and plan.health is not None:
            if factory is None:
                log.warning(
                    "--use-health-check: only the job's own engine servers are checked and replaced "
                    "(%s here): no rollout health check",
                    "external engines" if plan.external_engines else f"{ENGINE_KIND_ENV}={kind.value}",
                )
            else:
                rollout.supervisor = EngineSupervisor(
                    rollout,
                    factory,
                    plan.health,
                    ray.get([a.ready.remote() for a in engine_actors]),
                    api_key=factory.kwargs.get("api_key"),
                )
                rollout.supervisor.start()
    except BaseException:
        if rollout is not None:
            rollout.close()
        for actor in started:
            ray.kill(actor)
        release(pgs)
        if sink is not None:
            ray.kill(sink)
        raise
    log.info(
        "roles ready: %d trainer rank(s), %d rollout engine(s) (%s), %d critic rank(s), %s, colocate=%s, "
        "placement groups %s",
        len(train_actors),
        len(engine_actors),
        f"external {list(plan.external_engines)}" if plan.external_engines else kind.value,
        len(critic_actors),
        {str(r): len(g.actors) for r, g in forward.items()} or "no forward-only roles",
        topology.colocate or (plan.colocate and bool(plan.external_engines)),
        dict(topology.groups),
    )
    return Roles(
        topology=topology,
        placement_groups=pgs,
        train=TrainGroup(train_actors) if train_actors else None,
        rollout=rollout,
        forward=forward,
        critic=CriticGroup(critic_actors) if critic_actors else None,
        log_sink=sink,
        infos=infos,
        external_colocated=bool(
            plan.colocate and plan.with_train and engine_actors and plan.external_engines
        ),
        engines_in_trainer=in_trainer,
        offload_train=plan.offload_train,
        offload_rollout=plan.offload_rollout,
    )
