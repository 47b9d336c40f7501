"""An SFT job's pipeline: next batch of examples -> train (loss on assistant tokens only), with save,
perplexity on held-out rows and predictions. `build_sft` builds its data once, from the spec."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from runtime.data.prompts import PromptCursor, PromptFormatter, PromptItem, read_prompt_items
from runtime.data.sft import OversizePolicy, OversizeStrategy, SFTExampleBuilder
from runtime.eval import perplexity_metrics, write_predictions
from runtime.observability import StepTimer
from runtime.pipeline.base import PipelineBase, PipelineParts
from runtime.pipeline.plans import dataset_config
from runtime.plugins import load_hook
from runtime.reporter import EventKind
from runtime.rollout.context import DEFAULT_MAX_RESPONSE_LEN
from runtime.rollout.generate import GenerateContext, LengthLimits, advance
from runtime.rollout.params import SamplingParams
from runtime.types import RolloutBatch, Sample

log = logging.getLogger("runtime.pipeline")


@dataclass(kw_only=True)
class SFTPipeline(PipelineBase):
    """Everything an SFT job's loop touches: the example builder, the training cursor, the held-out eval
    rows (empty without an eval source) and their prebuilt samples."""

    builder: SFTExampleBuilder
    cursor: PromptCursor
    eval_items: list[PromptItem]
    eval_samples: list[Sample]

    # -- stages, in the loop's order ----------------------------------------------------------------------------
    def next_batch(self) -> RolloutBatch:
        want = int(self.spec.rollout_batch_size or 1)
        samples: list[Sample] = []
        for _ in range(64):  # oversize `skip` may drop rows: draw until the batch has at least one
            samples += self.builder.build_all(self.cursor.next_prompts(want - len(samples)))
            if samples:
                break
        if not samples:
            raise RuntimeError("sft-oversize-strategy skip dropped every row drawn: raise max-tokens-per-gpu")
        for index, sample in enumerate(samples):
            sample.index = sample.group_index = index
        return RolloutBatch.from_samples(samples, self.tokenizer.pad_token_id)

    def train(self, rollout_id: int, batch: RolloutBatch) -> dict[str, float]:
        """One training step; then `ref-update-interval`."""
        if self.roles.train is None:
            return {}
        self.roles.use_for_training()
        return self.train_policy(rollout_id, batch)

    def save_step(self, rollout_id: int, batch: RolloutBatch) -> None:
        """Debug train data, and the checkpoint when one is due."""
        self._save_due(rollout_id, batch)

    def data_state(self) -> dict[str, Any]:
        return self.cursor.state_dict()

    def restore_data(self, iteration: int, data_state: dict[str, Any]) -> None:
        self.cursor.load_state_dict(data_state)

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Perplexity on the held-out rows every `eval-interval` steps, predictions every
        `sft-predict-interval` steps (Relax's SFT schedule: after step r when the interval divides r + 1)."""
        metrics: dict[str, float] = {}
        s = self.spec
        if not self.eval_items:
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
        assert self.roles.train is not None
        self.roles.use_for_training()
        chunk = self.spec.effective_global_batch_size or len(self.eval_samples) or 1
        total_nll, total_tokens = 0.0, 0
        for start in range(0, len(self.eval_samples), chunk):
            part = RolloutBatch.from_samples(
                self.eval_samples[start : start + chunk], self.tokenizer.pad_token_id
            )
            nll, tokens = self.roles.train.evaluate_nll(part)
            total_nll, total_tokens = total_nll + nll, total_tokens + tokens
        return perplexity_metrics(total_nll, total_tokens)

    def predict(self, rollout_id: int) -> None:
        """Generate on the held-out prompts with the current weights and write
        `<save>/predict/predictions_step_<rollout_id>.jsonl` (prompt, reference, completion)."""
        assert self.roles.rollout is not None and self.spec.save
        self.push_weights(version=rollout_id + 1, engines=True)
        prompts = [self.builder.prediction_prompt(item) for item in self.eval_items]
        samples = [
            Sample(
                index=i,
                group_index=i,
                prompt=p.prompt_text,
                tokens=self.builder.formatter.encode_text(p.prompt_text),
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

    def report_step(
        self, rollout_id: int, batch: RolloutBatch, train_metrics: dict[str, float], timer: StepTimer
    ) -> None:
        metrics = {f"train/{k}": v for k, v in train_metrics.items() if k != "optimizer_steps"}
        metrics.update(self.step_perf(timer, batch, None))
        self.finish_step(rollout_id, metrics)


def build_sft(
    parts: PipelineParts, formatter: PromptFormatter, items: list[PromptItem], eval_items: list[PromptItem]
) -> SFTPipeline:
    """The SFT pipeline over the shared `parts` (`PipelineBase`'s fields): the example builder (with its
    oversize policy), the training cursor, the held-out rows (`eval-size`, else `eval-prompt-data`)."""
    s = parts.spec
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
    return SFTPipeline(
        **parts.as_kwargs(),
        builder=builder,
        cursor=PromptCursor(items, shuffle=s.rollout_shuffle, seed=s.rollout_seed),
        eval_items=eval_items,
        eval_samples=builder.build_all(eval_items),
    )
