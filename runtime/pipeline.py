"""Assembles a job's pipeline from its spec and implements each stage the driver calls by name."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from transformers import AutoTokenizer

from runtime.algos.advantages import AdvantageConfig, AdvantageInputs, compute_advantages, whiten
from runtime.algos.losses import LossConfig
from runtime.data.prompts import (
    DatasetConfig,
    PromptFormatter,
    PromptItem,
    RolloutDataSource,
    read_prompt_items,
)
from runtime.data.sft import SFTExampleBuilder
from runtime.devices import Device
from runtime.observability import Stage, StepTimer
from runtime.reporter import EventKind, Phase, Reporter, RolloutSplit
from runtime.rewards import RewardScorer
from runtime.roles.groups import Roles, start_roles
from runtime.rollout.engine import SamplingParams
from runtime.rollout.generate import generate_rollout
from runtime.rollout.results import write_rollout_result
from runtime.rollout.stats import rollout_metrics
from runtime.spec import RuntimeSpec
from runtime.train.checkpoint import CheckpointRecord, render_hf_path
from runtime.train.schedule import DecayStyle, LRSchedule
from runtime.train.torch_backend import TrainConfig
from runtime.types import RolloutBatch, Sample
from runtime.weight_sync import WeightSync, WeightSyncBackend, create_weight_sync

transformers.utils.logging.disable_progress_bar()
log = logging.getLogger(__name__)

DEFAULT_MAX_RESPONSE_LEN = 1024  # when rollout-max-response-len is unset (SGLang would use the context size)


@dataclass
class EvalSet:
    name: str
    items: list[PromptItem]
    formatter: PromptFormatter


@dataclass
class Pipeline:
    """Everything one job's loop touches. The driver reads as the algorithm; the detail lives here."""

    spec: RuntimeSpec
    reporter: Reporter
    tokenizer: Any
    formatter: PromptFormatter
    data: RolloutDataSource
    roles: Roles
    total_rollouts: int
    reward: RewardScorer | None = None
    weight_sync: WeightSync | None = None
    sft_examples: SFTExampleBuilder | None = None
    eval_sets: list[EvalSet] = field(default_factory=list)
    last_saved: int | None = None
    last_exported: int | None = None

    # -- stages ---------------------------------------------------------------------------------------------
    def sampling(self, rollout_id: int, *, eval_mode: bool = False) -> SamplingParams:
        """Rollout sampling parameters; in eval mode each `eval-*` value that is set replaces its `rollout-*` one."""
        s = self.spec
        temperature, top_p, top_k = s.rollout_temperature, s.rollout_top_p, s.rollout_top_k
        max_len = s.rollout_max_response_len
        if eval_mode:
            temperature = s.eval_temperature if s.eval_temperature is not None else temperature
            top_p = s.eval_top_p if s.eval_top_p is not None else top_p
            top_k = s.eval_top_k if s.eval_top_k is not None else top_k
            max_len = s.eval_max_response_len or max_len
        return SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_new_tokens=max_len or DEFAULT_MAX_RESPONSE_LEN,
            stop_token_ids=tuple(s.rollout_stop_token_ids or ()),
            seed=s.rollout_seed * 1_000_003 + 7919 * rollout_id + (1 if eval_mode else 0),
        )

    def generate(self, prompts: list[PromptItem], rollout_id: int) -> list[Sample]:
        assert self.roles.rollout is not None
        return generate_rollout(
            self.roles.rollout,
            self.formatter,
            prompts,
            n_samples_per_prompt=self.spec.n_samples_per_prompt,
            params=self.sampling(rollout_id),
            skip_special_tokens=self.spec.rollout_skip_special_tokens,
        )

    def to_batch(self, samples: list[Sample]) -> RolloutBatch:
        return RolloutBatch.from_samples(samples, self.tokenizer.pad_token_id)

    def compute_advantages(self, batch: RolloutBatch) -> RolloutBatch:
        s = self.spec
        config = AdvantageConfig(
            std_normalization=not s.disable_grpo_std_normalization,
            rewards_normalization=not s.disable_rewards_normalization,
        )
        out = compute_advantages(
            s.advantage_estimator, AdvantageInputs(batch.rewards, batch.group_index, batch.loss_mask), config
        )
        batch.advantages = (
            whiten(out.advantages, batch.loss_mask) if s.normalize_advantages else out.advantages
        )
        batch.returns = out.returns
        return batch

    def sft_batch(self) -> RolloutBatch:
        assert self.sft_examples is not None
        items = self.data.next_prompts(int(self.spec.rollout_batch_size or 1))
        return self.to_batch([self.sft_examples.build(item, i) for i, item in enumerate(items)])

    def weight_sync_due(self, rollout_id: int) -> bool:
        return (rollout_id + 1) % max(1, self.spec.update_weights_interval) == 0

    def push_weights(self, version: int) -> None:
        assert self.weight_sync is not None and self.roles.rollout is not None
        self.weight_sync.push(self.roles.train, self.roles.rollout, version=version)

    def save_due(self, rollout_id: int) -> bool:
        interval = self.spec.save_interval
        return bool(self.spec.save and interval and (rollout_id + 1) % interval == 0)

    def save(self, rollout_id: int) -> None:
        """Checkpoint as `iter_<rollout_id>` (Relax numbering: resume starts at rollout_id + 1) and, with
        `save-hf`, export the HF folder too."""
        if self.spec.save and self.last_saved != rollout_id:
            state = {"data": self.data.state_dict(), "rollout_id": rollout_id}
            self._register(self.roles.train.save_checkpoint(self.spec.save, rollout_id, state))
            self.last_saved = rollout_id
        self.export_hf(rollout_id)

    def export_hf(self, rollout_id: int) -> None:
        if self.spec.save_hf and self.last_exported != rollout_id:
            path = render_hf_path(self.spec.save_hf, rollout_id)
            self._register(self.roles.train.export_hf(str(path), rollout_id))
            self.last_exported = rollout_id

    def _register(self, record: CheckpointRecord) -> None:
        self.reporter.checkpoint(record)
        kind = EventKind.HF_EXPORTED if record.format == "hf" else EventKind.CHECKPOINT_SAVED
        self.reporter.event(kind, f"step {record.step}: {record.path} ({record.size_bytes} B)")
        log.info(
            "%s checkpoint of step %d at %s (%d B)",
            record.format,
            record.step,
            record.path,
            record.size_bytes,
        )

    def write_rollout(
        self, rollout_id: int, split: RolloutSplit, samples: list[Sample], name: str | None = None
    ) -> None:
        if self.spec.save:
            path = write_rollout_result(self.spec.save, str(split), rollout_id, samples, name=name)
            self.reporter.rollout(rollout_id, split, str(path), len(samples))

    def eval_due(self, trained_rollouts: int) -> bool:
        if not self.eval_sets or not self.spec.eval_interval:
            return False
        if trained_rollouts == 0:
            return not self.spec.skip_eval_before_train
        return trained_rollouts % self.spec.eval_interval == 0 or trained_rollouts == self.total_rollouts

    def evaluate(self, trained_rollouts: int) -> dict[str, float]:
        """Generate on every eval set with the eval sampling parameters; `eval/<name>` is the mean reward."""
        assert self.roles.rollout is not None and self.reward is not None
        metrics: dict[str, float] = {}
        for eval_set in self.eval_sets:
            samples = generate_rollout(
                self.roles.rollout,
                eval_set.formatter,
                eval_set.items,
                n_samples_per_prompt=self.spec.n_samples_per_eval_prompt,
                params=self.sampling(trained_rollouts, eval_mode=True),
                skip_special_tokens=self.spec.rollout_skip_special_tokens,
            )
            rewards = self.reward.score(samples)
            metrics[f"eval/{eval_set.name}"] = sum(rewards) / len(rewards)
            metrics[f"eval/{eval_set.name}/response_len"] = sum(s.response_length for s in samples) / len(
                samples
            )
            self.write_rollout(trained_rollouts, RolloutSplit.EVAL, samples, name=eval_set.name)
        return metrics

    # -- reporting --------------------------------------------------------------------------------------------
    def report_rl_step(
        self,
        rollout_id: int,
        samples: list[Sample],
        batch: RolloutBatch,
        train_metrics: dict[str, float],
        timer: StepTimer,
    ) -> None:
        metrics = rollout_metrics(samples, batch)
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

    def close(self) -> None:
        self.roles.shutdown()


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
    loss = LossConfig(
        eps_clip=spec.eps_clip,
        eps_clip_high=spec.effective_eps_clip_high,
        eps_clip_c=spec.eps_clip_c,
        use_kl_loss=spec.use_kl_loss,
        kl_loss_coef=spec.kl_loss_coef,
        kl_loss_type=spec.kl_loss_type,
        entropy_coef=spec.entropy_coef,
        per_token_loss=spec.calculate_per_token_loss,
    )
    return TrainConfig(
        loss_type=spec.loss_type,
        loss=loss,
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
        log_probs_temperature=1.0 if spec.is_sft else spec.rollout_temperature,
        use_rollout_logprobs=spec.use_rollout_logprobs,
        save_optimizer=not spec.no_save_optim,
        ref_load=spec.ref_load,
        ref_ckpt_step=spec.ref_ckpt_step,
    )


def _dataset_config(
    spec: RuntimeSpec, *, input_key: str | None = None, label_key: str | None = None
) -> DatasetConfig:
    return DatasetConfig(
        input_key=input_key or spec.input_key,
        label_key=label_key if label_key is not None else spec.label_key,
        metadata_key=spec.metadata_key,
        apply_chat_template=spec.apply_chat_template,
        apply_chat_template_kwargs=dict(spec.apply_chat_template_kwargs or {}),
        system_prompt=spec.system_prompt,
    )


def _eval_sets(spec: RuntimeSpec, tokenizer: Any) -> list[EvalSet]:
    pairs = list(spec.eval_prompt_data or [])
    if len(pairs) % 2:
        raise ValueError("eval-prompt-data takes pairs: name path [name path ...]")
    config = _dataset_config(spec, input_key=spec.eval_input_key, label_key=spec.eval_label_key)
    formatter = PromptFormatter(tokenizer, config)
    return [
        EvalSet(pairs[i], read_prompt_items(pairs[i + 1], config), formatter) for i in range(0, len(pairs), 2)
    ]


def validate(spec: RuntimeSpec) -> None:
    """Errors a run would otherwise hit late, each naming its parameter."""
    missing = [n for n in ("hf_checkpoint", "prompt_data", "rollout_batch_size") if not getattr(spec, n)]
    if missing:
        raise ValueError(f"missing required parameter(s): {', '.join(missing)}")
    if spec.num_rollout is None and spec.num_epoch is None:
        raise ValueError("set num_rollout or num_epoch")
    if not spec.is_sft and not (spec.rm_type or spec.custom_rm_path):
        raise ValueError("an RL job needs rm_type or custom_rm_path")
    if spec.use_kl_loss and spec.kl_loss_coef == 0:
        log.warning("use_kl_loss is set but kl_loss_coef is 0: the KL term is computed and logged only")
    if spec.save_interval and not spec.save:
        raise ValueError("save_interval needs save")


def build_pipeline(
    spec: RuntimeSpec,
    reporter: Reporter,
    *,
    device: Device | None = None,
    actor_env: dict[str, str] | None = None,
) -> Pipeline:
    """Read the data, start the roles, and report the job as running."""
    validate(spec)
    torch.manual_seed(spec.seed)
    device = device or Device.detect()
    tokenizer = AutoTokenizer.from_pretrained(spec.hf_checkpoint)
    dataset_config = _dataset_config(spec)
    formatter = PromptFormatter(tokenizer, dataset_config)
    items = read_prompt_items(spec.prompt_data, dataset_config)  # type: ignore[arg-type]
    data = RolloutDataSource(items, shuffle=spec.rollout_shuffle, seed=spec.rollout_seed)
    total = spec.total_rollouts(len(items))
    started = time.perf_counter()
    roles = start_roles(
        backend=spec.train_backend,
        hf_checkpoint=str(spec.hf_checkpoint),
        train_config=train_config_from(spec, total),
        need_ref=spec.use_kl_loss,
        with_rollout=not spec.is_sft,
        resource=spec.resource,
        colocate=spec.colocate,
        device=device,
        env_vars=actor_env,
    )
    reporter.event(EventKind.MODEL_LOADED, f"{spec.hf_checkpoint} in {time.perf_counter() - started:.1f}s")
    pipeline = Pipeline(
        spec=spec,
        reporter=reporter,
        tokenizer=tokenizer,
        formatter=formatter,
        data=data,
        roles=roles,
        total_rollouts=total,
    )
    if spec.is_sft:
        pipeline.sft_examples = SFTExampleBuilder(formatter, label_key=spec.label_key)
    else:
        pipeline.reward = RewardScorer(spec.rm_type, spec.custom_rm_path)
        pipeline.weight_sync = create_weight_sync(WeightSyncBackend.OBJECT_STORE)
        pipeline.eval_sets = _eval_sets(spec, tokenizer)
    reporter.set_phase(Phase.RUNNING)
    reporter.set_progress(0, total)
    return pipeline


def resume(pipeline: Pipeline) -> int:
    """Load the latest checkpoint under `load` (if any) and return the first rollout id to run."""
    spec = pipeline.spec
    start = 0
    if spec.load:
        loaded = pipeline.roles.train.load_checkpoint(spec.load)
        if loaded is not None:
            iteration, state = loaded
            pipeline.data.load_state_dict(state.get("data", {}))
            start = iteration + 1
            pipeline.last_saved = iteration
            pipeline.reporter.event(EventKind.RESUMED, f"from {spec.load} iteration {iteration}")
            log.info("resumed from %s at iteration %d", spec.load, iteration)
        else:
            log.info("no checkpoint under %s yet: starting from %s", spec.load, spec.hf_checkpoint)
    if spec.start_rollout_id is not None:
        start = spec.start_rollout_id
    return start
