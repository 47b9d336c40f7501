"""What every job's pipeline has, RL or SFT: the spec, the reporter, the tokenizer, the started roles, the
checkpoints and the weight sync, and the stages that work the same for both (policy step, weight push,
save, resume, step report, finish, close)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any

import ray
import torch

from runtime.observability import Stage, StepTimer
from runtime.reporter import EventKind, Reporter
from runtime.roles.groups import Roles
from runtime.roles.logs import LogRelay
from runtime.rollout.sources import debug_data_path
from runtime.saving import CheckpointManager
from runtime.spec import RuntimeSpec
from runtime.types import RolloutBatch, Sample
from runtime.weight_sync import WeightSync

log = logging.getLogger("runtime.pipeline")


@dataclass(kw_only=True)
class PipelineParts:
    """The parts both kinds of job share (`PipelineBase`'s fields), built once by `build_pipeline` and handed
    to the kind's builder. `relay` is None where the roles have no log sink to relay from (`Roles.log_sink`)."""

    spec: RuntimeSpec
    reporter: Reporter
    tokenizer: Any
    roles: Roles
    total_rollouts: int
    checkpoints: CheckpointManager
    weight_sync: WeightSync
    relay: LogRelay | None

    def as_kwargs(self) -> dict[str, Any]:
        """These parts by field name, to construct a pipeline from: ``RLPipeline(**parts.as_kwargs(), ...)``."""
        return {f.name: getattr(self, f.name) for f in fields(PipelineParts)}


@dataclass(kw_only=True)
class PipelineBase(PipelineParts):
    """The parts both kinds of job share, each set at construction, and the stages that work the same for
    both."""

    pending_pushes: list[ray.ObjectRef] = field(default_factory=list, init=False)
    _warned: set[str] = field(default_factory=set, init=False)

    # -- what each kind adds ---------------------------------------------------------------------------------------
    def data_state(self) -> dict[str, Any]:
        """The data position a checkpoint records."""
        raise NotImplementedError

    def restore_data(self, iteration: int, data_state: dict[str, Any]) -> None:
        """Put the data position (and any per-kind state) back as checkpoint `iteration` recorded it."""
        raise NotImplementedError

    # -- shared stages --------------------------------------------------------------------------------------------
    def train_policy(self, rollout_id: int, batch: RolloutBatch) -> dict[str, float]:
        """One policy step on the trainer; then `ref-update-interval`."""
        assert self.roles.train is not None
        metrics = self.roles.train.train_step(batch)
        interval = self.spec.ref_update_interval
        if interval and (rollout_id + 1) % interval == 0:
            self.update_reference(rollout_id)
        return metrics

    def update_reference(self, rollout_id: int) -> None:
        """`ref-update-interval`: the reference model (of the KL term) takes the policy's weights."""
        reference = self.roles.reference
        if not self.spec.needs_reference:
            if "ref_update" not in self._warned:
                log.warning(
                    "ref_update_interval is set but no KL term uses a reference model: nothing to update"
                )
                self._warned.add("ref_update")
            return
        if reference is not None and self.roles.train is not None:
            self.weight_sync.push(self.roles.train, [reference], version=rollout_id + 1)
        elif self.roles.train is not None:
            self.roles.train.update_reference()
        log.info("reference model updated to the policy after step %d", rollout_id + 1)

    def push_weights(self, version: int, *, engines: bool) -> None:
        if self.roles.train is None:
            return
        receivers: list[Any] = []
        if engines and self.roles.rollout is not None:
            self.roles.before_engine_push()
            receivers.append(self.roles.rollout)
        if self.roles.actor_fwd is not None:
            receivers.append(self.roles.actor_fwd)
        if not receivers:
            return
        # fully-async: queue the transfer behind the engines' in-flight generations; only the previous
        # push is awaited, so weights never pile up in the object store
        ray.get(self.pending_pushes)
        wait = not self.spec.fully_async
        self.pending_pushes = self.weight_sync.push(self.roles.train, receivers, version=version, wait=wait)

    def _save_due(self, rollout_id: int, batch: RolloutBatch) -> None:
        """What every step saves: debug train data, and the checkpoint when one is due."""
        s = self.spec
        if s.save_debug_train_data:
            path = debug_data_path(s.save_debug_train_data, rollout_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({k: v for k, v in vars(batch).items() if v is not None}, path)
        if self.checkpoints.due(rollout_id):
            self.save(rollout_id)
        else:
            self.checkpoints.collect()

    def save(self, rollout_id: int, *, blocking: bool | None = None) -> None:
        state = {"data": self.data_state(), "rollout_id": rollout_id}
        if self.spec.save:  # the reports up to this step survive the driver once the checkpoint exists
            self.reporter.durable_through(rollout_id)
        self.checkpoints.save(rollout_id, state, blocking=blocking)

    def resume(self) -> int:
        """Load the latest checkpoint under `load` (if any) and return the first rollout id to run."""
        spec = self.spec
        start = 0
        if spec.load and self.roles.train is not None:
            loaded = self.roles.train.load_checkpoint(spec.load)
            if loaded is not None:
                iteration, state = loaded
                self.restore_data(iteration, state.get("data", {}))
                start = iteration + 1
                self.checkpoints.last_saved = iteration
                self.reporter.event(EventKind.RESUMED, f"from {spec.load} iteration {iteration}")
                log.info("resumed from %s at iteration %d", spec.load, iteration)
            else:
                log.info("no checkpoint under %s yet: starting from %s", spec.load, spec.hf_checkpoint)
        elif spec.load:
            log.warning("load=%s: debug_rollout_only has no trainer to restore; starting fresh", spec.load)
        if self.roles.critic is not None and spec.critic_load:
            iteration = self.roles.critic.load_checkpoint(spec.critic_load)
            if iteration is not None and iteration + 1 != start:
                log.warning("critic restored from iteration %d, the policy resumes at %d", iteration, start)
        if spec.start_rollout_id is not None:
            start = spec.start_rollout_id
        return start

    # -- reporting ------------------------------------------------------------------------------------------------
    @staticmethod
    def step_perf(timer: StepTimer, batch: RolloutBatch, samples: list[Sample] | None) -> dict[str, float]:
        perf = timer.metrics()
        perf["perf/tokens_per_s"] = batch.num_tokens / max(timer.step_seconds, 1e-9)
        rollout_s = timer.seconds.get(Stage.ROLLOUT)
        if samples and rollout_s:
            perf["perf/rollout_tokens_per_s"] = sum(s.response_length for s in samples) / max(rollout_s, 1e-9)
        return perf

    def finish_step(self, rollout_id: int, metrics: dict[str, float]) -> None:
        self.reporter.metrics(rollout_id, metrics)
        self.reporter.set_progress(rollout_id + 1, self.total_rollouts)
        shown = ("rollout/reward", "train/loss", "train/grad_norm", "perf/step_time")
        summary = " ".join(f"{k}={metrics[k]:.4g}" for k in shown if k in metrics)
        log.info("step %d/%d %s", rollout_id + 1, self.total_rollouts, summary)

    def finish(self) -> None:
        """The last state is always kept: a final checkpoint under `save`, a final HF export under
        `save-hf`; background saves are waited for."""
        last = self.total_rollouts - 1
        if last >= 0:
            self.save(last, blocking=True)
        self.checkpoints.collect(wait=True)

    # -- closing --------------------------------------------------------------------------------------------------
    def stop_producing(self) -> None:
        """Stop what produces work in the background (RL: a fully-async rollout source)."""

    def release(self) -> None:
        """Release what this kind holds besides the roles (RL: the reward model's clients)."""

    def close(self) -> None:
        try:
            self.stop_producing()
            if self.pending_pushes:
                ray.get(self.pending_pushes, timeout=60)
            self.checkpoints.collect(wait=True)
        except Exception:  # noqa: BLE001 - closing must not hide the run's own outcome
            log.warning("closing the pipeline", exc_info=True)
        finally:
            if self.relay is not None:
                self.relay.close()
            self.release()
            self.roles.shutdown()
