"""An RL job's pipeline: rollout (live, ahead of the trainer, or loaded) -> log-probs -> values -> advantages
-> train -> weight sync, with save and eval. `build_rl` picks every stage implementation once, from the
spec, so the driver's loop stays free of mode conditionals."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.algos.advantages import AdvantageInputs, compute_advantages_and_returns
from runtime.algos.opd import opd_metrics
from runtime.data.prompts import PromptFormatter, PromptItem
from runtime.data.source import DataSourceInit
from runtime.eval import eval_metrics, load_eval_datasets
from runtime.observability import Stage, StepTimer
from runtime.pipeline.base import PipelineBase, PipelineParts
from runtime.pipeline.plans import (
    advantage_config,
    old_log_probs_from_train_forward,
    opd_config,
    student_log_probs,
)
from runtime.plugins import DataPostprocessFn, DataSource, RolloutFn, load_hook
from runtime.reporter import EventKind, RolloutSplit
from runtime.rewards import RewardModel
from runtime.rollout.context import DEFAULT_MAX_RESPONSE_LEN, RolloutContext, RolloutOutput
from runtime.rollout.generate import LengthLimits
from runtime.rollout.results import write_eval_result, write_train_result
from runtime.rollout.sources import AheadRollout, LiveRollout, LoadedRollout, RolloutSource
from runtime.rollout.stats import rollout_metrics
from runtime.train.checkpoint import CheckpointRecord
from runtime.train.critic import critic_save_root
from runtime.types import RolloutBatch

log = logging.getLogger("runtime.pipeline")


@dataclass(frozen=True)
class Generation:
    """What generating rollouts needs (absent when the job trains on loaded rollouts,
    `load-debug-rollout-data`): the data source, the rollout context and the eval function."""

    data: DataSource
    ctx: RolloutContext
    eval_fn: RolloutFn


@dataclass(kw_only=True)
class RLPipeline(PipelineBase):
    """Everything an RL job's loop touches. The driver reads as the algorithm; the detail lives here.

    `generation` is None when the rollouts are loaded; `reward` is None when nothing is scored (loaded
    rollouts without `custom-reward-post-process-path`); `postprocess` is `rollout-data-postprocess-path`,
    None when unset."""

    source: RolloutSource
    generation: Generation | None
    reward: RewardModel | None
    postprocess: DataPostprocessFn | None
    last_rollout: RolloutOutput | None = field(default=None, init=False)  # the newest trained rollout
    last_critic_save: int | None = field(default=None, init=False)  # the critic's newest checkpoint

    # -- stages, in the loop's order ----------------------------------------------------------------------------
    def begin(self, start: int) -> None:
        """Engines (and actor_fwd) start from the trainer's weights (matters after a resume); then the
        rollout source starts (fully-async: its thread begins generating ahead)."""
        self.push_weights(version=start, engines=True)
        self.source.start(start)

    def collect_rollout(self, rollout_id: int) -> RolloutOutput:
        """Data -> generate -> reward -> dynamic filter, through `rollout-function-path` (or loaded data)."""
        self.roles.use_for_rollout()
        return self.source.collect(rollout_id)

    def log_probs(self, rollout: RolloutOutput) -> RolloutBatch:
        """The batch with the estimator's rewards (`custom-reward-post-process-path`), old (policy) and
        reference log-probs, from the trainer or the forward-only roles; then
        `rollout-data-postprocess-path`. Old log-probs are the trainer's recompute (the engine's stay in
        `rollout_log_probs`; `use-rollout-logprobs` picks between them in the loss), or actor_fwd's; none
        in true-on-policy mode where only the loss reads them (`old_log_probs_from_train_forward`: the
        loss takes the train forward's, and this stage computes only what else is due, if anything)."""
        batch = RolloutBatch.from_samples(rollout.samples, self.tokenizer.pad_token_id)
        if self.reward is not None and self.reward.replaces_reward_normalization:
            batch.rewards = torch.tensor(self.reward.post_process(rollout.samples), dtype=torch.float32)
        if self.roles.train is not None:
            fwd, ref = self.roles.actor_fwd, self.roles.reference
            old = fwd is None and not old_log_probs_from_train_forward(self.spec)
            trainer_ref = ref is None and self.spec.needs_reference
            if old or trainer_ref or self.spec.has_teacher:
                self.roles.use_for_training()
                batch = self.roles.train.compute_log_probs(batch, old=old, ref=ref is None)
            if fwd is not None:
                batch.old_log_probs = fwd.log_probs(batch)
            if ref is not None and self.spec.needs_reference:
                batch.ref_log_probs = ref.log_probs(batch)
        if self.postprocess is not None:
            batch = self.postprocess(rollout.samples, batch) or batch
        return batch

    def values(self, batch: RolloutBatch) -> RolloutBatch:
        """PPO: the critic's values of the rollout's prefixes (GAE's baseline, value clipping's old values)."""
        if self.roles.critic is not None:
            batch.values = self.roles.critic.compute_values(batch)
        return batch

    def compute_advantages(self, batch: RolloutBatch) -> RolloutBatch:
        """`advantage-estimator` (then the OPD term and whitening) over the batch: advantages and returns.
        A custom reward post-process already normalised the rewards, so the estimator does not again."""
        s = self.spec
        if s.disable_compute_advantages_and_returns:
            return batch
        replaced = self.reward is not None and self.reward.replaces_reward_normalization
        out = compute_advantages_and_returns(
            s.advantage_estimator,
            AdvantageInputs(
                batch.rewards,
                batch.group_index,
                batch.loss_mask,
                log_probs=student_log_probs(s, batch),
                ref_log_probs=batch.ref_log_probs,
                values=batch.values,
                response_mask=batch.response_mask,
                teacher_log_probs=batch.teacher_log_probs,
            ),
            advantage_config(s, rewards_normalization=not s.disable_rewards_normalization and not replaced),
        )
        batch.advantages, batch.returns = out.advantages, out.returns
        return batch

    def train(self, rollout_id: int, batch: RolloutBatch) -> dict[str, float]:
        """One training step (none under `debug-rollout-only`); then `ref-update-interval`. PPO's critic
        trains on the returns meanwhile, on its own devices; the policy waits `num-critic-only-steps`
        rollouts (and never trains with `critic-train-only`)."""
        if self.roles.train is None:
            return {}
        self.roles.use_for_training()
        critic_step = self.roles.critic.async_train_step(batch) if self.roles.critic is not None else None
        metrics: dict[str, float] = {}
        if self.policy_trains(rollout_id):
            metrics = self.train_policy(rollout_id, batch)
        if critic_step is not None:
            critic = critic_step.get()
            metrics.update(
                value_loss=critic["value_loss"],
                value_clipfrac=critic["value_clipfrac"],
                critic_grad_norm=critic["grad_norm"],
                critic_lr=critic["lr"],
            )
        return metrics

    def policy_trains(self, rollout_id: int) -> bool:
        s = self.spec
        return not (s.has_critic and (s.critic_train_only or rollout_id < s.num_critic_only_steps))

    def sync_weights(self, rollout_id: int) -> None:
        """Engines get the new weights every `update-weights-interval` steps; actor_fwd every step.
        Only then may a fully-async rollout source start the rollouts this step allows: the transfer is
        queued on the engines before any of their generate calls."""
        engines = (rollout_id + 1) % max(1, self.spec.update_weights_interval) == 0
        self.push_weights(version=rollout_id + 1, engines=engines)
        self.source.trained(rollout_id + 1)

    def save_step(self, rollout_id: int, rollout: RolloutOutput, batch: RolloutBatch) -> None:
        """Per-sample records, debug train data, and the checkpoint when one is due."""
        self.last_rollout = rollout
        if self.spec.save:
            path = write_train_result(self.spec.save, rollout_id, rollout.samples)
            self.reporter.rollout(rollout_id, RolloutSplit.TRAIN, str(path), len(rollout.samples))
        self._save_due(rollout_id, batch)

    def save(self, rollout_id: int, *, blocking: bool | None = None) -> None:
        super().save(rollout_id, blocking=blocking)
        self.save_critic(rollout_id)

    def save_critic(self, rollout_id: int) -> None:
        """PPO: the critic's checkpoint of the same iteration, under `critic-save` (else `<save>/critic`)."""
        root = critic_save_root(self.spec.critic_save, self.spec.save)
        if self.roles.critic is None or root is None or self.last_critic_save == rollout_id:
            return
        record: CheckpointRecord = self.roles.critic.save_checkpoint(root, rollout_id)
        self.last_critic_save = rollout_id
        self.reporter.event(EventKind.CHECKPOINT_SAVED, f"critic step {record.step}: {record.path}")

    def data_state(self) -> dict[str, Any]:
        """The data position as of the newest trained rollout (a fully-async source is further ahead)."""
        rollout = self.last_rollout
        if rollout is not None and rollout.data_state is not None:
            return rollout.data_state
        return self.generation.data.state_dict() if self.generation is not None else {}

    def restore_data(self, iteration: int, data_state: dict[str, Any]) -> None:
        if self.generation is not None:
            self.generation.data.load_state_dict(data_state)
        self.last_critic_save = iteration

    def eval_due(self, trained_rollouts: int) -> bool:
        if self.generation is None or not self.generation.ctx.eval_datasets or not self.spec.eval_interval:
            return False
        if trained_rollouts == 0:
            return not self.spec.skip_eval_before_train
        return trained_rollouts % self.spec.eval_interval == 0 or trained_rollouts == self.total_rollouts

    def evaluate(self, trained_rollouts: int) -> dict[str, float]:
        """`eval-function-path` on every eval set (when due): `eval/*` metrics and
        `rollout_result/eval/<trained_rollouts>.jsonl`."""
        if not self.eval_due(trained_rollouts):
            return {}
        assert self.generation is not None
        self.roles.use_for_rollout()
        output = self.generation.eval_fn(self.generation.ctx, trained_rollouts, evaluation=True)
        metrics: dict[str, float] = {}
        for name, samples in output.datasets.items():
            metrics.update(eval_metrics(name, samples, log_passrate=self.spec.log_passrate))
        if self.spec.save and output.datasets:
            path = write_eval_result(self.spec.save, trained_rollouts, output.datasets)
            total = sum(len(v) for v in output.datasets.values())
            self.reporter.rollout(trained_rollouts, RolloutSplit.EVAL, str(path), total)
        return metrics

    def report_step(
        self,
        rollout_id: int,
        rollout: RolloutOutput,
        batch: RolloutBatch,
        train_metrics: dict[str, float],
        timer: StepTimer,
    ) -> None:
        samples = rollout.samples
        metrics = rollout_metrics(samples, batch)
        metrics.update(rollout.metrics)
        opd = opd_config(self.spec)
        if opd is not None and batch.teacher_log_probs is not None:
            student = student_log_probs(self.spec, batch)
            if student is not None:
                metrics.update(opd_metrics(student, batch.teacher_log_probs, batch.loss_mask, opd))
        metrics.update({f"train/{k}": v for k, v in train_metrics.items() if k != "optimizer_steps"})
        metrics.update(self.step_perf(timer, batch, samples))
        if self.roles.rollout is not None:  # `--use-health-check`: replacements so far, engines healthy now
            metrics.update(self.roles.rollout.health_metrics())
            # `--autoscaler-config`: the engines scaled between this step and the next
            rollout_s = timer.seconds.get(Stage.ROLLOUT, 0.0)
            metrics.update(self.roles.rollout.after_step(rollout_id, rollout_s, timer.step_seconds))
        self.finish_step(rollout_id, metrics)

    def stop_producing(self) -> None:
        self.source.close()

    def release(self) -> None:
        if self.reward is not None:
            self.reward.close()


def build_rl(parts: PipelineParts, formatter: PromptFormatter, items: list[PromptItem]) -> RLPipeline:
    """The RL pipeline over the shared `parts` (`PipelineBase`'s fields): the reward model, hooks, and the
    rollout source (loaded, live, or live ahead of the trainer)."""
    s = parts.spec
    postprocess = load_hook(s.rollout_data_postprocess_path, "rollout_data_postprocess_path")
    reward = RewardModel.from_spec(s) if s.generates or s.custom_reward_post_process_path else None
    try:
        source: RolloutSource
        generation: Generation | None = None
        if s.load_debug_rollout_data:
            source = LoadedRollout(
                s.load_debug_rollout_data, subsample=s.load_debug_rollout_data_subsample, seed=s.rollout_seed
            )
        else:
            generation, live = _live(parts, formatter, items, reward)
            source = (
                AheadRollout(live, max_staleness=s.max_staleness, last_rollout_id=parts.total_rollouts)
                if s.fully_async
                else live
            )
    except BaseException:
        if reward is not None:
            reward.close()
        raise
    return RLPipeline(
        **parts.as_kwargs(), source=source, generation=generation, reward=reward, postprocess=postprocess
    )


def _live(
    parts: PipelineParts, formatter: PromptFormatter, items: list[PromptItem], reward: RewardModel | None
) -> tuple[Generation, LiveRollout]:
    """The data source, the rollout context (engines, hooks, length limits, eval sets), the rollout and
    eval functions."""
    s = parts.spec
    tokenizer, engine = parts.tokenizer, parts.roles.rollout
    factory = load_hook(s.data_source_path, "data_source_path")
    assert factory is not None
    data = factory(
        DataSourceInit(
            items=items,
            formatter=formatter,
            n_samples_per_prompt=s.n_samples_per_prompt,
            shuffle=s.rollout_shuffle,
            seed=s.rollout_seed,
            buffer_filter=load_hook(s.buffer_filter_path, "buffer_filter_path"),
        )
    )
    assert engine is not None
    eval_datasets = load_eval_datasets(s, tokenizer) if (s.eval_prompt_data or s.eval_config) else []
    ctx = RolloutContext(
        spec=s,
        data=data,
        engine=engine,
        tokenizer=tokenizer,
        reward=reward,
        limits=LengthLimits(
            s.rollout_max_response_len or DEFAULT_MAX_RESPONSE_LEN, s.rollout_max_context_len
        ),
        dynamic_filter=load_hook(s.dynamic_sampling_filter_path, "dynamic_sampling_filter_path"),
        custom_generate=load_hook(s.custom_generate_function_path, "custom_generate_function_path"),
        eval_datasets=eval_datasets,
        eval_generate={
            d.name: load_hook(
                d.custom_generate_function_path, f"eval-config {d.name}.custom_generate_function_path"
            )
            for d in eval_datasets
            if d.custom_generate_function_path
        },
    )
    rollout_fn = load_hook(s.rollout_function_path, "rollout_function_path")
    eval_fn = load_hook(s.eval_function_path or s.rollout_function_path, "eval_function_path")
    assert eval_fn is not None
    live = LiveRollout(ctx, _checked(rollout_fn), save_debug=s.save_debug_rollout_data)
    return Generation(data=data, ctx=ctx, eval_fn=eval_fn), live


def _checked(rollout_fn: Any) -> Any:
    def call(ctx: RolloutContext, rollout_id: int) -> RolloutOutput:
        output = rollout_fn(ctx, rollout_id)
        if not isinstance(output, RolloutOutput):
            raise TypeError(f"rollout_function_path must return a RolloutOutput, got {type(output).__name__}")
        return output

    return call
