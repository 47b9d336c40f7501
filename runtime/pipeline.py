"""Assembles a job's pipeline from its spec and implements each stage the driver calls by name.

Behaviour the spec switches on is chosen here, once, by picking stage implementations (a rollout source:
live, ahead-of-trainer or loaded; hooks loaded by dotted path; forward-only roles), so the driver's loops
stay free of mode conditionals.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
import transformers
from transformers import AutoTokenizer

from runtime.access import check_paths, owner_of
from runtime.algos.advantages import AdvantageConfig, AdvantageInputs, compute_advantages_and_returns
from runtime.algos.losses import LossConfig
from runtime.algos.opd import OPDConfig, opd_metrics
from runtime.data.prompts import (
    DatasetConfig,
    PromptCursor,
    PromptFormatter,
    PromptItem,
    drop_long_prompts,
    read_prompt_items,
    split_eval_holdout,
)
from runtime.data.sft import OversizePolicy, OversizeStrategy, SFTExampleBuilder
from runtime.data.source import DataSourceInit
from runtime.devices import Device
from runtime.eval import eval_metrics, load_eval_datasets, perplexity_metrics, write_predictions
from runtime.observability import Stage, StepTimer
from runtime.plugins import DataPostprocessFn, DataSource, RolloutFn, load_hook
from runtime.reporter import EventKind, Phase, Reporter, RolloutSplit
from runtime.rewards import RewardModel
from runtime.roles.groups import CriticPlan, RolePlan, Roles, engine_kind_from_env, start_roles
from runtime.roles.logs import LogRelay
from runtime.roles.placement import Role, critic_world_size, train_world_size
from runtime.rollout.context import DEFAULT_MAX_RESPONSE_LEN, RolloutContext, RolloutOutput
from runtime.rollout.generate import GenerateContext, LengthLimits, advance
from runtime.rollout.params import SamplingParams
from runtime.rollout.results import write_eval_result, write_train_result
from runtime.rollout.sglang.passthrough import server_argv
from runtime.rollout.sources import AheadRollout, LiveRollout, LoadedRollout, RolloutSource, debug_data_path
from runtime.rollout.stats import rollout_metrics
from runtime.saving import CheckpointManager
from runtime.spec import RuntimeSpec
from runtime.train.base import is_multi_rank
from runtime.train.checkpoint import CheckpointRecord, resolve_model_folder
from runtime.train.critic import CriticConfig, critic_save_root
from runtime.train.schedule import DecayStyle, LRSchedule
from runtime.train.torch_backend import TrainConfig
from runtime.types import RolloutBatch, Sample
from runtime.weight_sync import WeightSync, WeightSyncBackend, create_weight_sync

transformers.utils.logging.disable_progress_bar()
log = logging.getLogger(__name__)


@dataclass
class SFTData:
    """An SFT job's data: the training cursor, the held-out eval rows and their prebuilt samples."""

    builder: SFTExampleBuilder
    cursor: PromptCursor
    eval_items: list[PromptItem]
    eval_samples: list[Sample]


@dataclass
class Pipeline:
    """Everything one job's loop touches. The driver reads as the algorithm; the detail lives here."""

    spec: RuntimeSpec
    reporter: Reporter
    tokenizer: Any
    roles: Roles
    total_rollouts: int
    checkpoints: CheckpointManager
    data: DataSource | None = None
    rollout_ctx: RolloutContext | None = None
    source: RolloutSource | None = None
    eval_fn: RolloutFn | None = None
    postprocess: DataPostprocessFn | None = None
    weight_sync: WeightSync | None = None
    reward: RewardModel | None = None
    sft: SFTData | None = None
    relay: LogRelay | None = None
    pending_pushes: list[ray.ObjectRef] = field(default_factory=list)
    last_rollout: RolloutOutput | None = (
        None  # the newest trained rollout: its data state is what a save records
    )
    _warned: set[str] = field(default_factory=set)
    last_critic_save: int | None = None  # the iteration of the critic's newest checkpoint

    # -- RL stages --------------------------------------------------------------------------------------------
    def begin_rl(self, start: int) -> None:
        """Engines (and actor_fwd) start from the trainer's weights (matters after a resume); then the
        rollout source starts (fully-async: its thread begins generating ahead)."""
        self.push_weights(version=start, engines=True)
        assert self.source is not None
        self.source.start(start)

    def collect_rollout(self, rollout_id: int) -> RolloutOutput:
        """Data -> generate -> reward -> dynamic filter, through `rollout-function-path` (or loaded data)."""
        assert self.source is not None
        self.roles.use_for_rollout()
        return self.source.collect(rollout_id)

    def log_probs(self, rollout: RolloutOutput) -> RolloutBatch:
        """The batch with the estimator's rewards (`custom-reward-post-process-path`), old (policy) and
        reference log-probs, from the trainer or the forward-only roles; then
        `rollout-data-postprocess-path`. Old log-probs are always the trainer's recompute (the engine's
        stay in `rollout_log_probs`; `use-rollout-logprobs` picks between them in the loss)."""
        batch = RolloutBatch.from_samples(rollout.samples, self.tokenizer.pad_token_id)
        if self.reward is not None and self.reward.replaces_reward_normalization:
            batch.rewards = torch.tensor(self.reward.post_process(rollout.samples), dtype=torch.float32)
        if self.roles.train is not None:
            self.roles.use_for_training()
            fwd, ref = self.roles.actor_fwd, self.roles.reference
            batch = self.roles.train.compute_log_probs(batch, old=fwd is None, ref=ref is None)
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
            metrics = self.roles.train.train_step(batch)
            interval = self.spec.ref_update_interval
            if interval and (rollout_id + 1) % interval == 0:
                self.update_reference(rollout_id)
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
        if reference is not None and self.weight_sync is not None and self.roles.train is not None:
            self.weight_sync.push(self.roles.train, [reference], version=rollout_id + 1)
        elif self.roles.train is not None:
            self.roles.train.update_reference()
        log.info("reference model updated to the policy after step %d", rollout_id + 1)

    def sync_weights(self, rollout_id: int) -> None:
        """Engines get the new weights every `update-weights-interval` steps; actor_fwd every step.
        Only then may a fully-async rollout source start the rollouts this step allows: the transfer is
        queued on the engines before any of their generate calls."""
        engines = (rollout_id + 1) % max(1, self.spec.update_weights_interval) == 0
        self.push_weights(version=rollout_id + 1, engines=engines)
        if self.source is not None:
            self.source.trained(rollout_id + 1)

    def push_weights(self, version: int, *, engines: bool) -> None:
        if self.roles.train is None or self.weight_sync is None:
            return
        receivers: list[Any] = []
        if engines and self.roles.rollout is not None:
            self.roles.use_for_rollout()
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

    def save_step(self, rollout_id: int, rollout: RolloutOutput | None, batch: RolloutBatch) -> None:
        """Per-sample records, debug train data, and the checkpoint when one is due."""
        s = self.spec
        self.last_rollout = rollout or self.last_rollout
        if rollout is not None and s.save:
            path = write_train_result(s.save, rollout_id, rollout.samples)
            self.reporter.rollout(rollout_id, RolloutSplit.TRAIN, str(path), len(rollout.samples))
        if s.save_debug_train_data:
            path = debug_data_path(s.save_debug_train_data, rollout_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({k: v for k, v in vars(batch).items() if v is not None}, path)
        if self.checkpoints.due(rollout_id):
            self.save(rollout_id, rollout)
        else:
            self.checkpoints.collect()

    def save(
        self, rollout_id: int, rollout: RolloutOutput | None = None, *, blocking: bool | None = None
    ) -> None:
        state = {"data": self.data_state(rollout), "rollout_id": rollout_id}
        if self.spec.save:  # the reports up to this step survive the driver once the checkpoint exists
            self.reporter.durable_through(rollout_id)
        self.checkpoints.save(rollout_id, state, blocking=blocking)
        self.save_critic(rollout_id)

    def save_critic(self, rollout_id: int) -> None:
        """PPO: the critic's checkpoint of the same iteration, under `critic-save` (else `<save>/critic`)."""
        root = critic_save_root(self.spec.critic_save, self.spec.save)
        if self.roles.critic is None or root is None or self.last_critic_save == rollout_id:
            return
        record: CheckpointRecord = self.roles.critic.save_checkpoint(root, rollout_id)
        self.last_critic_save = rollout_id
        self.reporter.event(EventKind.CHECKPOINT_SAVED, f"critic step {record.step}: {record.path}")

    def data_state(self, rollout: RolloutOutput | None) -> dict[str, Any]:
        """The data position as of the newest trained rollout (a fully-async source is further ahead)."""
        rollout = rollout or self.last_rollout
        if rollout is not None and rollout.data_state is not None:
            return rollout.data_state
        if self.sft is not None:
            return self.sft.cursor.state_dict()
        return self.data.state_dict() if self.data is not None else {}

    def eval_due(self, trained_rollouts: int) -> bool:
        if self.rollout_ctx is None or not self.rollout_ctx.eval_datasets or not self.spec.eval_interval:
            return False
        if trained_rollouts == 0:
            return not self.spec.skip_eval_before_train
        return trained_rollouts % self.spec.eval_interval == 0 or trained_rollouts == self.total_rollouts

    def evaluate(self, trained_rollouts: int) -> dict[str, float]:
        """`eval-function-path` on every eval set (when due): `eval/*` metrics and
        `rollout_result/eval/<trained_rollouts>.jsonl`."""
        if not self.eval_due(trained_rollouts):
            return {}
        assert self.rollout_ctx is not None and self.eval_fn is not None
        self.roles.use_for_rollout()
        output = self.eval_fn(self.rollout_ctx, trained_rollouts, evaluation=True)
        metrics: dict[str, float] = {}
        for name, samples in output.datasets.items():
            metrics.update(eval_metrics(name, samples, log_passrate=self.spec.log_passrate))
        if self.spec.save and output.datasets:
            path = write_eval_result(self.spec.save, trained_rollouts, output.datasets)
            total = sum(len(v) for v in output.datasets.values())
            self.reporter.rollout(trained_rollouts, RolloutSplit.EVAL, str(path), total)
        return metrics

    # -- SFT stages -------------------------------------------------------------------------------------------
    def sft_batch(self) -> RolloutBatch:
        assert self.sft is not None
        want = int(self.spec.rollout_batch_size or 1)
        samples: list[Sample] = []
        for _ in range(64):  # oversize `skip` may drop rows: draw until the batch has at least one
            samples += self.sft.builder.build_all(self.sft.cursor.next_prompts(want - len(samples)))
            if samples:
                break
        if not samples:
            raise RuntimeError("sft-oversize-strategy skip dropped every row drawn: raise max-tokens-per-gpu")
        for index, sample in enumerate(samples):
            sample.index = sample.group_index = index
        return RolloutBatch.from_samples(samples, self.tokenizer.pad_token_id)

    def sft_evaluate(self, rollout_id: int) -> dict[str, float]:
        """Perplexity on the held-out rows every `eval-interval` steps, predictions every
        `sft-predict-interval` steps (Relax's SFT schedule: after step r when the interval divides r + 1)."""
        metrics: dict[str, float] = {}
        s = self.spec
        if self.sft is None or not self.sft.eval_items:
            return metrics
        if s.eval_interval and (rollout_id + 1) % s.eval_interval == 0:
            started = time.perf_counter()
            metrics.update(self.perplexity())
            metrics["perf/sft_eval_time"] = time.perf_counter() - started
        if s.sft_predict_interval and (rollout_id + 1) % s.sft_predict_interval == 0:
            started = time.perf_counter()
            self.predict(rollout_id)
            metrics["perf/sft_predict_time"] = time.perf_counter() - started
        return metrics

    def perplexity(self) -> dict[str, float]:
        assert self.sft is not None and self.roles.train is not None
        self.roles.use_for_training()
        chunk = self.spec.effective_global_batch_size or len(self.sft.eval_samples) or 1
        total_nll, total_tokens = 0.0, 0
        for start in range(0, len(self.sft.eval_samples), chunk):
            part = RolloutBatch.from_samples(
                self.sft.eval_samples[start : start + chunk], self.tokenizer.pad_token_id
            )
            nll, tokens = self.roles.train.evaluate_nll(part)
            total_nll, total_tokens = total_nll + nll, total_tokens + tokens
        return perplexity_metrics(total_nll, total_tokens)

    def predict(self, rollout_id: int) -> None:
        """Generate on the held-out prompts with the current weights and write
        `<save>/predict/predictions_step_<rollout_id>.jsonl` (prompt, reference, completion)."""
        assert self.sft is not None and self.roles.rollout is not None and self.spec.save
        self.push_weights(version=rollout_id + 1, engines=True)
        prompts = [self.sft.builder.prediction_prompt(item) for item in self.sft.eval_items]
        samples = [
            Sample(
                index=i,
                group_index=i,
                prompt=p.prompt_text,
                tokens=self.sft.builder.formatter.encode_text(p.prompt_text),
            )
            for i, p in enumerate(prompts)
        ]
        advance(samples, self._predict_context(rollout_id))
        rows = [
            {"prompt": p.prompt_text, "reference": p.reference, "completion": s.response}
            for p, s in zip(prompts, samples, strict=True)
        ]
        path = write_predictions(self.spec.save, rollout_id, rows)
        self.reporter.prediction(rollout_id, str(path), len(rows))
        self.reporter.event(EventKind.PREDICTIONS_WRITTEN, f"step {rollout_id}: {path} ({len(rows)} rows)")
        self.roles.use_for_training()

    def _predict_context(self, rollout_id: int) -> GenerateContext:
        s = self.spec
        max_len = s.eval_max_response_len or s.rollout_max_response_len or DEFAULT_MAX_RESPONSE_LEN
        params = SamplingParams(
            temperature=s.eval_temperature if s.eval_temperature is not None else s.rollout_temperature,
            top_p=s.eval_top_p if s.eval_top_p is not None else s.rollout_top_p,
            top_k=s.eval_top_k if s.eval_top_k is not None else s.rollout_top_k,
            max_new_tokens=max_len,
            stop=tuple(s.rollout_stop or ()),
            stop_token_ids=tuple(s.rollout_stop_token_ids or ()),
            min_new_tokens=s.eval_min_new_tokens or 0,
            seed=s.rollout_seed * 1_000_003 + 7919 * rollout_id + 1,
        )
        assert self.roles.rollout is not None
        self.roles.use_for_rollout()
        return GenerateContext(
            engine=self.roles.rollout,
            tokenizer=self.tokenizer,
            params=params,
            limits=LengthLimits(max_len, s.eval_max_context_len or s.rollout_max_context_len),
            rollout_id=rollout_id,
            evaluation=True,
            skip_special_tokens=True,
        )

    # -- reporting ----------------------------------------------------------------------------------------------
    def report_rl_step(
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
        metrics.update(self._perf(timer, batch, samples))
        self._finish_step(rollout_id, metrics)

    def report_sft_step(
        self, rollout_id: int, batch: RolloutBatch, train_metrics: dict[str, float], timer: StepTimer
    ) -> None:
        metrics = {f"train/{k}": v for k, v in train_metrics.items() if k != "optimizer_steps"}
        metrics.update(self._perf(timer, batch, None))
        self._finish_step(rollout_id, metrics)

    @staticmethod
    def _perf(timer: StepTimer, batch: RolloutBatch, samples: list[Sample] | None) -> dict[str, float]:
        perf = timer.metrics()
        perf["perf/tokens_per_s"] = batch.num_tokens / max(timer.step_seconds, 1e-9)
        rollout_s = timer.seconds.get(Stage.ROLLOUT)
        if samples and rollout_s:
            perf["perf/rollout_tokens_per_s"] = sum(s.response_length for s in samples) / max(rollout_s, 1e-9)
        return perf

    def _finish_step(self, rollout_id: int, metrics: dict[str, float]) -> None:
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

    def close(self) -> None:
        try:
            if self.source is not None:
                self.source.close()
            if self.pending_pushes:
                ray.get(self.pending_pushes, timeout=60)
            self.checkpoints.collect(wait=True)
        except Exception:  # noqa: BLE001 - closing must not hide the run's own outcome
            log.warning("closing the pipeline", exc_info=True)
        finally:
            if self.relay is not None:
                self.relay.close()
            if self.reward is not None:
                self.reward.close()
            self.roles.shutdown()


# -- building ------------------------------------------------------------------------------------------------------
def train_config_from(spec: RuntimeSpec, total_rollouts: int) -> TrainConfig:
    gbs = spec.effective_global_batch_size
    steps_per_rollout = math.ceil(spec.samples_per_rollout / gbs) if gbs else 1
    style = DecayStyle(spec.lr_decay_style)
    schedule = LRSchedule(
        lr=spec.lr,
        min_lr=spec.min_lr,
        style=style,
        warmup_steps=spec.lr_warmup_iters,
        decay_steps=spec.lr_decay_iters or total_rollouts * steps_per_rollout,
    )
    return TrainConfig(
        loss_type=spec.loss_type,
        loss=loss_config_from(spec),
        lr_schedule=schedule,
        weight_decay=spec.weight_decay,
        adam_beta1=spec.adam_beta1,
        adam_beta2=spec.adam_beta2,
        adam_eps=spec.adam_eps,
        clip_grad=spec.clip_grad,
        seed=spec.seed,
        global_batch_size=gbs or None,
        micro_batch_size=spec.micro_batch_size,
        max_tokens_per_micro_batch=spec.max_tokens_per_gpu if spec.use_dynamic_batch_size else None,
        log_probs_max_tokens=spec.log_probs_max_tokens_per_gpu,
        log_probs_temperature=1.0 if spec.is_sft else spec.rollout_temperature,
        save_optimizer=not spec.no_save_optim,
        ref_load=spec.ref_load,
        ref_ckpt_step=spec.ref_ckpt_step,
        ref_update_interval=spec.ref_update_interval,
        opd_teacher_load=spec.opd_teacher_load if spec.has_teacher else None,
        opd_teacher_ckpt_step=spec.opd_teacher_ckpt_step if spec.has_teacher else None,
        only_train_params=tuple(spec.only_train_params_name_list or ()),
        freeze_params=tuple(spec.freeze_params_name_list or ()),
        owner=owner_of(spec),
    )


def loss_config_from(spec: RuntimeSpec) -> LossConfig:
    """The loss parameters (policy loss, KL loss, off-policy corrections, value loss, hooks)."""
    return LossConfig(
        eps_clip=spec.eps_clip,
        eps_clip_high=spec.effective_eps_clip_high,
        eps_clip_c=spec.eps_clip_c,
        use_kl_loss=spec.use_kl_loss,
        kl_loss_coef=spec.kl_loss_coef,
        kl_loss_type=spec.kl_loss_type,
        use_unbiased_kl=spec.use_unbiased_kl,
        entropy_coef=spec.entropy_coef,
        per_token_loss=spec.calculate_per_token_loss,
        advantage_estimator=spec.advantage_estimator,
        sapo_tau_pos=spec.sapo_tau_pos,
        sapo_tau_neg=spec.sapo_tau_neg,
        use_rollout_logprobs=spec.use_rollout_logprobs,
        use_tis=spec.use_tis,
        tis_clip=spec.tis_clip,
        tis_clip_low=spec.tis_clip_low,
        custom_tis_function_path=spec.custom_tis_function_path,
        get_mismatch_metrics=spec.get_mismatch_metrics,
        custom_pg_loss_reducer_function_path=spec.custom_pg_loss_reducer_function_path,
        use_opsm=spec.use_opsm,
        opsm_delta=spec.opsm_delta,
        value_clip=spec.value_clip,
        custom_loss_function_path=spec.custom_loss_function_path,
        opd=opd_config(spec),
    )


def opd_config(spec: RuntimeSpec) -> OPDConfig | None:
    """On-policy distillation's parameters (`use-opd`), None where it does not run (`has_teacher`)."""
    if not spec.has_teacher:
        return None
    return OPDConfig(
        kl_type=spec.opd_kl_type,
        kl_coef=spec.opd_kl_coef,
        loss_coef=spec.opd_loss_coef,
        log_prob_min_clamp=spec.opd_log_prob_min_clamp,
        per_token_clip=spec.opd_per_token_clip,
        is_clip=spec.opd_is_clip,
        only_reward=spec.opd_only_reward,
    )


def student_log_probs(spec: RuntimeSpec, batch: RolloutBatch) -> torch.Tensor | None:
    """pi_old of the sampled tokens, as the advantages stage reads it (KL shaping, OPD's advantage mode and
    `opd/kl`): the engine's with `use-rollout-logprobs`, else the trainer's recompute."""
    return batch.rollout_log_probs if spec.use_rollout_logprobs else batch.old_log_probs


def advantage_config(spec: RuntimeSpec, *, rewards_normalization: bool) -> AdvantageConfig:
    """The advantages stage's parameters, on-policy distillation's (`opd_config`) included."""
    return AdvantageConfig(
        std_normalization=not spec.disable_grpo_std_normalization,
        rewards_normalization=rewards_normalization,
        gamma=spec.gamma,
        lambd=spec.lambd,
        kl_coef=spec.kl_coef,
        kl_type=spec.kl_loss_type,
        normalize_advantages=spec.normalize_advantages,
        opd=opd_config(spec),
    )


def critic_plan(
    spec: RuntimeSpec, total_rollouts: int, initial_weights: str, device: Device | None = None
) -> CriticPlan | None:
    """PPO's critic: the policy's initial weights with a fresh value head, `critic-lr` (default lr) with
    its own `critic-lr-warmup-iters`, the policy's batching and optimizer settings; on the job's train
    backend (megatron: megatron-core, which reads its architecture and layout from the spec's values, on
    `placement.critic_world_size` ranks: one per device of the critic's `resource` entry)."""
    if not spec.has_critic:
        return None
    policy = train_config_from(spec, total_rollouts)
    schedule = dataclasses.replace(
        policy.lr_schedule,
        lr=spec.critic_lr if spec.critic_lr is not None else spec.lr,
        warmup_steps=spec.critic_lr_warmup_iters,
    )
    multi_rank = is_multi_rank(spec.train_backend)
    return CriticPlan(
        model_path=initial_weights,
        backend=spec.train_backend,
        hf_checkpoint=str(spec.hf_checkpoint),
        values=spec.values() if multi_rank else {},
        world=(
            critic_world_size(spec.resource, _model_parallel_size(spec), device or Device.for_roles())
            if multi_rank
            else None
        ),
        config=CriticConfig(
            lr_schedule=schedule,
            loss=policy.loss,
            weight_decay=policy.weight_decay,
            adam_beta1=policy.adam_beta1,
            adam_beta2=policy.adam_beta2,
            adam_eps=policy.adam_eps,
            clip_grad=policy.clip_grad,
            seed=policy.seed,
            global_batch_size=policy.global_batch_size,
            micro_batch_size=policy.micro_batch_size,
            max_tokens_per_micro_batch=policy.max_tokens_per_micro_batch,
            owner=policy.owner,
        ),
    )


def dataset_config(
    spec: RuntimeSpec,
    *,
    input_key: str | None = None,
    label_key: str | None = None,
    tool_key: str | None = None,
) -> DatasetConfig:
    return DatasetConfig(
        input_key=input_key or spec.input_key,
        label_key=label_key if label_key is not None else spec.label_key,
        metadata_key=spec.metadata_key,
        tool_key=tool_key or spec.tool_key,
        conversation_key_map=dict(spec.conversation_key_map or {}),
        apply_chat_template=spec.apply_chat_template,
        apply_chat_template_kwargs=dict(spec.apply_chat_template_kwargs or {}),
        system_prompt=spec.system_prompt,
    )


def validate(spec: RuntimeSpec) -> None:
    """Errors a run would otherwise hit late, each naming its parameter."""
    needed = ["hf_checkpoint", "rollout_batch_size"]
    if not spec.load_debug_rollout_data:
        needed.append("prompt_data")
    missing = [n for n in needed if not getattr(spec, n)]
    if missing:
        raise ValueError(f"missing required parameter(s): {', '.join(missing)}")
    if spec.num_rollout is None and spec.num_epoch is None:
        raise ValueError("set num_rollout or num_epoch")
    rewarded = spec.rm_type or spec.custom_rm_path or spec.rm_type_infer or spec.rm_type_fallback
    if not spec.is_sft and spec.generates and not rewarded:
        raise ValueError("an RL job needs rm_type or custom_rm_path (or rm_type_infer / rm_type_fallback)")
    if spec.rollout_external and spec.generates and not spec.rollout_external_engine_addrs:
        raise ValueError("rollout_external needs rollout_external_engine_addrs (host:port of each server)")
    if spec.debug_train_only and not spec.load_debug_rollout_data and not spec.is_sft:
        raise ValueError("debug_train_only trains on saved rollouts: set load_debug_rollout_data")
    if spec.debug_train_only and spec.is_sft and spec.sft_predict_interval is not None:
        raise ValueError("debug_train_only starts no rollout engines: drop sft_predict_interval")
    if spec.use_kl_loss and spec.kl_loss_coef == 0:
        log.warning("use_kl_loss is set but kl_loss_coef is 0: the KL term is computed and logged only")
    if spec.save_interval and not spec.save:
        raise ValueError("save_interval needs save")
    if spec.is_sft and spec.sft_predict_interval and not spec.save:
        raise ValueError("sft_predict_interval writes under save: set save")
    if spec.fully_async and spec.colocated:
        raise ValueError("fully_async runs rollout on devices of its own: it cannot be colocated")


def trainer_world(spec: RuntimeSpec, device: Device | None = None) -> int | None:
    """A multi-rank backend's number of trainer ranks (`placement.train_world_size`); None for the torch
    backend (one trainer). Reads the model-parallel sizes from the spec's values (Megatron's dests)."""
    if not is_multi_rank(spec.train_backend) or not spec.trains:
        return None
    return train_world_size(spec.resource, _model_parallel_size(spec), device or Device.for_roles())


def _model_parallel_size(spec: RuntimeSpec) -> int:
    """Tensor x pipeline x context parallel sizes, from the spec's values (Megatron's dests)."""
    values = spec.values()
    model_parallel = 1
    for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        model_parallel *= int(values.get(name) or 1)
    return model_parallel


def role_plan(spec: RuntimeSpec, total: int, device: Device | None = None) -> RolePlan:
    """The roles a job runs, from `resource` and the mode."""
    resource = spec.resource or {}
    initial = (
        str(resolve_model_folder(spec.ref_load, spec.ref_ckpt_step))
        if spec.ref_load
        else str(spec.hf_checkpoint)
    )
    separate: dict[Role, str] = {}
    # colocated and hybrid modes swap these models into the actor's devices (the platform reserves none
    # for them): they live in the trainer's process
    if not spec.colocate and spec.trains:
        if Role.REFERENCE in resource and spec.needs_reference:
            separate[Role.REFERENCE] = initial
        elif Role.REFERENCE in resource:
            log.warning("resource.reference is set but no KL term needs a reference model: not started")
        if Role.ACTOR_FWD in resource and not spec.is_sft:
            separate[Role.ACTOR_FWD] = initial
    return RolePlan(
        backend=spec.train_backend,
        hf_checkpoint=str(spec.hf_checkpoint),
        train_config=train_config_from(spec, total),
        resource=spec.resource,
        colocate=spec.colocated,
        with_train=spec.trains,
        with_rollout=spec.generates,
        need_ref=spec.needs_reference and Role.REFERENCE not in separate,
        separate=separate,
        log_probs_temperature=1.0 if spec.is_sft else spec.rollout_temperature,
        engine_kind=engine_kind_from_env(),
        engine_args=server_argv(spec.extra.get("sglang")),
        external_engines=tuple(spec.rollout_external_engine_addrs or ()) if spec.rollout_external else (),
        critic=critic_plan(spec, total, initial, device),
        train_world=trainer_world(spec, device),
        values=spec.values() if is_multi_rank(spec.train_backend) else {},
        warm_page_cache=_warmed_folders(spec, initial),
    )


def _warmed_folders(spec: RuntimeSpec, initial: str) -> tuple[str, ...]:
    """`--warm-hf-checkpoint-page-cache`: the Hugging Face folders the roles load (the policy's, and the
    reference's / initial weights' when they differ)."""
    if not spec.values().get("warm_hf_checkpoint_page_cache"):
        return ()
    return tuple(dict.fromkeys((str(spec.hf_checkpoint), initial)))


def build_pipeline(
    spec: RuntimeSpec,
    reporter: Reporter,
    *,
    device: Device | None = None,
    actor_env: dict[str, str] | None = None,
) -> Pipeline:
    """Read the data, start the roles, and report the job as running."""
    validate(spec)
    check_paths(spec)  # a platform job opens only the paths the platform resolved (runtime.access)
    torch.manual_seed(spec.seed)
    device = device or Device.for_roles()
    tokenizer = AutoTokenizer.from_pretrained(spec.hf_checkpoint)
    formatter = PromptFormatter(tokenizer, dataset_config(spec))
    items = read_prompt_items(spec.prompt_data, formatter.config) if spec.prompt_data else []
    sft_eval_items: list[PromptItem] = []
    if spec.is_sft and spec.eval_size is not None:
        items, sft_eval_items = split_eval_holdout(items, spec.eval_size, spec.seed)
    elif not spec.is_sft:
        items, dropped = drop_long_prompts(items, formatter, spec.rollout_max_prompt_len)
        if dropped:
            log.warning(
                "rollout_max_prompt_len=%s: %d prompt(s) longer than that dropped",
                spec.rollout_max_prompt_len,
                dropped,
            )
    total = spec.total_rollouts(len(items))
    started = time.perf_counter()
    roles = start_roles(role_plan(spec, total, device), device=device, env_vars=actor_env)
    relay = LogRelay(roles.log_sink, reporter) if roles.log_sink is not None else None
    reporter.event(EventKind.MODEL_LOADED, f"{spec.hf_checkpoint} in {time.perf_counter() - started:.1f}s")
    pipeline = Pipeline(
        spec=spec,
        reporter=reporter,
        tokenizer=tokenizer,
        roles=roles,
        total_rollouts=total,
        checkpoints=CheckpointManager(spec, reporter, roles.train),
        relay=relay,
        weight_sync=create_weight_sync(WeightSyncBackend.OBJECT_STORE),
    )
    try:
        if spec.is_sft:
            _wire_sft(pipeline, formatter, items, sft_eval_items)
        else:
            _wire_rl(pipeline, formatter, items)
    except BaseException:
        pipeline.close()
        raise
    reporter.set_phase(Phase.RUNNING)
    reporter.set_progress(0, total)
    return pipeline


def _wire_sft(
    p: Pipeline, formatter: PromptFormatter, items: list[PromptItem], eval_items: list[PromptItem]
) -> None:
    s = p.spec
    capacity = s.max_tokens_per_gpu * max(1, s.context_parallel_size) if s.max_tokens_per_gpu else None
    oversize = OversizePolicy(
        capacity=capacity,
        strategy=OversizeStrategy(s.sft_oversize_strategy),
        custom=load_hook(s.sft_oversize_custom_function_path, "sft_oversize_custom_function_path"),
    )
    builder = SFTExampleBuilder(formatter, label_key=s.label_key, oversize=oversize)
    if s.eval_prompt_data and not eval_items:
        pairs = list(s.eval_prompt_data)
        config = dataset_config(
            s, input_key=s.eval_input_key, label_key=s.eval_label_key, tool_key=s.eval_tool_key
        )
        for i in range(1, len(pairs), 2):
            eval_items += read_prompt_items(pairs[i], config)
    p.sft = SFTData(
        builder=builder,
        cursor=PromptCursor(items, shuffle=s.rollout_shuffle, seed=s.rollout_seed),
        eval_items=eval_items,
        eval_samples=builder.build_all(eval_items),
    )


def _wire_rl(p: Pipeline, formatter: PromptFormatter, items: list[PromptItem]) -> None:
    s = p.spec
    p.postprocess = load_hook(s.rollout_data_postprocess_path, "rollout_data_postprocess_path")
    if s.generates or s.custom_reward_post_process_path:
        p.reward = RewardModel.from_spec(s)
    if s.load_debug_rollout_data:
        p.source = LoadedRollout(
            s.load_debug_rollout_data, subsample=s.load_debug_rollout_data_subsample, seed=s.rollout_seed
        )
        return
    factory = load_hook(s.data_source_path, "data_source_path")
    assert factory is not None
    p.data = factory(
        DataSourceInit(
            items=items,
            formatter=formatter,
            n_samples_per_prompt=s.n_samples_per_prompt,
            shuffle=s.rollout_shuffle,
            seed=s.rollout_seed,
            buffer_filter=load_hook(s.buffer_filter_path, "buffer_filter_path"),
        )
    )
    assert p.roles.rollout is not None
    eval_datasets = load_eval_datasets(s, p.tokenizer) if (s.eval_prompt_data or s.eval_config) else []
    p.rollout_ctx = RolloutContext(
        spec=s,
        data=p.data,
        engine=p.roles.rollout,
        tokenizer=p.tokenizer,
        reward=p.reward,
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
    p.eval_fn = load_hook(s.eval_function_path or s.rollout_function_path, "eval_function_path")
    live = LiveRollout(p.rollout_ctx, _checked(rollout_fn), save_debug=s.save_debug_rollout_data)
    p.source = (
        AheadRollout(live, max_staleness=s.max_staleness, last_rollout_id=p.total_rollouts)
        if s.fully_async
        else live
    )


def _checked(rollout_fn: Any) -> Any:
    def call(ctx: RolloutContext, rollout_id: int) -> RolloutOutput:
        output = rollout_fn(ctx, rollout_id)
        if not isinstance(output, RolloutOutput):
            raise TypeError(f"rollout_function_path must return a RolloutOutput, got {type(output).__name__}")
        return output

    return call


def resume(pipeline: Pipeline) -> int:
    """Load the latest checkpoint under `load` (if any) and return the first rollout id to run."""
    spec = pipeline.spec
    start = 0
    if spec.load and pipeline.roles.train is not None:
        loaded = pipeline.roles.train.load_checkpoint(spec.load)
        if loaded is not None:
            iteration, state = loaded
            data_state = state.get("data", {})
            if pipeline.data is not None:
                pipeline.data.load_state_dict(data_state)
            if pipeline.sft is not None:
                pipeline.sft.cursor.load_state_dict(data_state)
            start = iteration + 1
            pipeline.checkpoints.last_saved = iteration
            pipeline.last_critic_save = iteration
            pipeline.reporter.event(EventKind.RESUMED, f"from {spec.load} iteration {iteration}")
            log.info("resumed from %s at iteration %d", spec.load, iteration)
        else:
            log.info("no checkpoint under %s yet: starting from %s", spec.load, spec.hf_checkpoint)
    elif spec.load:
        log.warning("load=%s: debug_rollout_only has no trainer to restore; starting fresh", spec.load)
    if pipeline.roles.critic is not None and spec.critic_load:
        iteration = pipeline.roles.critic.load_checkpoint(spec.critic_load)
        if iteration is not None and iteration + 1 != start:
            log.warning("critic restored from iteration %d, the policy resumes at %d", iteration, start)
    if spec.start_rollout_id is not None:
        start = spec.start_rollout_id
    return start
