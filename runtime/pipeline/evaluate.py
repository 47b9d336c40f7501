"""An eval-only job's pipeline (`runtime.eval.eval_only`): the rollout engines and the reward model of an RL
job, no trainer and no training prompts; one evaluation of every eval set (`eval-prompt-data` or
`eval-config`, `n-samples-per-eval-prompt`, pass@k with `log-passrate`), reported as the `eval/*` metrics of
step `start-rollout-id`, with the per-sample records under `<save>/rollout_result/eval/` when `save` is set.

It is an `RLPipeline` whose loop has no step: the driver's `run_rl` evaluates at the start, runs no rollout and
finishes, as Relax's own loop does for a run with no rollout left."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from runtime.data.prompts import PromptFormatter
from runtime.pipeline.base import PipelineParts
from runtime.pipeline.rl import RLPipeline, _live
from runtime.rewards import RewardModel

log = logging.getLogger("runtime.pipeline")


@dataclass(kw_only=True)
class EvalPipeline(RLPipeline):
    """Evaluates once, whatever `eval-interval` and `skip-eval-before-train` say (evaluating is the job)."""

    def eval_due(self, trained_rollouts: int) -> bool:
        return self.generation is not None and bool(self.generation.ctx.eval_datasets)

    def evaluate(self, trained_rollouts: int) -> dict[str, float]:
        assert self.generation is not None
        sets = self.generation.ctx.eval_datasets
        log.info(
            "eval-only: %d eval set(s): %s",
            len(sets),
            ", ".join(f"{d.name} ({len(d.items)} prompts x {d.n_samples})" for d in sets),
        )
        metrics = super().evaluate(trained_rollouts)
        self.reporter.set_progress(self.total_rollouts, self.total_rollouts)
        shown = " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if "/" not in k[len("eval/") :])
        log.info("eval-only: %s", shown)
        return metrics

    def finish(self) -> None:
        """Nothing trained, so nothing to save."""


def build_eval(parts: PipelineParts, formatter: PromptFormatter) -> EvalPipeline:
    """The eval-only pipeline over the shared `parts`: the reward model and the live rollout context with the
    eval sets (the data source holds no training prompt)."""
    reward = RewardModel.from_spec(parts.spec)
    try:
        generation, live = _live(parts, formatter, [], reward)
        if not generation.ctx.eval_datasets:
            raise ValueError("an eval-only job needs eval sets: --eval-prompt-data or --eval-config")
    except BaseException:
        reward.close()
        raise
    return EvalPipeline(
        **parts.as_kwargs(), source=live, generation=generation, reward=reward, postprocess=None
    )
