"""What a rollout function (`rollout-function-path`) works with and what it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.rollout.generate import GenerateContext, Generator, LengthLimits, generate_samples
from runtime.rollout.params import SamplingParams
from runtime.spec import RuntimeSpec
from runtime.types import Sample

if TYPE_CHECKING:
    from runtime.eval import EvalDataset
    from runtime.plugins import DataSource, DynamicSamplingFilterFn, GenerateFn

DEFAULT_MAX_RESPONSE_LEN = 1024  # when rollout-max-response-len is unset (SGLang would use the context size)


@dataclass
class RolloutOutput:
    """Training: `groups`, each the `n-samples-per-prompt` scored samples of one prompt.
    Evaluation: `datasets`, eval set name -> its scored samples. `metrics` go out as step metrics."""

    groups: list[list[Sample]] = field(default_factory=list)
    datasets: dict[str, list[Sample]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    data_state: dict[str, Any] | None = (
        None  # the data source's state right after this rollout (set by the runtime)
    )

    @property
    def samples(self) -> list[Sample]:
        return [sample for group in self.groups for sample in group]


@dataclass
class RolloutContext:
    """The handles of one job's rollout: spec, data source, engines, reward, hooks.

    Sampling seeds derive from `rollout-seed`, the rollout id and a per-call round, so a resumed job draws
    exactly the samples an uninterrupted one would.
    """

    spec: RuntimeSpec
    data: DataSource
    engine: Generator
    tokenizer: Any
    reward: Any  # RewardModel: score(samples, eval_mode=False) -> rewards, filling sample.reward
    limits: LengthLimits
    dynamic_filter: DynamicSamplingFilterFn | None = None
    custom_generate: GenerateFn | None = None
    eval_datasets: list[EvalDataset] = field(default_factory=list)
    eval_generate: dict[str, GenerateFn] = field(default_factory=dict)  # per eval dataset, from eval-config
    extra: dict[str, Any] = field(default_factory=dict)  # free room for user rollout functions

    def sampling(
        self, rollout_id: int, *, round_index: int = 0, dataset: EvalDataset | None = None
    ) -> SamplingParams:
        s = self.spec
        seed = s.rollout_seed * 1_000_003 + 7919 * rollout_id + 104_729 * round_index
        if dataset is None:
            return SamplingParams(
                temperature=s.rollout_temperature,
                top_p=s.rollout_top_p,
                top_k=s.rollout_top_k,
                max_new_tokens=self.limits.max_response_len,
                stop_token_ids=tuple(s.rollout_stop_token_ids or ()),
                stop=tuple(s.rollout_stop or ()),
                seed=seed,
            )
        return SamplingParams(
            temperature=dataset.temperature,
            top_p=dataset.top_p,
            top_k=dataset.top_k,
            max_new_tokens=dataset.max_response_len or DEFAULT_MAX_RESPONSE_LEN,
            stop_token_ids=dataset.stop_token_ids,
            stop=dataset.stop,
            min_new_tokens=dataset.min_new_tokens,
            seed=seed + 1,
        )

    def generate(
        self,
        samples: list[Sample],
        rollout_id: int,
        *,
        round_index: int = 0,
        segment: int | None = None,
        dataset: EvalDataset | None = None,
    ) -> None:
        """Advance `samples` in place (training sampling, or an eval set's)."""
        params = self.sampling(rollout_id, round_index=round_index, dataset=dataset)
        limits = self.limits
        custom = self.custom_generate
        if dataset is not None:
            limits = LengthLimits(params.max_new_tokens, dataset.max_context_len)
            custom = self.eval_generate.get(dataset.name, self.custom_generate)
        ctx = GenerateContext(
            engine=self.engine,
            tokenizer=self.tokenizer,
            params=params,
            limits=limits,
            rollout_id=rollout_id,
            evaluation=dataset is not None,
            skip_special_tokens=self.spec.rollout_skip_special_tokens,
        )
        generate_samples(samples, ctx, custom=custom, segment=segment)
